"""GPU tests of the kv_compact CUDA kernel against kdbench.references.kv_compact.compact_kv, bit-exact:
in place, every layer in one launch, rows past each request's tree left untouched (they hold NaN, so a
stray read or write shows); the skip rules of csrc/kv_compact.h; graph replay."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kdbench.references import kv_compact as ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    layers: int
    batch: int
    dim: int      # D: 576 = the MLA latent row; odd sizes take the narrow-vector paths
    dtype: str
    nodes: int    # N tree rows per request
    width: int    # A = max_depth + 1 accepted slots
    seed: int
    pattern: str = "random"  # "chain": accepted[k] = k + 1 (each source is the next destination); "none"
    misalign: int = 0        # elements the cache starts past a 16-byte boundary (narrow-vector path)


CASES = [
    Case(2, 3, 576, "bfloat16", 17, 16, 1),
    Case(61, 2, 576, "bfloat16", 65, 16, 2),      # every layer of Kimi-K2 in one launch
    Case(2, 64, 576, "bfloat16", 65, 16, 3),
    Case(2, 5, 7, "float32", 30, 16, 4),           # 28-byte rows: 4-byte vectors
    Case(2, 4, 3, "bfloat16", 30, 16, 5),          # 6-byte rows: 2-byte elements
    Case(1, 3, 64, "float32", 1100, 1025, 6),      # 1025 accepted rows: 33 ballots of 32 slots
    Case(61, 1, 576, "bfloat16", 65, 16, 7),       # batch 1
    Case(5, 3, 576, "bfloat16", 65, 16, 8, "chain"),
    Case(1, 2, 64, "float32", 1100, 1025, 10, "chain"),
    Case(3, 4, 576, "bfloat16", 65, 16, 11, "none"),  # nothing moves
    Case(3, 3, 576, "bfloat16", 65, 16, 12, misalign=1),  # 2-byte vectors, 576 per row: 3 column passes
    Case(2, 3, 8192, "bfloat16", 40, 16, 13),      # 1024 16-byte vectors per row: 4 column passes
    Case(7, 9, 576, "float32", 65, 16, 14),        # 144 vectors per row, 7 layers over chunks of 2
    Case(27, 20, 2048, "float32", 20, 16, 15),     # bulk path: 8 KB rows, 5 per batch: several batches per CTA
    Case(2, 3, 8192, "float32", 40, 16, 16),       # bulk path: 32 KB rows, one per batch
    Case(2, 3, 16384, "float32", 20, 16, 17),      # 64 KB rows: more than a bulk batch holds, the vector kernel
]
IDS = [f"l{c.layers}-b{c.batch}-D{c.dim}-{c.dtype}-N{c.nodes}-A{c.width}-{c.pattern}-m{c.misalign}" for c in CASES]


def _ext():
    from kdbench.backends import cuda_ext  # on a GPU machine a failed build is an error, not a skip
    return cuda_ext


def _accepted(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[B, A] strictly increasing rows from 0 (-1 padding) and [B] lengths: random paths, every 4th request
    already in place, one root-only request and one full-width request."""
    acc = np.full((case.batch, case.width), -1, dtype=np.int32)
    lens = np.zeros(case.batch, dtype=np.int32)
    for b in range(case.batch):
        k = int(rng.integers(1, min(case.width, case.nodes) + 1))
        k = {0: min(case.width, case.nodes), 2: 1}.get(b, k)
        rows = np.sort(rng.choice(np.arange(1, case.nodes), size=k - 1, replace=False))
        if b % 4 == 1 or case.pattern == "none":
            rows = np.arange(1, k)
        if case.pattern == "chain":
            k = min(case.width, case.nodes - 1)
            rows = np.arange(2, k + 1)
        acc[b, :k] = np.concatenate([[0], rows])
        lens[b] = k
    return acc, lens


# "default": the launcher's choice (the bulk path on sm_90 where the rows allow it, a programmatic dependent of the
# kernel before it); "no_pdl": KDB_PDL=0, the same path in plain stream order; "vector": KDB_KVC_BULK=0, the vector
# kernel everywhere (what other GPUs run).
PATH_ENV = {"default": {}, "no_pdl": {"KDB_PDL": "0"}, "vector": {"KDB_KVC_BULK": "0"}}


