"""The torch backend of the four stages (tree_build, tree_accept greedy/sampled, kv_compact), with the
signatures of the CUDA wrappers (csrc/torch_ops.h). tree_build is the "serving stack" path: top-K and
logsumexp on the device, one copy to the host, the reference heap per request, padded rows back.
Everything but tree_build is free of host synchronization (CUDA-graph capturable).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from kdbench.references.tree_build import Tree, build_tree_from_topk, pad_tree_arrays

from .types import AcceptResult, TreeBatch

BuildOne = Callable[[np.ndarray, np.ndarray, int, int], Tree]  # (top_lp [L,K] f64, top_tok [L,K], budget, root)


# ------------------------------------------------------------------------------------------ tree_build

def topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, V] -> (top_lp [B, L, K] float32, top_tok [B, L, K] int64), K = min(k, V).

    Order as the reference: logit descending, equal logits by smaller token id, also at the cut (a tie
    straddling the K-th value makes that row fall back to a full stable sort). lp = logit - logsumexp
    over the whole vocabulary, in float32.
    """
    x = draft_logits.float()                                      # [B, L, V]
    K = min(k, x.shape[-1])
    lse = torch.logsumexp(x, dim=-1, keepdim=True)                # [B, L, 1]
    vals, idx = torch.topk(x, K, dim=-1, sorted=True)
    by_id = torch.sort(idx, dim=-1).indices                       # canonical order: id asc, then value desc
    vals, idx = vals.gather(-1, by_id), idx.gather(-1, by_id)
    by_val = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    vals, idx = vals.gather(-1, by_val), idx.gather(-1, by_val)
    if K > 0:
        thr = vals[..., K - 1:K]
        cut_tie = (x == thr).sum(-1) > (vals == thr).sum(-1)      # [B, L] tie straddles the cut
        if bool(cut_tie.any()):                                   # host sync; tree_build syncs anyway
            full = torch.sort(x[cut_tie], dim=-1, descending=True, stable=True)
            vals[cut_tie], idx[cut_tie] = full.values[:, :K], full.indices[:, :K]
    return vals - lse, idx


def build_ddtree(lp: np.ndarray, tok: np.ndarray, budget: int, root: int) -> Tree:
    """Algorithm 1 (K = min(budget, V) per depth; a wider top-K gives the same tree, Lemma 1)."""
    return build_tree_from_topk(lp[:, :max(budget, 0)], tok[:, :max(budget, 0)], budget, root)


def build_chain(lp: np.ndarray, tok: np.ndarray, budget: int, root: int) -> Tree:
    """Vanilla DFlash: the argmax chain, min(budget, L) deep."""
    n = min(budget, lp.shape[0])
    return build_tree_from_topk(lp[:n, :1], tok[:n, :1], n, root)


def width_capped(max_width: int) -> BuildOne:
    """Algorithm 1 with K = min(budget, V, max_width) candidate tokens per depth."""
    if max_width < 1:
        raise ValueError(f"max_width must be >= 1, got {max_width}")
    return lambda lp, tok, budget, root: build_ddtree(lp[:, :max_width], tok[:, :max_width], budget, root)


def static_kary(branching: tuple[int, ...]) -> BuildOne:
    """Every node at depth i has branching[i] children (the top tokens of depth i+1); the budget is ignored.
    Nodes in (-score, rank tuple) order with score a plain sum, as references.tree_build.build_static_kary."""
    branching = tuple(int(b) for b in branching)
    if not branching or min(branching) < 1:
        raise ValueError(f"branching must be a non-empty tuple of ints >= 1, got {branching}")

    def build(lp: np.ndarray, tok: np.ndarray, budget: int, root: int) -> Tree:
        if len(branching) > lp.shape[0] or max(branching) > lp.shape[1]:
            raise ValueError(f"branching {branching} needs depth <= L={lp.shape[0]} and width <= K={lp.shape[1]}")
        prefixes = [(float(sum(lp[i, r] for i, r in enumerate(ranks))), ranks)
                    for d in range(1, len(branching) + 1)
                    for ranks in np.ndindex(*branching[:d])]
        prefixes.sort(key=lambda e: (-e[0], e[1]))
        index, cols = {(): 0}, ([root], [-1], [0], [-1], [0.0])
        for i, (score, ranks) in enumerate(prefixes, start=1):
            index[ranks] = i
            for col, v in zip(cols, (tok[len(ranks) - 1, ranks[-1]], index[ranks[:-1]], len(ranks), ranks[-1], score)):
                col.append(v)
        i64 = lambda c: np.array(c, dtype=np.int64)  # noqa: E731
        return Tree(i64(cols[0]), i64(cols[1]), i64(cols[2]), i64(cols[3]), np.array(cols[4], dtype=np.float64))
    return build


