"""The CUDA backend: thin wrappers over the kdbench_cuda extension with the torch backend's signatures
(suite/backends/torch_ops.py). Each raises ExtensionUnavailable, with the reason, when the extension cannot
be built or used here. Inputs must already have the contract's dtypes (csrc/torch_ops.h): no silent casts."""
from __future__ import annotations

import torch

from kdbench.backends.cuda_build import ExtensionUnavailable, load
from kdbench.backends.types import AcceptResult, TreeBatch

__all__ = ["ExtensionUnavailable", "kv_compact", "tree_accept_greedy", "tree_accept_sampled", "tree_build",
           "tree_build_topk", "tree_verify_mla",
           "prepare_tree_verify_mla", "prepare_tree_verify_mla_mma"]


def tree_build(draft_logits: torch.Tensor, budgets: torch.Tensor, root_tokens: torch.Tensor,
               past_lens: torch.Tensor, max_budget: int) -> TreeBatch:
    """draft_logits [B, L, V] f32|bf16, budgets [B] i32 (each in [0, max_budget]), root_tokens [B] i64,
    past_lens [B] i32 -> TreeBatch with N = max_budget + 1 rows (two launches, no host sync)."""
    return TreeBatch(*load().tree_build(draft_logits, budgets, root_tokens, past_lens, int(max_budget)))


def tree_build_topk(draft_logits: torch.Tensor, k: int,
                    splits: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The vocabulary pass alone: (top_lp [B, L, k] f32, top_tok [B, L, k] i64, lse [B, L] f32). splits: blocks
    per row, 0 = chosen for the device (one wave); tests force it to compare split and unsplit results."""
    top_lp, top_tok, lse = load().tree_build_topk(draft_logits, int(k), int(splits))
    return top_lp, top_tok, lse


def tree_accept_greedy(tokens: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor,
                       n_nodes: torch.Tensor, target_tokens: torch.Tensor, max_depth: int) -> AcceptResult:
    """tokens [B, N] i64, first_child / next_sibling [B, N] i32, n_nodes [B] i32, target_tokens [B, N] i64."""
    accepted, accept_len, bonus = load().tree_accept_greedy(tokens, first_child, next_sibling, n_nodes,
                                                            target_tokens, int(max_depth))
    return AcceptResult(accepted, accept_len, bonus)


def tree_accept_sampled(tokens: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor,
                        n_nodes: torch.Tensor, target_probs: torch.Tensor, uniforms: torch.Tensor,
                        max_depth: int) -> AcceptResult:
    """target_probs [B, N, V] f32, uniforms [B, N] f64: one inverse-CDF draw per node, then the walk."""
    accepted, accept_len, bonus, sampled = load().tree_accept_sampled(
        tokens, first_child, next_sibling, n_nodes, target_probs, uniforms, int(max_depth))
    return AcceptResult(accepted, accept_len, bonus, sampled)


def kv_compact(cache: torch.Tensor, past_lens: torch.Tensor, accepted: torch.Tensor,
               accept_len: torch.Tensor) -> None:
    """In place: cache [layers, B, S, D] bf16|f32; past_lens [B], accepted [B, A], accept_len [B] i32."""
    load().kv_compact(cache, past_lens, accepted, accept_len)


def tree_verify_mla(q: torch.Tensor, kv: torch.Tensor, past_lens: torch.Tensor, anc: torch.Tensor,
                    scale: float, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, 576] bf16, kv [B, S, 576] bf16, past_lens [B] i32, anc [B, T, W] i64 -> (o_lat, lse).
    impl: "auto" (v4, the seesaw with TMA loads, on sm_90, else mma.sync), "seesaw", "pingpong" (v3; the backend
    `cuda_pingpong` pins it), "wgmma" (v2 lock-step wgmma) or "mma" (the backend `cuda_mma` pins it)."""
    o_lat, lse = load().tree_verify_mla(q, kv, past_lens, anc, float(scale), impl)
    return o_lat, lse


def prepare_tree_verify_mla(q, kv, past_lens, anc, scale: float, dc: int = 512, impl: str = "auto"):
    """The family contract's form: the zero-argument call of the kernel on these inputs (dc must be 512)."""
    if dc != 512:
        raise ValueError(f"the tree_verify_mla kernel is built for kv_lora 512, got {dc}")
    return lambda: tree_verify_mla(q, kv, past_lens, anc, scale, impl)


def prepare_tree_verify_mla_mma(q, kv, past_lens, anc, scale: float, dc: int = 512):
    """As prepare_tree_verify_mla, pinned to the mma.sync path (backend cuda_mma)."""
    return prepare_tree_verify_mla(q, kv, past_lens, anc, scale, dc, impl="mma")


def prepare_tree_verify_mla_pingpong(q, kv, past_lens, anc, scale: float, dc: int = 512):
    """As prepare_tree_verify_mla, pinned to the v3 ping-pong path (backend cuda_pingpong; compute capability 9.0)."""
    return prepare_tree_verify_mla(q, kv, past_lens, anc, scale, dc, impl="pingpong")
