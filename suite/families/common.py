"""Helpers shared by the kernel families: dtype rounding, numpy <-> torch, allocator poisoning, checks."""
from __future__ import annotations

import numpy as np
import torch

from kdbench.check import CheckResult, compare, merge
from kdbench.config import Tolerance

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}


def run_dtype(dtype: str) -> str:
    """The dtype the torch / CUDA backends run a case in: float64 cases run in float32 on the device (the
    numpy reference is the float64 side), so inputs are drawn in float32 and bytes counted at 4 per element."""
    return "float32" if dtype == "float64" else dtype


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float data through the kernel's dtype so the reference reads the very values the kernel reads
    (bf16 values are returned as float32, which holds them exactly and halves the host memory)."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH_DTYPES[dtype])
    return t.numpy() if dtype in ("float32", "float64") else t.float().numpy()   # bf16 values, exact in f32


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


def backend_module(backend: str):
    """The module implementing a stage backend: torch ops or the CUDA extension wrappers."""
    if backend == "torch":
        from kdbench.backends import torch_ops
        return torch_ops
    if backend == "cuda":
        from kdbench.backends import cuda_ext
        return cuda_ext
    if backend == "cpu_heap":
        from kdbench.backends import cpu_heap
        return cpu_heap
    raise KeyError(f"no stage module for backend {backend!r}")