def static_kary_size(branching: tuple[int, ...]) -> int:
    """Nodes of the static tree, root excluded: sum over depths of the product of the widths above."""
    return sum(math.prod(branching[:d]) for d in range(1, len(branching) + 1))


def tree_build(draft_logits: torch.Tensor, budgets: torch.Tensor, root_tokens: torch.Tensor,
               past_lens: torch.Tensor, max_budget: int, build_one: BuildOne = build_ddtree) -> TreeBatch:
    """DDTree build for a batch: N = max_budget + 1 rows per request (types.py has the layout).

    draft_logits [B, L, V] float; budgets [B] int32 (each in [0, max_budget]); root_tokens [B] int64;
    past_lens [B] int32. build_one picks the policy (build_ddtree, build_chain, width_capped(w),
    static_kary(b)). Synchronizes the host (the documented exception of the torch backend).
    """
    B, L, V = draft_logits.shape
    dev, N = draft_logits.device, max_budget + 1
    top_lp, top_tok = topk_logprobs(draft_logits, max_budget)
    lp_h, tok_h = top_lp.cpu().double().numpy(), top_tok.cpu().numpy()
    budgets_h, roots_h = budgets.tolist(), root_tokens.tolist()
    if any(not 0 <= b <= max_budget for b in budgets_h):
        raise ValueError(f"budgets {budgets_h} must lie in [0, max_budget={max_budget}]")
    rows = [pad_tree_arrays(build_one(lp_h[b], tok_h[b], budgets_h[b], roots_h[b]), N) for b in range(B)]
    stack = lambda key: np.stack([r[key] for r in rows])  # noqa: E731
    host = lambda key, dtype: torch.from_numpy(stack(key)).to(dtype)  # noqa: E731
    depths = host("depths", torch.int32).to(dev)
    return TreeBatch(
        tokens=host("tokens", torch.int64).to(dev), parents=host("parents", torch.int32).to(dev), depths=depths,
        positions=past_lens.to(torch.int64)[:, None] + depths,
        anc=torch.from_numpy(stack("bitmask").view(np.int64)).to(dev),
        first_child=host("first_child", torch.int32).to(dev), next_sibling=host("next_sibling", torch.int32).to(dev),
        n_nodes=host("n_nodes", torch.int32).to(dev), top_lp=top_lp, top_tok=top_tok,
        scores=host("scores", torch.float64).to(dev))


# ----------------------------------------------------------------------------------------- tree_accept

def parents_from_lcrs(first_child: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """[B, N] parent of each node (-1 for the root and unlinked padding rows) from the LCRS links.

    A first child's parent is its linker; a later sibling inherits its left sibling's parent, resolved by
    pointer jumping (ceil(log2 N) + 1 fixed rounds, no host sync).
    """
    B, N = first_child.shape
    dev = first_child.device
    src = torch.arange(N, device=dev).expand(B, N)
    prev = torch.full((B, N + 1), -1, dtype=torch.int64, device=dev)   # column N collects the -1 links
    is_first = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)
    fc = torch.where(first_child >= 0, first_child.to(torch.int64), N)
    ns = torch.where(next_sibling >= 0, next_sibling.to(torch.int64), N)
    prev.scatter_(1, fc, src)
    is_first.scatter_(1, fc, True)
    prev.scatter_(1, ns, src)
    prev, is_first = prev[:, :N], is_first[:, :N]
    parent = torch.where(is_first, prev, -1)
    done = is_first | (prev < 0)
    ptr = prev.clamp(min=0)                                             # pending: a left sibling
    for _ in range(math.ceil(math.log2(max(N, 2))) + 1):
        adopt = ~done & done.gather(1, ptr)
        parent = torch.where(adopt, parent.gather(1, ptr), parent)
        done = done | adopt
        ptr = torch.where(done, ptr, ptr.gather(1, ptr))
    return parent


