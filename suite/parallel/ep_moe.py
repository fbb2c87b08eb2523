"""Expert-parallel MoE over all-to-all: each rank routes its shard of the tokens, dispatches every (token, k)
slot to the rank owning its expert — in fixed-capacity buffers (equal splits: no split sizes on the host, so
the step stays capturable) or at exact sizes (split sizes through the host) — runs its local experts, and
combines the returned outputs in ascending expert order, the order moe.experts_loop / experts_grouped add
them on the CPU (float64 / float32 bit for bit).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kdbench.model.moe import _grouped_available, route, swiglu
from kdbench.references.model_config import ModelConfig

from .comm import Comm
from .messages import capacity


def _dispatch_plan(idx: torch.Tensor, world: int, el: int):
    """idx [N, k] global experts -> (dest [N*k], pos [N*k]): the rank and the buffer slot of every (token, j)
    slot, slots packed per rank in token order (so an expert sees its tokens in ascending order)."""
    dest = (idx // el).flatten()                                         # [N*k]
    onehot = (dest[:, None] == torch.arange(world, device=idx.device)).to(torch.int64)   # [N*k, world]
    pos = (onehot.cumsum(0) - 1).gather(1, dest[:, None]).squeeze(1)     # running count per destination
    return dest, pos


def _local_experts(rows, eid, counts, w1, w2, w3, grouped: bool) -> torch.Tensor:
    """rows [S, d] received slots, eid [S] local expert or -1 (empty), counts [E/n] valid slots per expert.
    Returns [S, d] expert outputs (0 in empty slots)."""
    valid = eid >= 0
    if grouped:
        key = torch.where(valid, eid, w1.shape[0])                      # empty slots sort after every expert
        order = torch.sort(key, stable=True).indices
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = rows[order]
        h = F.silu(torch._grouped_mm(xs, w1.transpose(1, 2), offs)) * torch._grouped_mm(xs, w3.transpose(1, 2), offs)
        out_sorted = torch._grouped_mm(h, w2.transpose(1, 2), offs)      # rows past offs[-1]: unspecified
        out = torch.empty_like(out_sorted).index_copy_(0, order, out_sorted)
        return out.masked_fill(~valid[:, None], 0.0)
    out = torch.zeros_like(rows)
    for e in torch.unique(eid[valid]).tolist():                          # host sync: the loop path, as moe.py
        sel = torch.nonzero(eid == e).squeeze(1)                         # ascending: source rank, then token
        out[sel] = swiglu(rows[sel], w1[e], w2[e], w3[e])
    return out


def _padded_exchange(x, idx, comm: Comm, el: int, k: int, experts) -> torch.Tensor:
    """Fixed-capacity dispatch + combine (no host sync). Returns [N*k, d] expert outputs in slot order."""
    n, d = x.shape
    world = comm.world
    cap = capacity(n, k, el)
    dest, pos = _dispatch_plan(idx, world, el)
    token = torch.arange(n * k, device=x.device) // k
    send_x = x.new_zeros(world, cap, d)
    send_x[dest, pos] = x[token]
    send_e = torch.full((world, cap), -1, dtype=torch.int64, device=x.device)
    send_e[dest, pos] = (idx % el).flatten()
    counts = torch.zeros(world * el, dtype=torch.int32, device=x.device)        # [world, E/n] slots per expert
    counts.scatter_add_(0, idx.flatten(), torch.ones(n * k, dtype=torch.int32, device=x.device))
    recv_x = comm.all_to_all(send_x)                                             # [world(src), cap, d]
    recv_e = comm.all_to_all(send_e)
    recv_counts = comm.all_to_all(counts.view(world, el)).sum(0)                 # [E/n] over all sources
    out = _local_experts(recv_x.view(world * cap, d), recv_e.flatten(), recv_counts, *experts)
    back = comm.all_to_all(out.view(world, cap, d))                              # [world(dest), cap, d]
    return back[dest, pos]


def _exact_exchange(x, idx, comm: Comm, el: int, k: int, experts) -> torch.Tensor:
    """Exact-size dispatch + combine: split sizes go through the host (one sync per MoE layer), so only the
    slots routed are sent. Same row order at every expert as the padded exchange (source, then token)."""
    n, d = x.shape
    world = comm.world
    dest = (idx // el).flatten()
    order = torch.sort(dest, stable=True).indices                                # by destination, token order
    send_counts = torch.zeros(world, dtype=torch.int64, device=x.device).scatter_add_(0, dest, torch.ones_like(dest))
    recv_counts = comm.all_to_all(send_counts.view(world, 1)).view(world)
    send, recv = send_counts.tolist(), recv_counts.tolist()                      # the host sync
    recv_x = comm.all_to_all_v(x[order // k], send, recv)
    recv_e = comm.all_to_all_v((idx % el).flatten()[order], send, recv)
    per_expert = torch.zeros(el, dtype=torch.int32, device=x.device).scatter_add_(
        0, recv_e, torch.ones_like(recv_e, dtype=torch.int32))
    out = _local_experts(recv_x, recv_e, per_expert, *experts)
    back = comm.all_to_all_v(out, recv, send)                                    # rows in `order`
    return torch.empty_like(back).index_copy_(0, order, back)


def ep_experts(dispatch: str, x: torch.Tensor, w1: torch.Tensor) -> str:
    """The experts an EP rank runs for a dispatch mode: "grouped" for grouped, and for auto where torch._grouped_mm
    runs here; "loop" for every other mode (the Triton experts have no EP form). The single-process check compares
    against moe_forward with this same mode, not with what auto means there."""
    return "grouped" if dispatch == "grouped" or (dispatch == "auto" and _grouped_available(x, w1)) else "loop"


def ep_moe_forward(w: dict, cfg: ModelConfig, layer: int, x: torch.Tensor, comm: Comm, dispatch: str = "auto",
                   exact: bool = False) -> torch.Tensor:
    """x [N, d] this rank's tokens (N equal on every rank) -> routed + shared expert output [N, d].
    exact=False: fixed-capacity buffers (capturable, n x the bytes); True: exact split sizes (host sync)."""
    p = f"layers.{layer}."
    w1, w2, w3 = w[p + "experts.w1"], w[p + "experts.w2"], w[p + "experts.w3"]   # this rank's E/n experts
    n, d = x.shape
    el, k = w1.shape[0], cfg.n_experts_per_tok
    idx, weights = route(x, w[p + "gate"], w[p + "gate_bias"], cfg)            # [N, k] global ids
    grouped = ep_experts(dispatch, x, w1) == "grouped"
    exchange = _exact_exchange if exact else _padded_exchange
    out = exchange(x, idx, comm, el, k, (w1, w2, w3, grouped))                   # [N*k, d] slot order
    contrib = out.view(n, k, d) * weights.to(x.dtype)[..., None]
    order = torch.argsort(idx, dim=1)                                            # ascending expert id
    contrib = torch.gather(contrib, 1, order[..., None].expand(n, k, d))
    y = torch.zeros_like(x)
    for j in range(k):                                                           # ((0 + c_e1) + c_e2) + ...
        y = y + contrib[:, j]
    if cfg.n_shared_experts > 0:
        y = y + swiglu(x, w[p + "shared.w1"], w[p + "shared.w2"], w[p + "shared.w3"])
    return y
