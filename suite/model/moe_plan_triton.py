"""moe_plan.block_plan in Triton launches (no torch ops, no host sync): at one AR row the torch plan is ~27 small
kernels (a radix sort, scans, searchsorted, index arithmetic; ~30 us of a 0.33 ms layer on the H200, s10 call B's
profile). Decode sizes (S <= PLAN_MAX_SLOTS slots), one program: the stable sort as a bitonic sort of unique keys
expert * S2 + slot, each expert's segment by a binary search over the sorted keys, the block counts' scan, each
block's expert by a binary search over the block ends. Larger S, three launches (a counting sort, stable by
construction): each chunk of CHUNK slots counts its experts and ranks each slot among the chunk's earlier slots of
its expert; one program scans the counts over chunks (each chunk's first position per expert) and builds the block
table; each chunk then places its slots. Same tensors as block_plan, bit for bit (tests/test_moe_experts.py)."""
from __future__ import annotations

import torch

from .moe_plan import BlockPlan, max_blocks
from .moe_plan import block_plan as torch_block_plan
from .triton_base import tl, triton
from .triton_base import jit as _jit

PLAN_MAX_SLOTS = 1024     # one program sorts S2 = next_pow2(S) keys in registers; larger S takes the chunked plan
PLAN_MAX_EXPERTS = 1024   # and searches once per expert lane (E2 = next_pow2(E) lanes); so does the chunked plan
CHUNK = 128               # slots per program of the chunked plan: its rank compares CHUNK x CHUNK pairs in registers
SCAN_ROWS = 8             # chunks per step of the chunked plan's scan ([SCAN_ROWS, E2] counts at once)
TABLE_LANES = 1024        # blocks per step of the chunked plan's table walk


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
    _table(s0, s1, SEG0, SEG1, BEND, BLK_E, BLK_R0, BLK_R1, E, NB, BM, E2, LOG_E2, NB2)


@_jit()
def _table(s0, s1, SEG0, SEG1, BEND, BLK_E, BLK_R0, BLK_R1, E, NB, BM: tl.constexpr, E2: tl.constexpr,
           LOG_E2: tl.constexpr, LANES: tl.constexpr):
    """The block table from each expert's segment [s0, s1) of the sorted slots ([E2] lanes; lanes >= E empty):
    expert e's blocks of BM rows follow the earlier experts' blocks; LANES blocks per step."""
    ex = tl.arange(0, E2)
    nblk = (s1 - s0 + BM - 1) // BM
    bend = tl.cumsum(nblk, 0)                                    # block index after expert ex's last
    tl.store(SEG0 + ex, s0 - (bend - nblk) * BM, mask=ex < E)    # r0 of block b of ex = this + b * BM
    tl.store(SEG1 + ex, s1, mask=ex < E)
    tl.store(BEND + ex, bend, mask=ex < E)
    tl.debug_barrier()
    for b0 in range(0, NB, LANES):
        b = b0 + tl.arange(0, LANES)
        be = _search(BEND, E, b, LOG_E2, True)                   # expert of block b (E: unused tail)
        used = (be < E) & (b < NB)
        bc = tl.minimum(be, E - 1)
        r0 = tl.load(SEG0 + bc, mask=b < NB, other=0) + b * BM
        r1 = tl.load(SEG1 + bc, mask=b < NB, other=0)
        tl.store(BLK_E + b, tl.where(used, be, -1), mask=b < NB)
        tl.store(BLK_R0 + b, r0, mask=b < NB)
        tl.store(BLK_R1 + b, r1, mask=b < NB)


@_jit()
def _count_kernel(FLAT, CNT, RANK, S, E, CH: tl.constexpr, E2: tl.constexpr):
    """Chunk pid: CNT[pid, e] = how many of its slots go to expert e; RANK[slot] = how many of the chunk's earlier
    slots go to the slot's expert."""
    c = tl.program_id(0)
    i = tl.arange(0, CH)
    slot = c * CH + i
    live = slot < S                                              # only the last chunk has dead lanes, at its end
    e = tl.load(FLAT + slot, mask=live, other=0).to(tl.int32)
    ex = tl.arange(0, E2)
    tl.store(CNT + c * E + ex, tl.histogram(e, E2, mask=live), mask=ex < E)
    earlier = (e[None, :] == e[:, None]) & (i[None, :] < i[:, None])
    tl.store(RANK + slot, tl.sum(earlier.to(tl.int32), 1), mask=live)


@_jit()
def _scan_kernel(CNT, START, SEG0, SEG1, BEND, BLK_E, BLK_R0, BLK_R1, C, E, NB, BM: tl.constexpr,
                 E2: tl.constexpr, LOG_E2: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr):
    """One program: CNT[c, e] becomes chunk c's first rank among expert e's slots (in place: each element is read
    and written by one thread), START[e] expert e's first sorted position; then the block table."""
    ex = tl.arange(0, E2)
    rows = tl.arange(0, ROWS)
    run = tl.zeros([E2], dtype=tl.int32)
    for c0 in range(0, C, ROWS):
        at = (c0 + rows)[:, None] * E + ex[None, :]
        m = ((c0 + rows)[:, None] < C) & (ex[None, :] < E)
        cnt = tl.load(CNT + at, mask=m, other=0)
        tl.store(CNT + at, run[None, :] + tl.cumsum(cnt, 0) - cnt, mask=m)
        run += tl.sum(cnt, 0)
    s1 = tl.cumsum(run, 0)
    tl.store(START + ex, s1 - run, mask=ex < E)
    _table(s1 - run, s1, SEG0, SEG1, BEND, BLK_E, BLK_R0, BLK_R1, E, NB, BM, E2, LOG_E2, LANES)


