"""Fused routed experts in Triton for decode / verify sizes: the gate and up GEMMs with SwiGLU in their
epilogue, then the down GEMM with the routing weight, each over the expert-sorted row blocks of moe_plan.
Each program reads one weight tile once for its block's rows. No host sync: capturable in a CUDA graph.
The shared expert can ride along as expert E (one more slot per token), so a layer is one pair of launches.
"""
from __future__ import annotations

import torch

from . import moe_plan_triton
from .moe_plan import shared_fits, with_shared
from .triton_base import AVAILABLE, IMPORT_ERROR, plan_block, tl, triton  # noqa: F401 (re-exported)
from .triton_base import jit as _jit

# (slots S up to, BM rows per block, up BN, down BN): decode rows are few per expert, so small row blocks waste
# the least MMA work; every block re-reads its expert's weights, so bigger S (more rows per expert) wants bigger
# blocks. BN = columns per program (intermediate for up, hidden for down): at S <= 1024 narrow 32-column programs
# spread the few experts' weights over more SMs; at verify sizes the down kernel's 128 columns halve the H re-reads.
# The BN choices were measured (plans/0015, 2026-12-02 s10, kimi-k2-slice-2's layer: call B at rows 1 / 8 / 520,
# call G at 2080 rows = batch 32 x T 65, where 128 / 128 took 14 % off 64 / 64).
CFG_BY_SLOTS = ((1024, 16, 32, 32), (8192, 32, 64, 128), (1 << 62, 64, 128, 128))
BK, WARPS, STAGES = 64, 4, 4   # K step (hidden for up, intermediate for down), warps and pipeline stages per program


