"""Device-side dispatch plan of the routed experts (no host sync, so it can sit in a CUDA graph): (token, k)
slots sorted by expert, each expert's segment cut into row blocks of bm slots. The Triton kernels of
moe_triton.py and invariant_triton.py walk this table (both build the same tensors with moe_plan_triton's Triton
launches); emulate() walks it in torch for CPU tests.
with_shared() turns the shared expert into one more slot per token (expert index E, weight 1), so the same
launches run it beside the routed experts (plans/0015, "The shared expert in the expert launches").
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class BlockPlan(NamedTuple):
    order: torch.Tensor   # [S] int64: the slot (token * k + j) at each sorted position
    blk_e: torch.Tensor   # [nb] int32: expert of each block; -1 for the unused tail of the static bound
    blk_r0: torch.Tensor  # [nb] int32: first sorted position of the block
    blk_r1: torch.Tensor  # [nb] int32: end of the block's expert segment (rows r0 .. min(r0 + bm, r1))


def max_blocks(slots: int, n_experts: int, bm: int) -> int:
    """A static bound on sum_e ceil(count_e / bm): each touched expert adds at most one partial block and at
    most min(E, S) experts are touched. Depends on shapes only, never on the routing (graph capture)."""
    return min(n_experts, slots) + slots // bm


def block_plan(flat: torch.Tensor, n_experts: int, bm: int) -> BlockPlan:
    """flat [S] expert of each slot (any int dtype) -> the block table. Sorted stably, so slots of one expert
    keep ascending slot order; counts by scatter_add (bincount would sync with the host)."""
    flat = flat.to(torch.int64)
    S = flat.shape[0]
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(n_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat,
                                                                                         torch.ones_like(flat))
    seg_end = torch.cumsum(counts, 0)
    nblk = (counts + bm - 1) // bm
    blk_end = torch.cumsum(nblk, 0)                                  # [E] block index after expert e's last
    pid = torch.arange(max_blocks(S, n_experts, bm), device=flat.device)
    e = torch.searchsorted(blk_end, pid, right=True)                 # expert of block pid (E: unused)
    ec = e.clamp(max=n_experts - 1)
    r0 = seg_end[ec] - counts[ec] + (pid - (blk_end[ec] - nblk[ec])) * bm
    blk_e = torch.where(e < n_experts, e, -1).to(torch.int32)
    return BlockPlan(order, blk_e, r0.to(torch.int32), seg_end[ec].to(torch.int32))


def with_shared(idx: torch.Tensor, weights: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """idx / weights [N, k] -> [N, k + 1]: slot k of every token is the shared expert (index n_experts, weight 1),
    last, so the fixed-order sum over slots adds it after the routed ones (as references/moe.py does)."""
    n = idx.shape[0]
    sh = torch.full((n, 1), n_experts, dtype=idx.dtype, device=idx.device)
    return torch.cat([idx, sh], 1), torch.cat([weights, torch.ones_like(weights[:, :1])], 1)


def shared_fits(shared: tuple, experts: tuple) -> bool:
    """The shared expert (w1, w2, w3) can run as expert E of the routed launches: each is one routed expert's shape,
    dtype and layout (experts: the stacked w1 [E, mi, d], w2 [E, d, mi], w3 [E, mi, d])."""
    return all(s.shape == w.shape[1:] and s.dtype == w.dtype and s.is_contiguous() for s, w in zip(shared, experts))


def emulate(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1, w2, w3, bm: int,
            shared: tuple | None = None) -> torch.Tensor:
    """What the Triton kernels compute, block by block from the plan, in torch (host loop; CPU tests and
    float64 checks of the plan): up/gate GEMM + SwiGLU per block, down GEMM times the slot's routing weight
    stored at the slot's own position, then the sum over k in fixed order. x [N, d], idx/weights [N, k];
    shared: the shared expert's (w1 [mi, d], w2 [d, mi], w3 [mi, d]), run as expert E (with_shared)."""
    E = w1.shape[0]
    if shared is not None:
        idx, weights = with_shared(idx, weights, E)
    N, k = idx.shape
    plan = block_plan(idx.reshape(-1), E + (shared is not None), bm)
    token = plan.order // k
    out = torch.full((N * k, x.shape[1]), float("nan"), dtype=torch.float64)   # NaN: a slot no block wrote
    for e, r0, r1 in zip(plan.blk_e.tolist(), plan.blk_r0.tolist(), plan.blk_r1.tolist()):
        if e < 0:
            continue
        m1, m2, m3 = shared if e == E else (w1[e], w2[e], w3[e])
        pos = torch.arange(r0, min(r0 + bm, r1))
        xs = x[token[pos]].double()
        g, u = xs @ m1.double().T, xs @ m3.double().T
        h = g * torch.sigmoid(g) * u
        slot = plan.order[pos]
        out[slot] = (h @ m2.double().T) * weights.reshape(-1)[slot, None].double()
    return out.view(N, k, -1).sum(1)
