"""A synthetic drafter whose output is a pure function of (seed, request, round start): the same profile as
SyntheticDrafter, but its noise comes from a counter-based hash instead of a generator advanced per call, so
the draft at a position does not depend on which rounds ran before. That is what a recorded trace needs
(plans/0009-traces-replay.md): replaying any policy over it is exact, as for a real drafter.
"""
from __future__ import annotations

import torch

from .synthetic import SyntheticDrafter


def _signed(c: int) -> int:
    """A 64-bit constant as torch's int64 (two's complement)."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1, _M2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64 on CPU and CUDA)."""
    x = (x ^ _srl(x, 30)) * _M1
    x = (x ^ _srl(x, 27)) * _M2
    return x ^ _srl(x, 31)


def unit_float(x: torch.Tensor) -> torch.Tensor:
    """int64 hash -> float64 in [0, 1) from its top 53 bits."""
    return _srl(x, 11).to(torch.float64) * 2.0 ** -53


class KeyedSyntheticDrafter(SyntheticDrafter):
    """SyntheticDrafter with noise keyed by (seed, keys[b], start[b], depth, token). keys: one int per
    request (default 0..B-1, the oracle's order), so a request keeps its drafts in any batch position."""

    def __init__(self, oracle, vocab_size, depth=15, quality=0.8, rank_probs=(1.0,), seed=0, device="cpu",
                 keys: tuple[int, ...] | None = None):
        super().__init__(oracle, vocab_size, depth, quality, rank_probs, seed, device)
        self.keys = tuple(range(len(oracle))) if keys is None else tuple(int(k) for k in keys)
        if len(self.keys) != len(oracle):
            raise ValueError(f"keys has {len(self.keys)} entries, the oracle {len(oracle)}")
        self.name = self.name.replace("synthetic(", "synthetic-keyed(", 1)
        self.key_t = torch.tensor(self.keys, dtype=torch.int64, device=self.device)

    def _hashes(self, start: torch.Tensor) -> torch.Tensor:
        """[B, L] per-(request, depth) hash of (seed, key, start, depth)."""
        h = mix64(self.key_t * _GOLDEN + self.seed)
        h = mix64(h + start.to(torch.int64) * _GOLDEN)
        return mix64(h[:, None] + torch.arange(1, self.L + 1, device=self.device) * _GOLDEN)

    def draft(self, bonus: torch.Tensor, start: torch.Tensor, kv_limit: int) -> torch.Tensor:
        """-> logits [B, L, V] float32, the SyntheticDrafter profile with hashed noise (no generator)."""
        B, L, V = bonus.shape[0], self.L, self.vocab
        if B != len(self.keys):
            raise ValueError(f"batch {B} != {len(self.keys)} keyed requests")
        h = self._hashes(start)                                                          # [B, L]
        noise = mix64(h[..., None] + torch.arange(V, device=self.device) * _GOLDEN)      # [B, L, V]
        u = unit_float(mix64(h ^ _M2)).float()[..., None]                                # [B, L, 1]
        return self._profile(torch.argsort(noise, dim=-1), u, start)  # int64 keys: distinct w.h.p.