@_jit()
def _place_kernel(FLAT, RANK, CNT, START, ORDER, TOKEN, S, E, k, CH: tl.constexpr):
    """Chunk pid: slot -> sorted position START[e] + CNT[pid, e] (the scanned ranks) + RANK[slot]."""
    c = tl.program_id(0)
    slot = c * CH + tl.arange(0, CH)
    live = slot < S
    e = tl.load(FLAT + slot, mask=live, other=0).to(tl.int32)
    pos = (tl.load(START + e, mask=live, other=0) + tl.load(CNT + c * E + e, mask=live, other=0)
           + tl.load(RANK + slot, mask=live, other=0))
    tl.store(ORDER + pos, slot.to(tl.int64), mask=live)
    tl.store(TOKEN + pos, slot // k, mask=live)


def block_plan(flat: torch.Tensor, n_experts: int, bm: int, k: int) -> tuple[BlockPlan, torch.Tensor]:
    """flat [S] expert of each slot -> (moe_plan.block_plan's table, token [S] int32 = order // k): one Triton launch
    up to PLAN_MAX_SLOTS slots, three above; torch's plan past PLAN_MAX_EXPERTS experts."""
    if n_experts > PLAN_MAX_EXPERTS:
        return torch_plan(flat, n_experts, bm, k)
    return (one_program if flat.shape[0] <= PLAN_MAX_SLOTS else chunked)(flat, n_experts, bm, k)


def torch_plan(flat: torch.Tensor, n_experts: int, bm: int, k: int) -> tuple[BlockPlan, torch.Tensor]:
    """moe_plan.block_plan (torch ops, ~a dozen small launches) in the Triton plans' form: (table, token int32)."""
    plan = torch_block_plan(flat, n_experts, bm)
    return plan, (plan.order // k).to(torch.int32)


def _outputs(S: int, nb: int, dev) -> tuple:
    order = torch.empty(S, dtype=torch.int64, device=dev)
    token = torch.empty(S, dtype=torch.int32, device=dev)
    return order, token, torch.empty(3, nb, dtype=torch.int32, device=dev)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(n, 2))


def one_program(flat: torch.Tensor, n_experts: int, bm: int, k: int,
                warps: int = 8) -> tuple[BlockPlan, torch.Tensor]:
    """block_plan in one launch of one program of `warps` warps (it sorts next_pow2(S) keys in registers). 8 warps
    read 0.7-3.8 us faster than 4 from 64 to 1024 slots on the H200, 0.2 us slower at 8 (plans/0015 "Session 15");
    the MoE and batch-invariant GPU tests ran at 8 in session 16 (plans/0015 "Session 16")."""
    S, dev = flat.shape[0], flat.device
    nb = max_blocks(S, n_experts, bm)
    s2, e2 = _pow2(S), _pow2(n_experts)
    order, token, blk = _outputs(S, nb, dev)
    scratch = torch.empty(S + 3 * n_experts, dtype=torch.int32, device=dev)
    keys, seg0, seg1, bend = scratch.split((S, n_experts, n_experts, n_experts))
    _plan_kernel[(1,)](flat.contiguous(), order, token, blk[0], blk[1], blk[2], keys, seg0, seg1, bend, S, n_experts,
                       nb, k, BM=bm, S2=s2, LOG_S2=s2.bit_length() - 1, E2=e2, LOG_E2=e2.bit_length() - 1,
                       NB2=_pow2(nb), num_warps=warps)
    return BlockPlan(order, blk[0], blk[1], blk[2]), token


def chunked(flat: torch.Tensor, n_experts: int, bm: int, k: int) -> tuple[BlockPlan, torch.Tensor]:
    """block_plan in three launches for any S (a counting sort over chunks of CHUNK slots)."""
    S, dev, E = flat.shape[0], flat.device, n_experts
    nb, chunks, e2 = max_blocks(S, E, bm), triton.cdiv(max(S, 1), CHUNK), _pow2(E)
    order, token, blk = _outputs(S, nb, dev)
    scratch = torch.empty(S + chunks * E + 4 * E, dtype=torch.int32, device=dev)
    rank, cnt, start, seg0, seg1, bend = scratch.split((S, chunks * E, E, E, E, E))
    flat = flat.contiguous()
    _count_kernel[(chunks,)](flat, cnt, rank, S, E, CH=CHUNK, E2=e2, num_warps=4)
    _scan_kernel[(1,)](cnt, start, seg0, seg1, bend, blk[0], blk[1], blk[2], chunks, E, nb, BM=bm, E2=e2,
                       LOG_E2=e2.bit_length() - 1, ROWS=SCAN_ROWS, LANES=TABLE_LANES, num_warps=8)
    _place_kernel[(chunks,)](flat, rank, cnt, start, order, token, S, E, k, CH=CHUNK, num_warps=4)
    return BlockPlan(order, blk[0], blk[1], blk[2]), token
