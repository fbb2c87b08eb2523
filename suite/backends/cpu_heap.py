"""tree_build with the C++ CPU heap (kdbench._cpu_heap over csrc/tree_build_cpu.h): top-K and logsumexp on
the logits' device, one device-to-host copy, Algorithm 1 in C++ with the GIL released, the padded rows back
on the device. Same signature and TreeBatch as torch_ops.tree_build (DDTree policy only)."""
from __future__ import annotations

import numpy as np
import torch

from kdbench import _cpu_heap

from .torch_ops import topk_logprobs
from .types import TreeBatch


def build_padded(top_lp: np.ndarray, top_tok: np.ndarray, budgets, roots, n_max: int,
                 n_threads: int = 1) -> dict[str, np.ndarray]:
    """top_lp [B, L, K] float32|float64, top_tok [B, L, K], budgets [B], roots [B] -> pad_tree_arrays' keys
    (visibility excepted) with a leading B axis: [B, N] rows, bitmask [B, N, W] uint64, n_nodes [B].
    Each request uses K = min(K, budget) (Lemma 1), as torch_ops.build_ddtree. ValueError on bad input."""
    lp = np.asarray(top_lp)
    if lp.dtype not in (np.float32, np.float64):
        raise ValueError(f"top_lp must be float32 or float64, got {lp.dtype}")
    return _cpu_heap.build(np.ascontiguousarray(lp), np.ascontiguousarray(top_tok, dtype=np.int64),
                           np.ascontiguousarray(budgets, dtype=np.int64), np.ascontiguousarray(roots, dtype=np.int64),
                           int(n_max), int(n_threads))


def _to_host(top_lp: torch.Tensor, top_tok: torch.Tensor, budgets: torch.Tensor, root_tokens: torch.Tensor):
    """One copy: top_tok, the log-probs widened to float64 (exact) as int64 bits, budgets and roots packed
    into one int64 tensor. Returns (lp [B, L, K] float64, tok [B, L, K] int64, budgets [B], roots [B])."""
    n, b = top_tok.numel(), budgets.numel()
    if root_tokens.numel() != b or b != top_tok.shape[0]:
        raise ValueError(f"budgets {tuple(budgets.shape)} and root_tokens {tuple(root_tokens.shape)} must have "
                         f"B = {top_tok.shape[0]} entries")
    packed = torch.cat([top_tok.reshape(-1), top_lp.double().view(torch.int64).reshape(-1),
                        budgets.to(torch.int64).reshape(-1), root_tokens.to(torch.int64).reshape(-1)])
    host = packed.cpu().numpy()
    shape = tuple(top_tok.shape)
    return (host[n:2 * n].view(np.float64).reshape(shape), host[:n].reshape(shape),
            host[2 * n:2 * n + b], host[2 * n + b:])


def tree_build(draft_logits: torch.Tensor, budgets: torch.Tensor, root_tokens: torch.Tensor,
               past_lens: torch.Tensor, max_budget: int, n_threads: int = 1) -> TreeBatch:
    """DDTree build for a batch, N = max_budget + 1 rows per request (types.py has the layout).

    draft_logits [B, L, V] float; budgets [B] int (each in [0, max_budget]); root_tokens [B] int64;
    past_lens [B] int. n_threads > 1 splits the requests over that many std::threads. Synchronizes the host.
    """
    if draft_logits.ndim != 3 or max_budget < 0:
        raise ValueError(f"need draft_logits [B, L, V] and max_budget >= 0, got {tuple(draft_logits.shape)}, "
                         f"{max_budget}")
    dev = draft_logits.device
    top_lp, top_tok = topk_logprobs(draft_logits, max_budget)           # [B, L, K] f32, i64 on dev
    lp_h, tok_h, budgets_h, roots_h = _to_host(top_lp, top_tok, budgets, root_tokens)
    rows = build_padded(lp_h, tok_h, budgets_h, roots_h, max_budget + 1, n_threads)
    dev_t = lambda key, dtype: torch.from_numpy(rows[key]).to(device=dev, dtype=dtype)  # noqa: E731
    depths = dev_t("depths", torch.int32)
    return TreeBatch(
        tokens=dev_t("tokens", torch.int64), parents=dev_t("parents", torch.int32), depths=depths,
        positions=past_lens.to(torch.int64)[:, None] + depths,
        anc=torch.from_numpy(rows["bitmask"].view(np.int64)).to(dev),   # [B, N, W] uint64 bits as int64
        first_child=dev_t("first_child", torch.int32), next_sibling=dev_t("next_sibling", torch.int32),
        n_nodes=dev_t("n_nodes", torch.int32), top_lp=top_lp, top_tok=top_tok,
        scores=dev_t("scores", torch.float64))
