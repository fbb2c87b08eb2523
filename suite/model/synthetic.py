"""Synthetic drafter for controlled acceptance studies: given oracle future tokens (the target's greedy AR
continuation), its depth-i distribution puts the true token at a seeded rank r_i of a geometric profile
whose top mass is `quality`; the other ranks are a random permutation of the vocabulary (noise).
Records name it `synthetic(q=...)`, so no result can be mistaken for a real drafter's.
"""
from __future__ import annotations

import math

import torch

MIN_LOG_RATIO = -30.0  # log mass ratio between adjacent ranks when quality = 1 (keeps logits finite)


class SyntheticDrafter:
    """logits[b, i, token at rank k] = k * log(1 - quality): masses (1-q)^k q / (1 - (1-q)^V), so rank 0
    holds ~quality. The true token oracle[b][start + 1 + i] is swapped into rank r_i ~ rank_probs
    (independent per request, depth and step). Past the oracle's end the profile is pure noise."""

    def __init__(self, oracle: list[list[int]], vocab_size: int, depth: int = 15, quality: float = 0.8,
                 rank_probs: tuple[float, ...] = (1.0,), seed: int = 0, device="cpu"):
        if not 0.0 < quality <= 1.0:
            raise ValueError(f"quality must be in (0, 1], got {quality}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if not rank_probs or min(rank_probs) < 0 or sum(rank_probs) <= 0 or len(rank_probs) > vocab_size:
            raise ValueError(f"rank_probs must be <= {vocab_size} non-negative weights with a positive sum, "
                             f"got {rank_probs}")
        if any(not 0 <= t < vocab_size for seq in oracle for t in seq):
            raise ValueError(f"oracle tokens must lie in [0, {vocab_size})")
        self.oracle, self.vocab, self.L = [list(s) for s in oracle], vocab_size, depth
        self.quality, self.rank_probs, self.seed = quality, tuple(float(p) for p in rank_probs), seed
        self.device = torch.device(device)
        ranks = "" if self.rank_probs == (1.0,) else ",ranks=" + "/".join(f"{p:g}" for p in self.rank_probs)
        self.name = f"synthetic(q={quality:g}{ranks})"
        slope = max(math.log1p(-quality), MIN_LOG_RATIO) if quality < 1.0 else MIN_LOG_RATIO
        self.rank_logit = slope * torch.arange(vocab_size, dtype=torch.float32, device=self.device)  # [V]
        w = torch.tensor(self.rank_probs, dtype=torch.float64)
        self.rank_cdf = (torch.cumsum(w, 0) / w.sum()).float().to(self.device)  # [R]
        self.gen = self.table = self.table_len = None

    @property
    def depth(self) -> int:
        return self.L

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return ()

    def reset(self, batch: int, max_len: int) -> None:
        """Oracle table [B, max_len] (-1 past each oracle's end) and a fresh generator from the seed."""
        if batch != len(self.oracle):
            raise ValueError(f"the synthetic drafter has oracles for {len(self.oracle)} requests, batch is {batch}")
        table = torch.full((batch, max_len), -1, dtype=torch.int64)
        for b, seq in enumerate(self.oracle):
            n = min(len(seq), max_len)
            table[b, :n] = torch.tensor(seq[:n], dtype=torch.int64)
        self.table = table.to(self.device)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)

    def begin(self, taps, lengths) -> None:
        """No context state: the oracle stands in for it."""

    def commit(self, taps, count) -> None:
        """No context state."""

    def draft(self, bonus: torch.Tensor, start: torch.Tensor, kv_limit: int) -> torch.Tensor:
        """-> logits [B, L, V] float32 for depths 1..L after the bonus token at positions start [B]."""
        B, L, V = bonus.shape[0], self.L, self.vocab
        noise = torch.rand(B, L, V, generator=self.gen, device=self.device)
        u = torch.rand(B, L, 1, generator=self.gen, device=self.device)
        return self._profile(torch.argsort(noise, dim=-1), u, start)

    def _profile(self, perm: torch.Tensor, u: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """perm [B, L, V]: the token at each rank; u [B, L, 1] float32 uniforms picking the true token's rank
        by inverse CDF (no sync) -> logits [B, L, V] float32."""
        B, L, V = perm.shape
        pos = start.to(torch.int64)[:, None] + 1 + torch.arange(L, device=self.device)  # [B, L]
        true = self.table.gather(1, pos.clamp(max=self.table.shape[1] - 1))
        logits = torch.empty(B, L, V, dtype=torch.float32, device=self.device)
        logits.scatter_(-1, perm, self.rank_logit.expand(B, L, V))
        rank = torch.searchsorted(self.rank_cdf, u, right=True).clamp_(max=len(self.rank_probs) - 1)
        displaced = perm.gather(-1, rank)                                        # token now at rank r
        true = torch.where((true >= 0) & (pos < self.table.shape[1]), true, displaced[..., 0])[..., None]
        logits.scatter_(-1, displaced, logits.gather(-1, true))                  # swap the two tokens
        logits.scatter_(-1, true, self.rank_logit[rank])
        return logits

