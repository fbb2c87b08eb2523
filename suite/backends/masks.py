"""Ancestor bitmasks (int64 words holding uint64 bit patterns) <-> boolean visibility, in torch."""
from __future__ import annotations

import torch


def anc_to_bool(anc: torch.Tensor, t: int) -> torch.Tensor:
    """anc [B, T, W] int64 -> [B, T, t] bool; bit j % 64 of word j // 64 = tree column j."""
    shifts = torch.arange(64, device=anc.device, dtype=torch.int64)
    bits = (anc.unsqueeze(-1) >> shifts) & 1                          # [B, T, W, 64]
    return bits.reshape(*anc.shape[:-1], -1)[..., :t].bool()


def visible_mask(past_lens: torch.Tensor, anc: torch.Tensor, t: int, s_len: int) -> torch.Tensor:
    """[B, T, S] bool: the committed prefix [0, past_len) plus the tree columns allowed by anc; a row whose
    anc is all zero is padding and sees nothing (prefix included), matching the kernel's contract."""
    b = anc.shape[0]
    cols = torch.arange(s_len, device=anc.device)
    past = past_lens.long()[:, None, None]                             # [B, 1, 1]
    tree = anc_to_bool(anc, t)                                         # [B, T, t]
    real = tree.any(-1, keepdim=True)                                  # [B, T, 1]
    vis = (cols[None, None, :] < past) & real                          # prefix
    rel = cols[None, None, :] - past                                   # tree column index
    in_tree = (rel >= 0) & (rel < t)
    gathered = torch.gather(tree, 2, rel.clamp(0, t - 1).expand(b, tree.shape[1], s_len))
    return vis | (in_tree & gathered)
