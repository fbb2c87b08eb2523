"""moe_plan.block_plan in one Triton launch for decode sizes (S <= PLAN_MAX_SLOTS slots): at one AR row the torch
plan is ~27 small kernels (a radix sort, scans, searchsorted, index arithmetic; ~30 us of a 0.33 ms layer on the
H200, s10 call B's profile). One program: the stable sort as a bitonic sort of unique keys expert * S2 + slot, each
expert's segment by a binary search over the sorted keys, the block counts' scan, each block's expert by a binary
search over the block ends. Same tensors as block_plan, bit for bit (tests/test_moe_experts.py)."""
from __future__ import annotations

import torch

from .moe_plan import BlockPlan, max_blocks
from .triton_base import tl, triton
from .triton_base import jit as _jit

PLAN_MAX_SLOTS = 1024     # one program sorts S2 = next_pow2(S) keys in registers; larger S takes the torch plan
PLAN_MAX_EXPERTS = 1024   # and searches once per expert lane (E2 = next_pow2(E) lanes)


@_jit()
def _search(BASE, n, want, LOG2: tl.constexpr, RIGHT: tl.constexpr):
    """Per lane: the number of entries of the ascending BASE[0:n] that are < want (<= want with RIGHT)."""
    lo = tl.zeros_like(want)
    hi = tl.zeros_like(want) + n
    for _ in tl.static_range(LOG2 + 1):
        mid = (lo + hi) // 2
        v = tl.load(BASE + mid, mask=mid < hi, other=0)
        go = (v <= want) if RIGHT else (v < want)
        step = (mid < hi) & go
        lo = tl.where(step, mid + 1, lo)
        hi = tl.where((mid < hi) & ~go, mid, hi)
    return lo


@_jit()
def _plan_kernel(FLAT, ORDER, TOKEN, BLK_E, BLK_R0, BLK_R1, KEYS, SEG0, SEG1, BEND, S, E, NB, k,
                 BM: tl.constexpr, S2: tl.constexpr, LOG_S2: tl.constexpr, E2: tl.constexpr,
                 LOG_E2: tl.constexpr, NB2: tl.constexpr):
    slot = tl.arange(0, S2)
    e = tl.load(FLAT + slot, mask=slot < S, other=0).to(tl.int32)
    key = tl.where(slot < S, e * S2 + slot, 2147483647)          # unique: ascending = stable by expert
    key = tl.sort(key)
    tl.store(KEYS + slot, key, mask=slot < S)
    order = key % S2
    tl.store(ORDER + slot, order.to(tl.int64), mask=slot < S)
    tl.store(TOKEN + slot, order // k, mask=slot < S)
    tl.debug_barrier()                                           # KEYS visible to every lane
    ex = tl.arange(0, E2)
    s0 = _search(KEYS, S, ex * S2, LOG_S2, False)                # first sorted position of expert ex
    s1 = _search(KEYS, S, ex * S2 + (S2 - 1), LOG_S2, True)      # one past its last
    nblk = (s1 - s0 + BM - 1) // BM
    bend = tl.cumsum(nblk, 0)                                    # block index after expert ex's last
    tl.store(SEG0 + ex, s0 - (bend - nblk) * BM, mask=ex < E)    # r0 of block b of ex = this + b * BM
    tl.store(SEG1 + ex, s1, mask=ex < E)
    tl.store(BEND + ex, bend, mask=ex < E)
    tl.debug_barrier()
    b = tl.arange(0, NB2)
    be = _search(BEND, E, b, LOG_E2, True)                       # expert of block b (E: unused tail)
    used = (be < E) & (b < NB)
    bc = tl.minimum(be, E - 1)
    r0 = tl.load(SEG0 + bc, mask=b < NB, other=0) + b * BM
    r1 = tl.load(SEG1 + bc, mask=b < NB, other=0)
    tl.store(BLK_E + b, tl.where(used, be, -1), mask=b < NB)
    tl.store(BLK_R0 + b, r0, mask=b < NB)
    tl.store(BLK_R1 + b, r1, mask=b < NB)


def block_plan(flat: torch.Tensor, n_experts: int, bm: int, k: int,
               warps: int = 4) -> tuple[BlockPlan, torch.Tensor]:
    """flat [S] expert of each slot, S <= PLAN_MAX_SLOTS -> (moe_plan.block_plan's table, token [S] int32 =
    order // k), in one launch of one program of `warps` warps."""
    S, dev = flat.shape[0], flat.device
    nb = max_blocks(S, n_experts, bm)
    s2, e2 = triton.next_power_of_2(max(S, 2)), triton.next_power_of_2(max(n_experts, 2))
    order = torch.empty(S, dtype=torch.int64, device=dev)
    token = torch.empty(S, dtype=torch.int32, device=dev)
    blk = torch.empty(3, nb, dtype=torch.int32, device=dev)
    scratch = torch.empty(S + 3 * n_experts, dtype=torch.int32, device=dev)
    keys, seg0, seg1, bend = scratch.split((S, n_experts, n_experts, n_experts))
    _plan_kernel[(1,)](flat.contiguous(), order, token, blk[0], blk[1], blk[2], keys, seg0, seg1, bend, S, n_experts,
                       nb, k, BM=bm, S2=s2, LOG_S2=s2.bit_length() - 1, E2=e2, LOG_E2=e2.bit_length() - 1,
                       NB2=triton.next_power_of_2(max(nb, 2)), num_warps=warps)
    return BlockPlan(order, blk[0], blk[1], blk[2]), token
