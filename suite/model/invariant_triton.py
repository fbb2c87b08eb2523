"""Triton kernels of the batch-invariant mode: one fixed tile configuration per kernel (never chosen by M, no
split-K), so each output row's reduction over K, and each attention row's reduction over its keys, is the same
sequence of instructions whatever else shares the launch. invariant.py calls these; the default forward shares
rms_norm (per row, so invariant anyway: mla.rms_norm on a GPU).
"""
from __future__ import annotations

import torch

from . import moe_plan_triton
from .triton_base import AVAILABLE, IMPORT_ERROR, plan_block, tl, triton  # noqa: F401 (re-exported)
from .triton_base import jit as _jit

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): fixed per input dtype, never per M.
GEMM_CFG = {torch.bfloat16: (64, 128, 64, 4, 3), torch.float16: (64, 128, 64, 4, 3),
            torch.float32: (32, 64, 32, 4, 2)}
GROUPED_CFG = (64, 128, 64, 4, 3)   # expert GEMMs (bf16 / fp16)
ATTN_BLOCK_H, ATTN_BLOCK_N = 16, 32  # heads per program, keys per tile (logical positions)


@_jit(do_not_specialize=["M"])
def _gemm_kernel(X, W, Y, M, N, K, sxm, sxh, sxk, swh, swn, swk, sym, syh, syn,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    """Y[m, h, n] = sum_k X[m, h, k] W[h, n, k]; K in ascending BK steps, fp32 accumulator."""
    pid_m, pid_n, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    xp = X + h * sxh + rm[:, None] * sxm + rk[None, :] * sxk      # [BM, BK]
    wp = W + h * swh + rk[:, None] * swk + rn[None, :] * swn      # [BK, BN]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(xp, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)
        b = tl.load(wp, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        xp += BK * sxk
        wp += BK * swk
    yp = Y + h * syh + rm[:, None] * sym + rn[None, :] * syn
    tl.store(yp, acc.to(Y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x [M, H, K] (any strides), w [H, N, K] (any strides) -> [M, H, N] out_dtype."""
    M, H, K = x.shape
    N = w.shape[1]
    if x.dtype not in GEMM_CFG or w.dtype != x.dtype:
        raise ValueError(f"invariant matmul: unsupported dtypes {x.dtype} x {w.dtype}")
    bm, bn, bk, warps, stages = GEMM_CFG[x.dtype]
    y = torch.empty(M, H, N, dtype=out_dtype, device=x.device)
    if M == 0:
        return y
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), H)
    _gemm_kernel[grid](x, w, y, M, N, K, *x.stride(), *w.stride(), *y.stride(), BM=bm, BN=bn, BK=bk,
                       IEEE=x.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return y


@_jit(do_not_specialize=["rows"])
def _rms_kernel(X, Wt, Y, rows, D, sx, sy, eps, BLOCK: tl.constexpr):
    """One program per row: mean of squares over the whole row in one fixed tl.sum tree."""
    r = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    x = tl.load(X + r.to(tl.int64) * sx + d, mask=d < D, other=0.0).to(tl.float32)
    w = tl.load(Wt + d, mask=d < D, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(Y + r.to(tl.int64) * sy + d, (x * inv * w).to(Y.dtype.element_ty), mask=d < D)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_kernel[(x2.shape[0],)](x2, w, y, x2.shape[0], D, x2.stride(0), y.stride(0), eps,
                                    BLOCK=triton.next_power_of_2(D), num_warps=8)
    return y.view(x.shape)


@_jit(do_not_specialize=["S"])
def _grouped_kernel(X, ROWS, W1, W3, Y, BLK_E, BLK_R0, BLK_R1, S, N, K, sxm, swe, swn, sym,
                    GATED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Row block pid_m of one expert segment: Y[s] = X[ROWS[s]] @ W1[e].T (GATED: silu(. W1) * (. W3))."""
    pid_n = tl.program_id(1)
    e, rs, rmask = plan_block(BLK_E, BLK_R0, BLK_R1, BM)
    if e < 0:
        return
    src = tl.load(ROWS + rs, mask=rmask, other=0).to(tl.int64)
    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    xp = X + src[:, None] * sxm + rk[None, :]
    wo = e.to(tl.int64) * swe + rk[:, None] + rn[None, :] * swn
    acc1 = tl.zeros([BM, BN], dtype=tl.float32)
    acc3 = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(xp, mask=rmask[:, None] & (rk[None, :] + k0 < K), other=0.0)
        wmask = (rk[:, None] + k0 < K) & (rn[None, :] < N)
        acc1 = tl.dot(a, tl.load(W1 + wo, mask=wmask, other=0.0), acc1)
        if GATED:
            acc3 = tl.dot(a, tl.load(W3 + wo, mask=wmask, other=0.0), acc3)
        xp += BK
        wo += BK
    if GATED:
        g = acc1.to(Y.dtype.element_ty).to(tl.float32)        # the default path's rounding points
        u = acc3.to(Y.dtype.element_ty).to(tl.float32)
        acc1 = (g * tl.sigmoid(g)).to(Y.dtype.element_ty).to(tl.float32) * u
    yp = Y + rs.to(tl.int64)[:, None] * sym + rn[None, :]
    tl.store(yp, acc1.to(Y.dtype.element_ty), mask=rmask[:, None] & (rn[None, :] < N))


def _grouped(x, rows, w1, w3, meta, gated: bool) -> torch.Tensor:
    _, blk_e, r0, r1 = meta
    bm, bn, bk, warps, stages = GROUPED_CFG
    S, N, K = rows.shape[0], w1.shape[1], w1.shape[2]
    y = torch.empty(S, N, dtype=x.dtype, device=x.device)
    grid = (blk_e.shape[0], triton.cdiv(N, bn))
    _grouped_kernel[grid](x, rows, w1, w3, y, blk_e, r0, r1, S, N, K, x.stride(0), w1.stride(0), w1.stride(1),
                          y.stride(0), GATED=gated, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    return y


def grouped_swiglu(x: torch.Tensor, idx: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """x [N, d], idx [N, k] -> [N, k, d]: W2 (silu(W1 x) * W3 x) per (token, slot) with the slot's expert."""
    N, k = idx.shape
    if x.dtype not in (torch.bfloat16, torch.float16) or not (w1.is_contiguous() and w2.is_contiguous()):
        raise ValueError(f"invariant experts: need contiguous bf16/fp16 weights, got {x.dtype}")
    flat = idx.reshape(-1)
    meta, token = moe_plan_triton.block_plan(flat, w1.shape[0], GROUPED_CFG[0], k)   # token: x row of a sorted slot
    order = meta[0]
    h = _grouped(x.contiguous(), token, w1, w3, meta, True)              # [S, mi] sorted order
    ident = torch.arange(order.shape[0], dtype=torch.int32, device=x.device)
    out = _grouped(h, ident, w2, w2, meta, False)                        # [S, d] sorted order
    back = torch.empty_like(order)
    back[order] = torch.arange(order.shape[0], device=x.device)          # slot -> sorted position
    return out[back].view(N, k, -1)


@_jit(do_not_specialize=["ts"])
def _attn_kernel(Q, KV, O, ROW_B, ROW_C, ROW_NT, TIDX, ts, sqr, sqh, skb, sks, sor, soh, H, scale,
                 DC: tl.constexpr, DR: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr):
    """Query row r, heads [hb*BH, (hb+1)*BH): online softmax over the row's keys in logical order, BN-key
    tiles starting at logical position 0; the tile count is ceil((c + nt) / BN), the row's own."""
    r, hb = tl.program_id(0), tl.program_id(1)
    b = tl.load(ROW_B + r).to(tl.int64)
    c = tl.load(ROW_C + r)
    n = c + tl.load(ROW_NT + r)
    h = hb * BH + tl.arange(0, BH)
    hm = h < H
    dc, dr = tl.arange(0, DC), tl.arange(0, DR)
    qb = Q + r.to(tl.int64) * sqr + h[:, None] * sqh
    q_lat = tl.load(qb + dc[None, :], mask=hm[:, None], other=0.0)     # [BH, DC]
    q_pe = tl.load(qb + DC + dr[None, :], mask=hm[:, None], other=0.0)  # [BH, DR]
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, DC], dtype=tl.float32)
    for start in range(0, n, BN):
        pos = start + tl.arange(0, BN)
        valid = pos < n
        t = tl.load(TIDX + r.to(tl.int64) * ts + (pos - c), mask=valid & (pos >= c), other=0)
        slot = tl.where(pos < c, pos, c + t)
        slot = tl.where(valid, slot, 0).to(tl.int64)
        kb = KV + b * skb + slot[:, None] * sks
        k_lat = tl.load(kb + dc[None, :], mask=valid[:, None], other=0.0)   # [BN, DC]
        k_pe = tl.load(kb + DC + dr[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q_lat, tl.trans(k_lat)) + tl.dot(q_pe, tl.trans(k_pe))   # [BH, BN] fp32
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_lat.dtype), k_lat)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + r.to(tl.int64) * sor + h[:, None] * soh + dc[None, :], o.to(O.dtype.element_ty), mask=hm[:, None])


def attention(q: torch.Tensor, kv: torch.Tensor, kl, scale: float, dc: int) -> torch.Tensor:
    """q [R, H, dc + dr] contiguous, kv [B, S, dc + dr] (last axis contiguous) -> o_lat [R, H, dc]."""
    R, H, D = q.shape
    dr = D - dc
    if dc & (dc - 1) or dr & (dr - 1) or dr < 16 or kv.stride(-1) != 1 or kv.dtype != q.dtype:
        raise ValueError(f"invariant attention: needs power-of-2 dc, dr >= 16 and a {q.dtype} cache; got dc {dc}, "
                         f"dr {dr}, cache {kv.dtype}")
    if any(t.shape[0] != R or not t.is_contiguous() for t in kl):
        raise ValueError("invariant attention: key lists must be contiguous with one entry per query row")
    o = torch.empty(R, H, dc, dtype=q.dtype, device=q.device)
    if R:
        grid = (R, triton.cdiv(H, ATTN_BLOCK_H))
        _attn_kernel[grid](q, kv, o, kl.row_b, kl.c, kl.nt, kl.tidx, kl.tidx.stride(0), q.stride(0), q.stride(1),
                           kv.stride(0), kv.stride(1), o.stride(0), o.stride(1), H, scale, DC=dc, DR=dr,
                           BH=ATTN_BLOCK_H, BN=ATTN_BLOCK_N, num_warps=4, num_stages=2)
    return o