@pytest.mark.parametrize("path", list(PATH_ENV))
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_reference(case, path, monkeypatch):
    for name, value in PATH_ENV[path].items():
        monkeypatch.setenv(name, value)
    rng = np.random.default_rng(case.seed)
    past = rng.integers(1, 64, case.batch).astype(np.int32)
    seq = int(past.max()) + case.nodes + 3
    cache = rng.normal(0, 1, (case.layers, case.batch, seq, case.dim))
    for b in range(case.batch):
        cache[:, b, past[b] + case.nodes:] = np.nan  # rows nobody may read or write
    t = torch.from_numpy(cache).to(DTYPES[case.dtype])
    cache = t.double().numpy()                       # the values the kernel sees
    acc, lens = _accepted(case, rng)
    dev = _on_device(t, case.misalign)
    _ext().kv_compact(dev, _i32(past), _i32(acc), _i32(lens))
    got = dev.double().cpu().numpy()
    for b in range(case.batch):
        want, _ = ref.compact_kv(cache[:, b], int(past[b]), acc[b, :lens[b]])
        assert np.array_equal(got[:, b], want, equal_nan=True), f"request {b}: accepted {acc[b, :lens[b]].tolist()}"


def _i32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).to(DEVICE)


def _on_device(t: torch.Tensor, misalign: int) -> torch.Tensor:
    """A contiguous device copy of t whose data starts `misalign` elements past an aligned allocation."""
    flat = torch.empty(t.numel() + misalign, dtype=t.dtype, device=DEVICE)
    dev = flat[misalign:].view(t.shape)
    dev.copy_(t.to(DEVICE))
    return dev


def _skipping_reference(cache: np.ndarray, past: int, acc: np.ndarray, n: int) -> np.ndarray:
    """csrc/kv_compact.h's rule for one request [layers, S, D]: k < min(n, width) moves unless accepted[k] == k,
    accepted[k] < 0, past < 0, or row past + k or past + accepted[k] lies outside the cache."""
    out, seq = cache.copy(), cache.shape[1]
    for k in range(min(n, len(acc))):
        src = int(acc[k])
        if src != k and src >= 0 and past >= 0 and past + src < seq and past + k < seq:
            out[:, past + k] = cache[:, past + src]
    return out


def test_rows_outside_the_cache_are_skipped():
    """Request 0's later sources lie past the cache's end, request 1 has past < 0, request 2 an accept_len
    past the width: the kernel moves what is in range and touches nothing else."""
    rng = np.random.default_rng(15)
    layers, batch, seq, dim, width = 3, 4, 90, 576, 16
    cache = rng.normal(0, 1, (layers, batch, seq, dim))
    t = torch.from_numpy(cache).to(torch.bfloat16)
    cache = t.double().numpy()
    acc = np.full((batch, width), -1, dtype=np.int32)
    for b in range(batch):
        acc[b] = np.concatenate([[0], np.sort(rng.choice(np.arange(1, 40), size=width - 1, replace=False))])
    past = np.array([seq - 20, -1, 7, 30], dtype=np.int32)
    lens = np.array([width, width, width + 5, 9], dtype=np.int32)
    dev = t.to(DEVICE)
    _ext().kv_compact(dev, _i32(past), _i32(acc), _i32(lens))
    got = dev.double().cpu().numpy()
    for b in range(batch):
        want = _skipping_reference(cache[:, b], int(past[b]), acc[b], int(lens[b]))
        assert np.array_equal(got[:, b], want), f"request {b}: past {past[b]}, accepted {acc[b].tolist()}"
    assert not np.array_equal(got[:, 0], cache[:, 0]), "request 0 has moves in range: something must move"


def test_bad_inputs_name_the_argument():
    cuda_ext = _ext()
    cache = torch.zeros(2, 2, 8, 4, device=DEVICE)
    i32 = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    acc = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(RuntimeError, match="accepted must be int32"):
        cuda_ext.kv_compact(cache, i32, acc.long(), i32)
    with pytest.raises(RuntimeError, match="cache must be bfloat16 or float32"):
        cuda_ext.kv_compact(cache.half(), i32, acc, i32)
    with pytest.raises(RuntimeError, match="cache must be contiguous"):
        cuda_ext.kv_compact(cache.transpose(2, 3), i32, acc, i32)
    with pytest.raises(RuntimeError, match="accept_len must be \\[B\\]"):
        cuda_ext.kv_compact(cache, i32, acc, i32[:1])


def test_cuda_graph_replay_matches_eager():
    cuda_ext = _ext()
    rng = np.random.default_rng(9)
    case = Case(4, 8, 576, "bfloat16", 65, 16, 9)
    acc, lens = (torch.from_numpy(a).to(DEVICE) for a in _accepted(case, rng))
    past = torch.full((case.batch,), 5, dtype=torch.int32, device=DEVICE)
    start = torch.randn(case.layers, case.batch, 80, case.dim, device=DEVICE).to(torch.bfloat16)
    eager, captured = start.clone(), start.clone()
    cuda_ext.kv_compact(eager, past, acc, lens)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cuda_ext.kv_compact(start.clone(), past, acc, lens)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        cuda_ext.kv_compact(captured, past, acc, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, captured)
