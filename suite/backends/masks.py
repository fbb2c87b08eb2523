"""Ancestor bitmasks (int64 words holding uint64 bit patterns) <-> boolean visibility, in torch."""
from __future__ import annotations

import torch

from kdbench.model.mla import visible_mask as model_mask


def anc_to_bool(anc: torch.Tensor, t: int) -> torch.Tensor:
    """anc [B, T, W] int64 -> [B, T, t] bool; bit j % 64 of word j // 64 = tree column j."""
    shifts = torch.arange(64, device=anc.device, dtype=torch.int64)
    bits = (anc.unsqueeze(-1) >> shifts) & 1                          # [B, T, W, 64]
    return bits.reshape(*anc.shape[:-1], -1)[..., :t].bool()


def visible_mask(past_lens: torch.Tensor, anc: torch.Tensor, t: int, s_len: int) -> torch.Tensor:
    """[B, T, S] bool: the model's mask (the committed prefix plus the tree columns allowed by anc), except
    that a row whose anc is all zero is padding and sees nothing, prefix included: the kernel's contract."""
    real = anc_to_bool(anc, t).any(-1, keepdim=True)                   # [B, T, 1]
    return model_mask(past_lens, t, s_len, anc) & real
