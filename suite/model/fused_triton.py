"""Triton kernels of the default forward's small ops, where torch runs one elementwise kernel per operation: the
interleaved RoPE (mla.rope_interleaved on a GPU: ~15 kernels per call in eager torch, one here). Each output
element depends on its own row only, so these are batch-invariant as well. The RMS norm's kernel is
invariant_triton.rms_norm, which the default path shares (mla.rms_norm)."""
from __future__ import annotations

import torch

from .triton_base import AVAILABLE, IMPORT_ERROR, tl, triton  # noqa: F401 (re-exported)
from .triton_base import jit as _jit


_const = tl.constexpr if AVAILABLE else float  # a kernel reads module globals only as constexprs
TWO_PI = _const(6.283185307179586)        # float64 2 pi: the reduction's error is ~1e-11 rad at 131K positions
INV_TWO_PI = _const(0.15915494309189535)  # a product, not a float64 division (a slow sequence)


@_jit(do_not_specialize=["T", "H"])
def _rope_kernel(X, POS, F, Y, T, H, sxb, sxt, sxh, spb, spt, P: tl.constexpr, BH: tl.constexpr,
                 BP: tl.constexpr, FP64_TRIG: tl.constexpr):
    """Program (r, j), r = b * T + t, rotates heads j * BH .. j * BH + BH - 1 (< H) of row (b, t): pairs
    (x[2i], x[2i+1]) by pos * F[i], the angle in float64, the rotation in float32 (as mla._rotate), stored in Y's
    dtype, contiguous. cos / sin: FP64_TRIG takes libdevice's float64 ones (s11's); otherwise the angle is reduced
    to [-pi, pi] in float64 and rounded to float32 (error <= 2.4e-7 rad) for float32 cos / sin, below a bf16
    output's half ulp but for rare roundings (tests/test_model.py bounds them at one ulp)."""
    r = tl.program_id(0)
    b, t = r // T, r % T
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    i = tl.arange(0, BP)
    pos = tl.load(POS + b.to(tl.int64) * spb + t.to(tl.int64) * spt).to(tl.float64)
    ang = pos * tl.load(F + i, mask=i < P, other=0.0)                       # [BP] float64 radians
    if FP64_TRIG:
        c = tl.cos(ang).to(tl.float32)[None, :]
        s = tl.sin(ang).to(tl.float32)[None, :]
    else:
        # float64 constants by tl.full: a bare float literal would be float32 (2 pi off by 1.7e-7 per turn)
        turns = tl.floor(ang * tl.full([BP], INV_TWO_PI, tl.float64) + 0.5)
        red = (ang - turns * tl.full([BP], TWO_PI, tl.float64)).to(tl.float32)  # [BP] in [-pi, pi]
        c = tl.cos(red)[None, :]
        s = tl.sin(red)[None, :]
    m = (h[:, None] < H) & (i[None, :] < P)
    xp = X + b.to(tl.int64) * sxb + t.to(tl.int64) * sxt + h[:, None].to(tl.int64) * sxh + 2 * i[None, :]
    x0 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x1 = tl.load(xp + 1, mask=m, other=0.0).to(tl.float32)
    yp = Y + r.to(tl.int64) * (H * 2 * P) + h[:, None] * (2 * P) + 2 * i[None, :]
    tl.store(yp, (x0 * c - x1 * s).to(Y.dtype.element_ty), mask=m)
    tl.store(yp + 1, (x0 * s + x1 * c).to(Y.dtype.element_ty), mask=m)


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, fp64_trig: bool = False,
         block_heads: int = 4) -> torch.Tensor:
    """x [B, T, dr] or [B, T, H, dr] (last stride 1), positions [B, T] int, freqs [dr / 2] float64 -> x rotated,
    contiguous, x's dtype. Launched without FMA contraction, so products and sums round as torch's do.
    fp64_trig: float64 cos / sin (s11's form); block_heads: heads per program (a power of 2). One program per row for
    all 64 heads took 11.4 us per call for q_pe at batch 1, 8 heads a program 2.4 us and 16 3.1 us (s12 call B,
    graphs of 20 calls; float64 cos / sin 13.5 us). 4 heads: 2.2 us at batch 1, 7.8 us against 8 heads' 12.1 us for
    verify's 8 x 65 rows (s13 call A), so the default is 4. reports/h200/forward_profile.py times them."""
    if block_heads < 1 or block_heads & (block_heads - 1):
        raise ValueError(f"rope: block_heads must be a power of 2, got {block_heads}")
    B, T = x.shape[:2]
    H = x.shape[2] if x.dim() == 4 else 1
    P = x.shape[-1] // 2
    sxh = x.stride(2) if x.dim() == 4 else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    bh = min(block_heads, triton.next_power_of_2(H))
    if B * T * H:
        _rope_kernel[(B * T, triton.cdiv(H, bh))](
            x, positions, freqs, y, T, H, x.stride(0), x.stride(1), sxh, positions.stride(0), positions.stride(1),
            P=P, BH=bh, BP=triton.next_power_of_2(P), FP64_TRIG=fp64_trig, num_warps=4 if bh >= 16 else 1,
            enable_fp_fusion=False)
    return y
