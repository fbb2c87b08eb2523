"""The chain policy's tree build on the device (no host synchronization, so a chain step can be captured as a
CUDA graph): node i = the argmax draft token at depth i - 1, in the layout and padding of torch_ops.tree_build
with build_chain (backends/types.py). Used by every non-torch stage backend for policy "chain" (stages.py)."""
from __future__ import annotations

import torch

from .types import TreeBatch


def pack_bits(vis: torch.Tensor) -> torch.Tensor:
    """[..., N] bool -> [..., ceil(N / 64)] int64 words holding uint64 bit patterns (bit j of word j // 64)."""
    N = vis.shape[-1]
    W = -(-N // 64)
    padded = torch.nn.functional.pad(vis.to(torch.int64), (0, W * 64 - N)).view(*vis.shape[:-1], W, 64)
    shifts = torch.arange(64, device=vis.device, dtype=torch.int64)
    return (padded << shifts).sum(-1)   # distinct bits: the sum is the OR (bit 63 wraps to the sign, as uint64)


def chain_anc(rows: int, batch: int, device) -> torch.Tensor:
    """[batch, rows, W] int64 ancestor bits of a chain of `rows` nodes: row i sees rows 0..i (the engine's layout)."""
    t = torch.arange(rows, device=device)
    return pack_bits((t[None, :] <= t[:, None]).expand(batch, rows, rows))


def build_chain(draft_logits: torch.Tensor, budgets: torch.Tensor, root_tokens: torch.Tensor,
                past_lens: torch.Tensor, max_budget: int) -> TreeBatch:
    """draft_logits [B, L, V]; budgets [B] int32 in [0, max_budget], max_budget <= L; root_tokens [B] int64;
    past_lens [B] int32 -> N = max_budget + 1 rows per request. Ties go to the smaller token id (argmax's first
    maximum, the reference's order). top_lp / top_tok hold torch.topk's K = min(max_budget, V) per depth (exact
    ties in topk order: nothing in the engine reads them)."""
    B, L, V = draft_logits.shape
    if max_budget > L:
        raise ValueError(f"chain build: max_budget {max_budget} > draft depth {L}")
    dev, N = draft_logits.device, max_budget + 1
    x = draft_logits.float()
    lse = torch.logsumexp(x, dim=-1)                                      # [B, L]
    tok = x.argmax(dim=-1)                                                # [B, L] first maximum
    lp = x.gather(-1, tok[..., None])[..., 0] - lse                       # [B, L] float32, as topk_logprobs
    i = torch.arange(N, device=dev)[None, :]                              # [1, N] row = depth
    n = budgets.to(torch.int64)[:, None]                                  # [B, 1] chain nodes, root excluded
    real, node = i <= n, (i >= 1) & (i <= n)
    at = (i - 1).clamp(min=0).expand(B, N)
    tokens = torch.where(node, tok.gather(1, at), root_tokens.to(torch.int64)[:, None])
    parents = torch.where(real, i - 1, 0).to(torch.int32)
    depths = torch.where(real, i, 1).expand(B, N).clone()
    depths[:, 0] = 0
    cum = torch.cumsum(lp.double(), dim=-1)                               # log Q of each chain prefix
    scores = torch.where(node, cum.gather(1, at), torch.where(i == 0, 0.0, float("-inf")).double())
    r, c = i[0][:, None], i[0][None, :]                                   # [N, 1] row, [1, N] key
    vis = torch.where(real[:, :, None], (c <= r)[None], ((c == 0) | (c == r))[None])   # [B, N, N]
    top_lp, top_tok = torch.topk(x, min(max_budget, V), dim=-1, sorted=True)
    return TreeBatch(tokens=tokens, parents=parents, depths=depths.to(torch.int32),
                     positions=past_lens.to(torch.int64)[:, None] + depths,
                     anc=pack_bits(vis), first_child=torch.where(i < n, i + 1, -1).to(torch.int32),
                     next_sibling=torch.full((B, N), -1, dtype=torch.int32, device=dev),
                     n_nodes=(n[:, 0] + 1).to(torch.int32), top_lp=top_lp - lse[..., None], top_tok=top_tok,
                     scores=scores)
