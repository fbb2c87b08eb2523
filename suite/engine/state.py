"""Device-side state of a generate() run (fixed shapes, updated without host synchronization) and the
sampler (argmax at T = 0; at T > 0 softmax(logits / T) and float64 uniforms from a seeded generator)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdbench.backends.torch_ops import sample_inverse_cdf
from kdbench.model.transformer import LatentCache


@dataclass
class EngineState:
    """Request b has committed cache.lengths[b] rows (prompt + accepted tokens) and generated n_gen[b]
    tokens gen[b, :n_gen[b]]; the last generated one, bonus[b], is the next root (not yet in the KV).
    A request is frozen once done (n_gen >= max_new): its later steps commit nothing."""
    cache: LatentCache
    bonus: torch.Tensor    # [B] int64
    gen: torch.Tensor      # [B, G] int64, G = max_new + slack for a step's overshoot
    n_gen: torch.Tensor    # [B] int32
    done: torch.Tensor     # [B] bool
    budgets: torch.Tensor  # [B] int32 tree budget per request
    max_new: int
    prefill_ns: int = 0    # host wall time of the prefill that started this state (synchronized)

    @classmethod
    def allocate(cls, cache: LatentCache, max_new: int, slack: int, budget: int) -> "EngineState":
        B, dev = cache.kv.shape[1], cache.kv.device
        return cls(cache=cache, bonus=torch.zeros(B, dtype=torch.int64, device=dev),
                   gen=torch.zeros(B, max_new + slack, dtype=torch.int64, device=dev),
                   n_gen=torch.zeros(B, dtype=torch.int32, device=dev),
                   done=torch.zeros(B, dtype=torch.bool, device=dev),
                   budgets=torch.full((B,), budget, dtype=torch.int32, device=dev), max_new=max_new)

    def advance(self, new_tokens: torch.Tensor, count: torch.Tensor, bonus: torch.Tensor) -> None:
        """Append new_tokens[b, :count[b]] ([B, A], the accepted drafts then the bonus) to the output;
        commit count[b] rows to the KV length; take the new bonus (in place) unless frozen. count must be 0 for
        frozen requests. Slots past count get garbage beyond the valid length (fixed shapes)."""
        A = new_tokens.shape[1]
        slot = self.n_gen.to(torch.int64)[:, None] + torch.arange(A, device=new_tokens.device)
        self.gen.scatter_(1, slot.clamp_(max=self.gen.shape[1] - 1), new_tokens)
        self.bonus.copy_(torch.where(self.done, self.bonus, bonus))   # in place: a CUDA graph reads this address
        self.n_gen += count
        self.cache.lengths += count
        self.done |= self.n_gen >= self.max_new

    def tokens(self) -> list[list[int]]:
        """The first max_new generated tokens of every request (host copy)."""
        return [row[:self.max_new] for row in self.gen.tolist()]


class Sampler:
    """The target's decoding rule."""

    def __init__(self, temperature: float, seed: int, device):
        self.temperature = float(temperature)
        self.greedy = self.temperature == 0.0
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T) over the vocabulary, float32 (float64 for float64 logits)."""
        x = logits if logits.dtype == torch.float64 else logits.float()
        return torch.softmax(x / self.temperature, dim=-1)

    def uniforms(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, dtype=torch.float64, generator=self.gen, device=self.device)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] -> [B] int64: argmax (first maximum) or one inverse-CDF sample."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return sample_inverse_cdf(self.probs(logits), self.uniforms(logits.shape[0]))