def _walk(tokens, parent, n_nodes, target_tokens, max_depth: int) -> AcceptResult:
    """Greedy walk for the batch: move to the child of cur whose token is target_tokens[cur]."""
    B, N = tokens.shape
    dev = tokens.device
    valid = torch.arange(N, device=dev)[None, :] < n_nodes.to(torch.int64)[:, None]
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    accepted = torch.full((B, max_depth + 1), -1, dtype=torch.int32, device=dev)
    accepted[:, 0] = 0
    active = torch.ones(B, dtype=torch.bool, device=dev)
    for d in range(1, max_depth + 1):
        want = target_tokens.gather(1, cur[:, None])                    # [B, 1]
        match = (parent == cur[:, None]) & (tokens == want) & valid     # [B, N], at most one per row
        found = match.any(dim=1) & active
        nxt = match.to(torch.int32).argmax(dim=1)
        cur = torch.where(found, nxt, cur)
        accepted[:, d] = torch.where(found, nxt, -1).to(torch.int32)
        active = found
    accept_len = (accepted >= 0).sum(dim=1, dtype=torch.int32)
    return AcceptResult(accepted, accept_len, target_tokens.gather(1, cur[:, None])[:, 0].to(torch.int64))


def tree_accept_greedy(tokens, first_child, next_sibling, n_nodes, target_tokens, max_depth: int) -> AcceptResult:
    """tokens [B, N] int64, LCRS links [B, N] int32, n_nodes [B] int32, target_tokens [B, N] int64."""
    parent = parents_from_lcrs(first_child, next_sibling)
    return _walk(tokens, parent, n_nodes, target_tokens.to(torch.int64), max_depth)


def sample_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs [..., V] (unnormalised, >= 0), uniforms [...] in [0, 1) -> [...] int64: the smallest j with
    u * c[V-1] < c[j], c = float64 running sum (the reference rule). Memory: a float64 copy of probs."""
    c = torch.cumsum(probs.to(torch.float64), dim=-1)                   # [..., V]
    t = (uniforms.to(torch.float64) * c[..., -1])[..., None]
    j = torch.searchsorted(c.contiguous(), t.contiguous(), right=True)[..., 0]
    return j.clamp_(max=probs.shape[-1] - 1)


def tree_accept_sampled(tokens, first_child, next_sibling, n_nodes, target_probs, uniforms,
                        max_depth: int) -> AcceptResult:
    """One inverse-CDF target sample per node (target_probs [B, N, V], uniforms [B, N] float64), then the
    greedy walk over those samples (lossless; notes/ddtree.md §4.2). Returns them in .sampled."""
    sampled = sample_inverse_cdf(target_probs, uniforms)                # [B, N]
    res = tree_accept_greedy(tokens, first_child, next_sibling, n_nodes, sampled, max_depth)
    return res._replace(sampled=sampled)


# ------------------------------------------------------------------------------------------ kv_compact

def kv_compact(cache: torch.Tensor, past_lens: torch.Tensor, accepted: torch.Tensor,
               accept_len: torch.Tensor) -> None:
    """In place: row past_len + accepted[b, k] moves to past_len + k for k < accept_len[b].

    cache [layers, B, S, D] contiguous; accepted [B, A] int32 (root first, -1 pad). All sources are read
    (index_select) before any write (index_copy_). Slots k >= accept_len repeat the last valid pair (an
    identical write) or, when accept_len is 0, copy row past_len onto itself.
    """
    layers, B, S, D = cache.shape
    A = accepted.shape[1]
    dev = cache.device
    k = torch.arange(A, device=dev)[None, :]
    last = (accept_len.to(torch.int64) - 1).clamp(min=0)[:, None]        # [B, 1]
    k_eff = torch.minimum(k, last)                                     # [B, A]
    acc = accepted.to(torch.int64).gather(1, k_eff).clamp(min=0)
    acc = torch.where(accept_len[:, None] > 0, acc, 0)
    base = torch.arange(B, device=dev)[:, None] * S + past_lens.to(torch.int64)[:, None]
    flat = cache.view(layers, B * S, D)
    rows = flat.index_select(1, (base + acc).flatten())                # [layers, B*A, D]
    flat.index_copy_(1, (base + k_eff).flatten(), rows)