@_jit()
def _up_kernel(X, TOKEN, W1, W3, SW1, SW3, NE, H, BLK_E, BLK_R0, BLK_R1, N, K, sxm, swe, swn, shm,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """H[p, n] = silu(x W1[e]^T) * (x W3[e]^T) for the sorted positions p of block pid_m, x = X[TOKEN[p]];
    expert NE is the shared expert (SW1 / SW3, same strides as one routed expert)."""
    pid_n = tl.program_id(1)
    e, rs, rmask = plan_block(BLK_E, BLK_R0, BLK_R1, BM)
    if e < 0:
        return
    src = tl.load(TOKEN + rs, mask=rmask, other=0).to(tl.int64)
    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    xp = X + src[:, None] * sxm + rk[None, :]
    wo = rk[:, None] + rn[None, :] * swn                                # [BK, BN], k contiguous
    if e == NE:
        p1, p3 = SW1 + wo, SW3 + wo
    else:
        p1, p3 = W1 + e.to(tl.int64) * swe + wo, W3 + e.to(tl.int64) * swe + wo
    nmask = rn[None, :] < N
    g = tl.zeros([BM, BN], dtype=tl.float32)
    u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            a = tl.load(xp, mask=rmask[:, None], other=0.0)
            b1 = tl.load(p1, mask=nmask, other=0.0)
            b3 = tl.load(p3, mask=nmask, other=0.0)
        else:
            kin = rk + k0 < K
            a = tl.load(xp, mask=rmask[:, None] & kin[None, :], other=0.0)
            b1 = tl.load(p1, mask=kin[:, None] & nmask, other=0.0)
            b3 = tl.load(p3, mask=kin[:, None] & nmask, other=0.0)
        g = tl.dot(a, b1, g)
        u = tl.dot(a, b3, u)
        xp += BK
        p1 += BK
        p3 += BK
    h = g * tl.sigmoid(g) * u                                            # SwiGLU on the fp32 accumulators
    tl.store(H + rs.to(tl.int64)[:, None] * shm + rn[None, :], h.to(H.dtype.element_ty), mask=rmask[:, None] & nmask)


@_jit()
def _down_kernel(H, ORDER, WT, W2, SW2, NE, OUT, BLK_E, BLK_R0, BLK_R1, N, K, shm, swe, swn, som,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """OUT[slot, n] = WT[slot] * (H[p] W2[e]^T)[n] for the sorted positions p of block pid_m, slot = ORDER[p]:
    the scatter back to slot order is this store (fp32), the sum over k is one pass after. Expert NE: SW2."""
    pid_n = tl.program_id(1)
    e, rs, rmask = plan_block(BLK_E, BLK_R0, BLK_R1, BM)
    if e < 0:
        return
    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    hp = H + rs.to(tl.int64)[:, None] * shm + rk[None, :]
    wo = rk[:, None] + rn[None, :] * swn
    if e == NE:
        p2 = SW2 + wo
    else:
        p2 = W2 + e.to(tl.int64) * swe + wo
    nmask = rn[None, :] < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            a = tl.load(hp, mask=rmask[:, None], other=0.0)
            b = tl.load(p2, mask=nmask, other=0.0)
        else:
            kin = rk + k0 < K
            a = tl.load(hp, mask=rmask[:, None] & kin[None, :], other=0.0)
            b = tl.load(p2, mask=kin[:, None] & nmask, other=0.0)
        acc = tl.dot(a, b, acc)
        hp += BK
        p2 += BK
    slot = tl.load(ORDER + rs, mask=rmask, other=0)
    wt = tl.load(WT + slot, mask=rmask, other=0.0)
    tl.store(OUT + slot[:, None] * som + rn[None, :], acc * wt[:, None], mask=rmask[:, None] & nmask)


def launch_cfg(slots: int) -> tuple[int, int, int]:
    """(BM, up BN, down BN) for a launch of `slots` (token, k) slots: a function of the shape only (graph capture)."""
    return next(cfg for limit, *cfg in CFG_BY_SLOTS if slots <= limit)


def block_rows(slots: int) -> int:
    """BM for a launch of `slots` (token, k) slots (moe_plan.emulate's walk must use the kernels' blocks)."""
    return launch_cfg(slots)[0]


def _check(x, w1, w2, w3, shared) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16) or not all(w.dtype == x.dtype for w in (w1, w2, w3)):
        raise ValueError(f"triton experts: need bf16/fp16 activations and weights, got {x.dtype}, {w1.dtype}")
    if not all(w.is_contiguous() for w in (w1, w2, w3)):
        raise ValueError("triton experts: expert weights must be contiguous [E, mi, d] / [E, d, mi]")
    if shared is not None and not shared_fits(shared, (w1, w2, w3)):
        raise ValueError("triton experts: the shared expert must be one routed expert's shape, dtype and layout, "
                         f"got {[tuple(s.shape) for s in shared]} for experts {tuple(w1.shape)}")


def experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1, w2, w3,
            shared: tuple | None = None) -> torch.Tensor:
    """sum_j weights[:, j] * W2 (silu(W1 x) * W3 x) with expert idx[:, j]: x [N, d], idx / weights [N, k],
    w1 / w3 [E, mi, d], w2 [E, d, mi] -> [N, d] in x's dtype (fp32 accumulation, one rounding at the end).
    shared: the shared expert's (w1 [mi, d], w2 [d, mi], w3 [mi, d]), added in the same launches as slot k
    (moe_plan.with_shared) instead of three GEMMs of its own."""
    _check(x, w1, w2, w3, shared)
    E, mi, d = w1.shape
    if shared is not None:
        idx, weights = with_shared(idx, weights, E)
    sw1, sw2, sw3 = shared if shared is not None else (w1, w2, w3)   # no block has expert E without it
    N, k = idx.shape
    if N == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    S = N * k
    bm, up_bn, down_bn = launch_cfg(S)
    plan, token = moe_plan_triton.block_plan(idx.reshape(-1), E + (shared is not None), bm, k)
    h = torch.empty(S, mi, dtype=x.dtype, device=x.device)              # sorted order
    _up_kernel[(plan.blk_e.shape[0], triton.cdiv(mi, up_bn))](
        x, token, w1, w3, sw1, sw3, E, h, plan.blk_e, plan.blk_r0, plan.blk_r1, mi, d, x.stride(0), w1.stride(0),
        w1.stride(1), h.stride(0), BM=bm, BN=up_bn, BK=BK, EVEN_K=d % BK == 0, num_warps=WARPS, num_stages=STAGES)
    out = torch.empty(S, d, dtype=torch.float32, device=x.device)       # slot order
    _down_kernel[(plan.blk_e.shape[0], triton.cdiv(d, down_bn))](
        h, plan.order, weights.reshape(-1).float().contiguous(), w2, sw2, E, out, plan.blk_e, plan.blk_r0,
        plan.blk_r1, d, mi, h.stride(0), w2.stride(0), w2.stride(1), out.stride(0), BM=bm, BN=down_bn, BK=BK,
        EVEN_K=mi % BK == 0, num_warps=WARPS, num_stages=STAGES)
    return out.view(N, k, d).sum(1).to(x.dtype)


