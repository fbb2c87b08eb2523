"""CPU tests of the kernel families' host side: threaded input draws (common.standard_normal), the in-place
bf16 rounding, parallel_map, tree_verify_mla's checked subset (_checked), its threaded reference against
ref.tree_verify_mla_batch, the device copies shared by its backends, and the benchmark grids the
scenarios declare (issue 5)."""
from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest

from kdbench import config, families
from kdbench.families import common
from kdbench.families import tree_verify_mla as verify
from kdbench.references import tree_verify_mla as ref

KERNELS = Path(__file__).parents[1] / "scenarios" / "kernels"


def _cases(name: str) -> list:
    return list(config.load(KERNELS / f"{name}.yaml").cases)


def test_small_draws_are_the_plain_generator_values():
    """Up to one block: exactly round_to(scale * rng.standard_normal(float32)), as the families drew before."""
    got = common.standard_normal(np.random.default_rng(5), (3, 7, 11), "bfloat16", scale=3.0)
    want = common.round_to(3.0 * np.random.default_rng(5).standard_normal((3, 7, 11), dtype=np.float32),
                           "bfloat16")
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_big_draws_depend_on_the_seed_only(monkeypatch):
    shape = (3, common.NORMAL_BLOCK // 2 + 1001)                 # 1.5 blocks + a ragged tail
    a = common.standard_normal(np.random.default_rng(9), shape, "bfloat16", scale=2.0)
    monkeypatch.setattr(common.os, "cpu_count", lambda: 1)       # one worker: the same values
    b = common.standard_normal(np.random.default_rng(9), shape, "bfloat16", scale=2.0)
    assert np.array_equal(a, b)
    assert np.array_equal(a, common.round_to(a, "bfloat16"))      # bf16 values held in float32
    flat = a.ravel()
    assert abs(flat.mean()) < 5e-3 and abs(flat.std() - 2.0) < 5e-3
    n = common.NORMAL_BLOCK // 4                                  # blocks are different streams
    assert not np.array_equal(flat[:n], flat[common.NORMAL_BLOCK:common.NORMAL_BLOCK + n])
    c = common.standard_normal(np.random.default_rng(10), shape, "float32")
    assert not np.array_equal(c, a) and not np.array_equal(c, common.round_to(c, "bfloat16"))


def test_in_place_bf16_rounding_matches_torch():
    rng = np.random.default_rng(1)
    ties = (rng.integers(-2 ** 15, 2 ** 15, 4096).astype(np.float32) + 0.5) * np.float32(2 ** -20)  # halfway
    x = np.concatenate([rng.standard_normal(100_000).astype(np.float32) * 7, ties,
                        np.float32([3.3895314e38, -3.3895314e38, 0.0, -0.0, 1e-40, -1e-40])])
    y = x.copy()
    common._round_in_place(y, "bfloat16")
    assert np.array_equal(y.view(np.uint32), common.round_to(x, "bfloat16").view(np.uint32))
    with pytest.raises(ValueError, match="run dtype"):
        common.standard_normal(rng, (2,), "float64")


def test_parallel_map_keeps_order_and_runs_blas_work_serially_by_default(monkeypatch):
    monkeypatch.setattr(common.os, "cpu_count", lambda: 4)
    main = threading.get_ident()
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert common.parallel_map(lambda x: (x * x, threading.get_ident()), range(6), blas=True) == \
        [(x * x, main) for x in range(6)]                        # BLAS takes every core itself
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    out = common.parallel_map(lambda x: (x * x, threading.get_ident()), range(6), blas=True)
    assert [v for v, _ in out] == [x * x for x in range(6)] and all(t != main for _, t in out)


def test_validation_cases_check_every_request_and_head():
    for case in _cases("tree_verify_mla"):
        if case.name.startswith("validate"):
            assert verify._checked(case) == (list(range(case.shape.batch)), list(range(case.shape.heads))), case.name


@pytest.mark.parametrize("name, reqs, heads", [
    ("bench-b32[heads=128,nodes=256,past_len=32768]", [0, 31], [0, 1, 126, 127]),
    ("bench-b1[heads=8,nodes=256,past_len=32768]", [0], list(range(8))),     # 6.8e7 pairs, 2K rows: whole
    ("bench-b1[heads=128,nodes=256,past_len=1024]", [0], [0, 1, 126, 127]),  # 33K rows x 8 comparisons
    ("bench[heads=8,nodes=16,past_len=32768]", list(range(8)), list(range(8))),
    ("bench[heads=8,nodes=64,past_len=32768]", list(range(8)), list(range(8))),  # 1.3e8 pairs, 4K rows x 8
    ("bench[heads=8,nodes=256,past_len=32768]", [0, 7], [0, 1, 6, 7]),       # 5.4e8 pairs
    ("bench-b32[heads=16,nodes=64,past_len=1024]", [0, 31], [0, 1, 14, 15]),  # 2.3e7 pairs, 33K rows
])
def test_benchmark_shapes_check_a_subset_when_big(name, reqs, heads):
    case = next(c for c in _cases("tree_verify_mla") if c.name == name)
    assert verify._checked(case) == (reqs, heads)


def _small_case(batch=3, heads=37, nodes=9, padding=2):
    case = next(c for c in config.load(Path(__file__).parents[1] / "scenarios" / "smoke.yaml").cases
                if c.name == "tree_verify_mla")
    shape = dataclasses.replace(case.shape, batch=batch, heads=heads, nodes=nodes, padding=padding)
    return dataclasses.replace(case, shape=shape)


@pytest.mark.parametrize("threads", ["1", ""])
def test_threaded_reference_is_the_batch_reference(monkeypatch, threads):
    """Heads split in chunks of HEAD_CHUNK (37 = 32 + 5), requests on threads or not: the batch reference's
    values (float64 rounding aside), padding rows' 0 and -inf included."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    case = _small_case()
    inputs = verify.make_inputs(case, 4)
    got = verify.reference(inputs, case)
    o, lse = ref.tree_verify_mla_batch(inputs["q"], inputs["kv"], inputs["past_lens"], inputs["anc"], verify.SCALE,
                                       kv_lora_rank=case.shape.kv_lora)
    np.testing.assert_allclose(got["o_lat"], o, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isneginf(got["lse"]), np.isneginf(lse)) and np.isneginf(lse).any()
    np.testing.assert_allclose(got["lse"][np.isfinite(lse)], lse[np.isfinite(lse)], rtol=1e-12)


def test_subset_reference_matches_the_subset_of_the_full_one(monkeypatch):
    case = _small_case(batch=4, heads=6)
    inputs = verify.make_inputs(case, 8)
    full = verify.reference(inputs, case)
    monkeypatch.setattr(verify, "REFERENCE_WORK", 0)
    assert verify._checked(case) == ([0, 3], [0, 1, 4, 5])
    sub = verify.reference(inputs, case)
    np.testing.assert_allclose(sub["o_lat"], full["o_lat"][[0, 3]][:, :, [0, 1, 4, 5]], rtol=1e-12, atol=1e-12)


def test_backends_share_one_device_copy_of_the_inputs():
    case = _small_case()
    inputs = verify.make_inputs(case, 2)
    fam = families.get("tree_verify_mla")
    got = [fam.run(b, inputs, case, "cpu") for b in ("torch", "torch_twopass")]
    want = fam.reference(inputs, case)
    assert all(fam.check(g, want, case.tolerance).passed for g in got)
    (key, tensors), = inputs["_device"].items()                 # one copy, float32 on the CPU
    assert key == ("cpu", "float32")
    assert tensors[1].data_ptr() != inputs["kv"].ctypes.data    # a copy, never a view of the numpy input
    assert verify._on_device(inputs, "cpu", "float32") is tensors


def test_verify_bench_cases_cover_the_issue_grid():
    cases = [c for c in _cases("tree_verify_mla") if c.name.split("[")[0] in ("bench", "bench-b1", "bench-b32")]
    shapes = sorted((c.shape.heads, c.shape.nodes, c.shape.past_len, c.shape.batch) for c in cases)
    assert shapes == sorted(itertools.product([8, 16, 64, 128], [16, 64, 256], [1024, 8192, 32768], [1, 8, 32]))
    assert all({"cuda", "torch", "torch_sdpa", "torch_twopass"} <= set(c.backends) for c in cases)


def test_tree_build_bench_covers_the_issue_grid():
    cases = [c for c in _cases("tree_build") if c.name.startswith("bench[")]
    shapes = sorted((c.shape.batch, c.shape.budget, c.shape.vocab) for c in cases)
    assert shapes == sorted(itertools.product([1, 8, 32, 64], [16, 64, 256, 1024], [32000, 163840]))
    assert all({"torch", "cpu_heap", "cuda"} <= set(c.backends) for c in cases)


def test_every_kernel_case_times_enough_samples_for_p20_p80():
    for path in sorted(KERNELS.glob("*.yaml")):
        for case in config.load(path).cases:
            assert case.timing.repeat >= 3, (path.name, case.name)
