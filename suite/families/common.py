"""Helpers shared by the kernel families: random inputs, dtype rounding, numpy <-> torch, allocator poisoning,
checks."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from kdbench.check import CheckResult, compare, merge
from kdbench.config import Tolerance

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}


def every_backend(backend: str, case) -> str | None:
    """KernelFamily.unsupported for a family whose every registered backend runs every case."""
    return None


def case_reference(backend: str, inputs: dict, case) -> dict | None:
    """KernelFamily.reference_for for a family whose backends all do the case's whole work (None: the case's
    reference)."""
    return None


def run_dtype(dtype: str) -> str:
    """The dtype the torch / CUDA backends run a case in: float64 cases run in float32 on the device (the
    numpy reference is the float64 side), so inputs are drawn in float32 and bytes counted at 4 per element."""
    return "float32" if dtype == "float64" else dtype


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float data through the kernel's dtype so the reference reads the very values the kernel reads
    (bf16 values are returned as float32, which holds them exactly and halves the host memory)."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH_DTYPES[dtype])
    return t.numpy() if dtype in ("float32", "float64") else t.float().numpy()   # bf16 values, exact in f32


NORMAL_BLOCK = 1 << 22   # elements per generator block (16 MiB of float32)


def standard_normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """scale * N(0, 1) float32 draws of `shape`, rounded through `dtype` as round_to does (bf16 values held in
    float32). Up to NORMAL_BLOCK elements come straight from rng, the values round_to(scale *
    rng.standard_normal(shape, float32)) gives. Bigger arrays are drawn in fixed NORMAL_BLOCK pieces, piece i
    from rng.spawn's child i, on a thread pool: numpy's generators are single-threaded and a [32, 33K, 576]
    cache is 6e8 draws (~12 s on one core here). The pieces are fixed, so a seed gives the same values on every
    machine and thread count; the children are independent streams (SeedSequence spawning)."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {dtype!r}: draw in a run dtype (float32 or bfloat16), see run_dtype")
    n = int(np.prod(shape))
    if n <= NORMAL_BLOCK:
        x = rng.standard_normal(shape, dtype=np.float32)
        return round_to(x * np.float32(scale) if scale != 1.0 else x, dtype)
    out = np.empty(n, dtype=np.float32)
    starts = range(0, n, NORMAL_BLOCK)
    children = rng.spawn(len(starts))

    def fill(i: int) -> None:
        piece = out[starts[i]:starts[i] + NORMAL_BLOCK]
        children[i].standard_normal(out=piece, dtype=np.float32)
        if scale != 1.0:
            piece *= np.float32(scale)
        _round_in_place(piece, dtype)

    parallel_map(fill, range(len(starts)))
    return out.reshape(shape)


def parallel_map(fn, items, blas: bool = False) -> list:
    """[fn(x) for x in items] on host threads, in order. For numpy-heavy host work (input draws, float64
    references): ufuncs, BLAS and the generators release the GIL. blas=True for work dominated by BLAS calls:
    OpenBLAS takes every core per call unless OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) says otherwise, and
    threads calling it at once then oversubscribe the cores (2x slower than serial measured on 2 cores), so
    such work gets cores / BLAS threads workers: serial by default, every core with OPENBLAS_NUM_THREADS=1."""
    items = list(items)
    cores = os.cpu_count() or 1
    workers = min(len(items), cores // _blas_threads(cores) if blas else cores)
    if workers <= 1:
        return [fn(x) for x in items]
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        return list(pool.map(fn, items))
    finally:   # on Ctrl-C / SIGINT: drop the queued items, wait only for the running ones
        pool.shutdown(wait=True, cancel_futures=True)


def _blas_threads(cores: int) -> int:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return min(int(value), cores)
    return cores


def _round_in_place(x: np.ndarray, dtype: str) -> None:
    """x (finite float32, contiguous) <- its values rounded through dtype, as round_to does, without a new
    array or torch's intra-op threads (this runs on parallel_map's threads): bf16 is round-to-nearest-even of
    the upper 16 bits (finite inputs only: a NaN payload could round to inf)."""
    if dtype == "bfloat16":
        u = x.view(np.uint32)
        u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
        u &= np.uint32(0xFFFF0000)


def to_torch(x: np.ndarray, device: str, dtype: str | None = None) -> torch.Tensor:
    """A device copy of x. Never a view of the numpy array: in-place kernels (kv_compact) must not rewrite
    the inputs the reference and later checks read."""
    src = torch.from_numpy(np.ascontiguousarray(x))
    t = src.to(TORCH_DTYPES[dtype]) if dtype is not None else src
    t = t.to(device)
    return t.clone() if t.data_ptr() == src.data_ptr() else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()


def poison_allocator(device: str, nbytes: int) -> None:
    """Fill about `nbytes` of the caching allocator's memory with NaN bytes and free it, so that outputs the
    next kernel allocates start as NaN (0xFF..) instead of stale data: an unwritten element then fails the
    check. A no-op on CPU, where fresh numpy/torch buffers are compared whole anyway."""
    if device != "cuda" or nbytes <= 0:
        return
    junk = torch.full((max(1, nbytes // 4),), float("nan"), dtype=torch.float32, device=device)
    del junk


def check_outputs(got: dict, want: dict, tol: Tolerance, exact_keys: tuple[str, ...] = ()) -> CheckResult:
    """Compare every output the reference defines; integer / structural outputs (exact_keys) bit-exactly."""
    exact = Tolerance(0.0, 0.0, None, 0.0)
    results = []
    for key, ref in want.items():
        if key not in got:
            results.append(CheckResult(False, 0, np.nan, np.nan, np.nan, 100.0, f"output {key!r} missing"))
            continue
        res = compare(np.asarray(got[key]), np.asarray(ref), exact if key in exact_keys else tol)
        if not res.passed:
            res = CheckResult(res.passed, res.n_nan, res.max_abs, res.max_rel, res.rel_l2, res.pct_outside,
                              f"{key}: {res.worst}")
        results.append(res)
    return merge(results)

