"""Triton kernels of the default forward's small ops, where torch runs one elementwise kernel per operation: the
interleaved RoPE (mla.rope_interleaved on a GPU: ~15 kernels per call in eager torch, one here). Each output
element depends on its own row only, so these are batch-invariant as well. The RMS norm's kernel is
invariant_triton.rms_norm, which the default path shares (mla.rms_norm)."""
from __future__ import annotations

import torch

from .triton_base import AVAILABLE, IMPORT_ERROR, tl, triton  # noqa: F401 (re-exported)
from .triton_base import jit as _jit


@_jit(do_not_specialize=["T", "H"])
def _rope_kernel(X, POS, F, Y, T, H, sxb, sxt, sxh, spb, spt, P: tl.constexpr, BH: tl.constexpr,
                 BP: tl.constexpr):
    """Program r = b * T + t rotates the H heads of row (b, t): pairs (x[2i], x[2i+1]) by pos * F[i], the angle
    and its cos / sin in float64, the rotation in float32 (as mla._rotate), stored in Y's dtype, contiguous."""
    r = tl.program_id(0)
    b, t = r // T, r % T
    h = tl.arange(0, BH)
    i = tl.arange(0, BP)
    pos = tl.load(POS + b.to(tl.int64) * spb + t.to(tl.int64) * spt).to(tl.float64)
    ang = pos * tl.load(F + i, mask=i < P, other=0.0)                       # [BP] float64 radians
    c = tl.cos(ang).to(tl.float32)[None, :]
    s = tl.sin(ang).to(tl.float32)[None, :]
    m = (h[:, None] < H) & (i[None, :] < P)
    xp = X + b.to(tl.int64) * sxb + t.to(tl.int64) * sxt + h[:, None].to(tl.int64) * sxh + 2 * i[None, :]
    x0 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x1 = tl.load(xp + 1, mask=m, other=0.0).to(tl.float32)
    yp = Y + r.to(tl.int64) * (H * 2 * P) + h[:, None] * (2 * P) + 2 * i[None, :]
    tl.store(yp, (x0 * c - x1 * s).to(Y.dtype.element_ty), mask=m)
    tl.store(yp + 1, (x0 * s + x1 * c).to(Y.dtype.element_ty), mask=m)


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x [B, T, dr] or [B, T, H, dr] (last stride 1), positions [B, T] int, freqs [dr / 2] float64 -> x rotated,
    contiguous, x's dtype. Launched without FMA contraction, so products and sums round as torch's do."""
    B, T = x.shape[:2]
    H = x.shape[2] if x.dim() == 4 else 1
    P = x.shape[-1] // 2
    sxh = x.stride(2) if x.dim() == 4 else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if B * T * H:
        _rope_kernel[(B * T,)](x, positions, freqs, y, T, H, x.stride(0), x.stride(1), sxh, positions.stride(0),
                               positions.stride(1), P=P, BH=triton.next_power_of_2(H), BP=triton.next_power_of_2(P),
                               num_warps=4, enable_fp_fusion=False)
    return y
