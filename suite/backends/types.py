"""Batched stage outputs shared by every backend (torch ops, CUDA extension): one shape contract.

Shapes use B = batch, N = max_budget + 1 tree rows (row 0 = root), W = ceil(N / 64) mask words,
L = draft depth, K = min(max_budget, V). Padding rows (index >= n_nodes[b]) have parent 0, depth 1,
token = root token, see only the root and themselves, and are never linked as children.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class TreeBatch(NamedTuple):
    tokens: torch.Tensor        # [B, N] int64
    parents: torch.Tensor       # [B, N] int32, -1 at the root
    depths: torch.Tensor        # [B, N] int32
    positions: torch.Tensor     # [B, N] int64 = past_len + depth
    anc: torch.Tensor           # [B, N, W] int64 holding uint64 bit patterns (bit j: node j is ancestor-or-self)
    first_child: torch.Tensor   # [B, N] int32, -1 = none
    next_sibling: torch.Tensor  # [B, N] int32, -1 = none
    n_nodes: torch.Tensor       # [B] int32, root included
    top_lp: torch.Tensor        # [B, L, K] float32 log-probs (full-vocabulary log-softmax)
    top_tok: torch.Tensor       # [B, L, K] int64
    scores: torch.Tensor        # [B, N] float64 log Q(prefix); 0 at the root, -inf at padding rows


class AcceptResult(NamedTuple):
    accepted: torch.Tensor      # [B, max_depth + 1] int32 tree row indices, root first, -1 padding
    accept_len: torch.Tensor    # [B] int32 = tokens committed this step (tau, counts the root/bonus)
    bonus: torch.Tensor         # [B] int64, the target's token after the accepted path (next root)
    sampled: torch.Tensor | None = None  # [B, N] int64 target token per node (sampled mode)