experts.fuses_shared = True   # model/moe.py passes the shared expert in rather than adding it after


@_jit()
def _route_kernel(S, BIAS, IDX, WT, E, scale, K: tl.constexpr, KP2: tl.constexpr, EP2: tl.constexpr,
                  NORM: tl.constexpr):
    """Row pid of moe.route after the sigmoid (n_group 1): the K largest of S + BIAS, largest first, ties to the
    lower expert index (= the stable descending sort), their unbiased scores, normalized, times scale. The picks
    stay in registers (slot j of a KP2-wide vector) and are stored once."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, EP2)
    live = cols < E
    s = tl.load(S + r * E + cols, mask=live, other=0.0)
    b = s + tl.load(BIAS + cols, mask=live, other=0.0)
    ks = tl.arange(0, KP2)
    picks = tl.zeros([KP2], dtype=tl.int64)
    wts = tl.zeros([KP2], dtype=tl.float32)
    total = 0.0
    for j in tl.static_range(K):
        best = tl.max(tl.where(live, b, float("-inf")), 0)
        pick = tl.min(tl.where(live & (b == best), cols, EP2), 0)   # the lowest index among the largest
        # no live lane equals the max when the rest are NaN: take the lowest live one, never an index >= E
        pick = tl.minimum(tl.where(pick < E, pick, tl.min(tl.where(live, cols, EP2), 0)), E - 1)
        w = tl.sum(tl.where(cols == pick, s, 0.0), 0)
        picks = tl.where(ks == j, pick.to(tl.int64), picks)
        wts = tl.where(ks == j, w, wts)
        total += w
        live = live & (cols != pick)
    if NORM:
        wts = wts / total
    tl.store(IDX + r * K + ks, picks, mask=ks < K)
    tl.store(WT + r * K + ks, wts * scale, mask=ks < K)


def route_select(s: torch.Tensor, bias: torch.Tensor, k: int, norm: bool, scale: float):
    """moe.route's selection for one group (n_group 1) in one launch: s [N, E] float32 sigmoid scores, bias [E]
    -> (idx [N, k] int64, weights [N, k] float32). Same experts as the torch path (exact float32 add and compares,
    ties to the lower index); the weights' sum runs left to right over the k picks (torch's order may differ by
    an ulp). Replaces the add, the stable sort (21 us at one row on the H200) and four small kernels."""
    n, e = s.shape
    s = s.float().contiguous()
    idx = torch.empty(n, k, dtype=torch.int64, device=s.device)
    wt = torch.empty(n, k, dtype=torch.float32, device=s.device)
    if n:
        _route_kernel[(n,)](s, bias.float().contiguous(), idx, wt, e, float(scale), K=k,
                            KP2=triton.next_power_of_2(k), EP2=triton.next_power_of_2(e), NORM=bool(norm),
                            num_warps=4)
    return idx, wt
