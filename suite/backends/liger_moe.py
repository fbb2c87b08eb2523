"""Peer backend for moe_experts: Liger-Kernel's fused MoE (`liger_kernel.ops.fused_moe`, pinned to 0.8.5), a public
Triton MoE: routing metadata in three kernels, one kernel that gathers each slot's row and runs the gate / up grouped
GEMM with the SwiGLU fused, a down-projection grouped GEMM, and a weighted gather-sum over k. It is pure Python +
Triton (BSD-2-Clause), so it travels to the GPU machine as a wheel. Two things set it apart from ours:
- one host sync per call (`.item()` on the tile count), so it cannot be captured in a CUDA graph: its rows are eager;
- it runs its one pinned GEMM config (Liger's own switch LIGER_FUSED_MOE_AUTOTUNE=0, set here unless the caller set
  it): its autotuner compiles 32 configs of each of its two GEMM kernels per (hidden, width), minutes of device time
  per shape (s14 call B ran out of its limit inside that tuning at kimi-k2's layer). With LIGER_FUSED_MOE_AUTOTUNE=1
  it tunes; its key is (hidden, width) only, so the op then clears both caches when the row count changes, and each
  size gets its own best config. A tuned Liger may be faster than the pinned rows report.
Weights: its gate / up tensor [E, 2 mi, d] (the gate rows first) is made once per weight pair, outside timed calls.
"""
from __future__ import annotations

import functools
import importlib
import os
from importlib import metadata

import torch

os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")   # read by liger_kernel.ops.fused_moe_kernels at import

VERSION = "0.8.5"
_MODULE = "liger_kernel.ops.fused_moe"


def unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (Liger-Kernel's fused MoE is Triton)"
    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return (f"liger-kernel is not installed (pip install 'kdbench[peers]'; on the GPU machine the {VERSION} wheel "
                "is carried in .whl)")
    if version != VERSION:
        return f"liger-kernel {version} is installed; this peer is written against {VERSION} (its fused-MoE API)"
    try:
        importlib.import_module(_MODULE)
    except Exception as exc:   # noqa: BLE001 - a broken install raises anything at import
        return f"{_MODULE} does not import ({type(exc).__name__}: {str(exc)[:120]})"
    return None


@functools.lru_cache(maxsize=2)
def _gate_up(w1: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """[E, 2 mi, d]: Liger's layout puts the gate (w1) rows first, then the up (w3) rows; made once per pair."""
    return torch.cat([w1, w3], dim=1).contiguous()


_TUNED_ROWS: list[int] = []   # the row count the GEMM kernels' autotune caches were filled at


def _retune_for(rows: int, kernels) -> None:
    """Liger's autotune key is (H, I): clear its two caches when the row count changes (the next call re-tunes).
    Nothing to do with its one pinned config."""
    if not kernels._AUTOTUNE_DISABLED and _TUNED_ROWS != [rows]:
        for kernel in (kernels._fused_up_proj_swiglu_kernel, kernels._fused_down_proj_kernel):
            kernel.cache.clear()
        _TUNED_ROWS[:] = [rows]


def experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """The moe_experts op: x [N, d] bf16 / fp16, idx / weights [N, k] -> [N, d] (the routed sum, weights applied;
    Liger sums the k products in float32 and rounds once)."""
    fm = importlib.import_module(_MODULE)
    _retune_for(x.shape[0], importlib.import_module("liger_kernel.ops.fused_moe_kernels"))
    with torch.no_grad():
        return fm.LigerFusedMoEFunction.apply(x.contiguous(), _gate_up(w1, w3), w2.contiguous(),
                                              idx.to(torch.int32).contiguous(), weights.float().contiguous())
