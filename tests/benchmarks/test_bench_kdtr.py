"""pytest-benchmark timings of KDTR reads and writes of a 64 MiB file, Python and C++ paths.

Run with `python -m pytest tests/benchmarks/test_bench_kdtr.py --benchmark-only`; the default
`--benchmark-skip` run skips them. Napkin math: GB/s = extra_info["bytes"] / median seconds / 1e9.
"""
import numpy as np
import pytest

from kdbench import _kdtr  # built by pip install -e . (setup.py)
from kdbench.kdtr import load, save

ROUNDS = dict(rounds=5, iterations=1, warmup_rounds=1)  # each round moves 64-128 MiB


def _tensors() -> dict[str, np.ndarray]:
    """64 MiB of data in checkpoint-like tensors (seed 77): 32 + 16 + 16 MiB plus small ones."""
    rng = np.random.default_rng(77)
    return {
        "w_f32": rng.standard_normal((4096, 2048), dtype=np.float32),     # 32 MiB
        "w_bf16": rng.integers(0, 2**16, (4096, 2048), dtype=np.uint16),  # bf16 bits, 16 MiB
        "idx_i32": rng.integers(0, 2**31, (2048, 2048), dtype=np.int32),  # 16 MiB
        "scale": np.float64(0.5),
        "mask": rng.integers(0, 2, 1000).astype(bool),
    }


def _saved(tmp_path):
    tensors = _tensors()
    path = tmp_path / "bench.kdtr"
    save(path, tensors, {"w_bf16": "bf16"})
    return path, path.stat().st_size


def test_bench_save_python(benchmark, tmp_path):
    """Bytes moved: the file written once (plus a CRC pass over the data and an fsync)."""
    tensors, path = _tensors(), tmp_path / "w.kdtr"
    benchmark.pedantic(save, args=(path, tensors, {"w_bf16": "bf16"}), **ROUNDS)
    benchmark.extra_info["bytes"] = path.stat().st_size


@pytest.mark.parametrize("mmap,verify", [(True, True), (False, True), (True, False)],
                         ids=["mmap-verified", "copy-verified", "mmap-lazy"])
def test_bench_load_python(benchmark, tmp_path, mmap, verify):
    """Bytes moved: the file read once (mmap-lazy reads only the header: an open-cost figure)."""
    path, size = _saved(tmp_path)
    got = benchmark.pedantic(load, args=(path, mmap), kwargs={"verify": verify}, **ROUNDS)
    assert got["w_f32"].shape == (4096, 2048)
    benchmark.extra_info["bytes"] = size if verify or not mmap else 0


def test_bench_read_cpp(benchmark, tmp_path):
    """Bytes moved: the file read once, then each tensor copied into a Python bytes object."""
    path, size = _saved(tmp_path)
    got = benchmark.pedantic(_kdtr.read, args=(str(path),), **ROUNDS)
    assert got["w_f32"][1] == (4096, 2048)
    benchmark.extra_info["bytes"] = size


def test_bench_roundtrip_cpp(benchmark, tmp_path):
    """Bytes moved: the file read once and written once (2x its size), all in C++."""
    path, size = _saved(tmp_path)
    benchmark.pedantic(_kdtr.roundtrip, args=(str(path), str(tmp_path / "copy.kdtr")), **ROUNDS)
    assert (tmp_path / "copy.kdtr").stat().st_size == size
    benchmark.extra_info["bytes"] = 2 * size
