"""Peer backend for moe_experts: FlashInfer 0.5.3's cutlass_fused_moe (TensorRT-LLM's CUTLASS MoE: permute,
grouped GEMM with the gated activation fused, finalize), the public fused-MoE kernel with a bf16 sm90 path.
It ships as source: its first call JIT-builds ~20 CUTLASS MoE translation units plus generated instantiations
(minutes on 16 cores), so the entry is unavailable until that build exists, unless KDBENCH_FLASHINFER_MOE_BUILD=1.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch

from kdbench.backends import flashinfer_mla

BUILD_ENV = "KDBENCH_FLASHINFER_MOE_BUILD"


@functools.cache
def _built() -> bool:
    """Whether the sm90 fused-MoE module is already compiled (or AOT) in FlashInfer's cache."""
    jit = importlib.import_module("flashinfer.jit.fused_moe")
    spec = jit.gen_cutlass_fused_moe_sm90_module()
    return bool(spec.is_aot or spec.is_compiled)


def unavailable_reason() -> str | None:
    base = flashinfer_mla.unavailable_reason()
    if base:
        return base
    if os.environ.get(BUILD_ENV) == "1":
        return None
    try:
        built = _built()
    except Exception as exc:   # noqa: BLE001 - a broken install or a read-only package dir raises anything here
        return f"FlashInfer's fused-MoE JIT spec failed ({type(exc).__name__}: {str(exc)[:120]})"
    if not built:
        return (f"FlashInfer {flashinfer_mla.VERSION}'s sm90 cutlass_fused_moe is not built: its JIT compiles ~20 "
                f"CUTLASS MoE sources (minutes); build it once with {BUILD_ENV}=1")
    return None


@functools.lru_cache(maxsize=2)
def _fc1(w1: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """[E, 2 mi, d]: TensorRT-LLM's gated layout puts the up (w3) rows first, then the gate (w1) rows. Made once
    per weight pair (a serving stack stores its weights this way), never inside the timed call."""
    return torch.cat([w3, w1], dim=1).contiguous()


def experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """The moe_experts op: x [N, d] bf16, idx / weights [N, k] -> [N, d] (the routed sum, weights applied)."""
    fm = importlib.import_module("flashinfer.fused_moe")
    out = fm.cutlass_fused_moe(x.contiguous(), idx.to(torch.int32).contiguous(), weights.float().contiguous(),
                               _fc1(w1, w3), w2, x.dtype, quant_scales=[])
    return out[0] if isinstance(out, (list, tuple)) else out
