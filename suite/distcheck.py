"""T > 0 losslessness by distribution (issue 11 item 6): token marginals and lag-1 pair marginals of
speculative output against plain sampling of the same target, as total-variation distances, each judged
against a threshold derived from the sample itself: the (1 - alpha) quantile of the TV between random
relabelings of the pooled sequences, permuted within each prompt (sequences are the exchangeable units)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kdbench.engine import engine
from kdbench.engine.records import StageTimer
from kdbench.engine.stages import Policy


@dataclass(frozen=True)
class DistVerdict:
    tokens: int                  # generated tokens per arm
    tv_token: float
    threshold_token: float
    tv_pair: float
    threshold_pair: float
    noise_scale_token: float     # 0.5 * sqrt(1/n + 1/m) * sum sqrt(p): E[TV] under H0 for independent tokens

    @property
    def same(self) -> bool:
        return self.tv_token <= self.threshold_token and self.tv_pair <= self.threshold_pair


def sample(model, drafter, prompts: list[list[int]], copies: int, n_new: int, policy: Policy, temperature: float,
           seed: int, backend: str = "torch", bug: str | Callable | None = None) -> list[list[int]]:
    """copies independent continuations of every prompt in one batch: row r is prompts[r // copies].
    bug: a key of PLANTED (or such a wrapper of the tree_accept_sampled stage), to run speculative decoding
    with that known bug in its sampled accept stage."""
    rows = [p for p in prompts for _ in range(copies)]
    if bug is None:
        return engine.generate(model, drafter, rows, n_new, policy, temperature, seed, backend).tokens
    req = engine.Request(model, drafter, rows, n_new, policy, temperature, seed, backend)
    plan, state = engine.prepare(req)       # the public pieces generate() and graph capture share
    wrap = PLANTED[bug] if isinstance(bug, str) else bug
    stages = dataclasses.replace(plan.stages, tree_accept_sampled=wrap(plan.stages.tree_accept_sampled))
    plan = dataclasses.replace(plan, stages=stages)   # this plan only: nothing global is swapped
    while not all(state.done.tolist()):
        kv_limit = engine.bucketed_kv_limit(plan, max(state.cache.lengths.tolist()) + plan.rows)
        engine.step(plan, state, StageTimer(model.device), kv_limit)
    return state.tokens()


def _token_counts(seqs, V: int) -> np.ndarray:
    return np.bincount(np.concatenate([np.asarray(s, np.int64) for s in seqs]), minlength=V).astype(np.float64)


def _pair_counts(seqs, V: int) -> dict[int, float]:
    ids = np.concatenate([np.asarray(s[:-1], np.int64) * V + np.asarray(s[1:], np.int64) for s in seqs])
    keys, counts = np.unique(ids, return_counts=True)
    return dict(zip(keys.tolist(), counts.astype(np.float64).tolist()))


def tv(a, b) -> float:
    """Total variation between two count vectors (arrays) or two count dicts."""
    if isinstance(a, dict):
        keys = set(a) | set(b)
        na, nb = sum(a.values()), sum(b.values())
        return 0.5 * sum(abs(a.get(k, 0.0) / na - b.get(k, 0.0) / nb) for k in keys)
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def _stats(seqs_a, seqs_b, V):
    return (tv(_token_counts(seqs_a, V), _token_counts(seqs_b, V)),
            tv(_pair_counts(seqs_a, V), _pair_counts(seqs_b, V)))


def compare(seqs_a, seqs_b, groups: list[int], V: int, alpha: float = 0.01, n_perm: int = 200, seed: int = 0
            ) -> DistVerdict:
    """seqs_a, seqs_b: sequences of the two arms, row r from prompt groups[r] (same groups in both arms).
    Each statistic's threshold is the (1 - alpha/2) quantile of its permutation null (Bonferroni over two)."""
    rng = np.random.default_rng(seed)
    pooled, g = list(seqs_a) + list(seqs_b), np.asarray(list(groups) * 2)
    null = []
    for _ in range(n_perm):
        side = np.zeros(len(pooled), dtype=bool)
        for k in np.unique(g):                            # half of each prompt's pooled sequences to each side
            idx = np.flatnonzero(g == k)
            side[rng.permutation(idx)[: len(idx) // 2]] = True
        null.append(_stats([s for s, f in zip(pooled, side) if f], [s for s, f in zip(pooled, side) if not f], V))
    null = np.asarray(null)
    q = 1 - alpha / 2
    ta, tb = _token_counts(seqs_a, V), _token_counts(seqs_b, V)
    p = (ta + tb) / (ta.sum() + tb.sum())
    scale = 0.5 * np.sqrt(1 / ta.sum() + 1 / tb.sum()) * float(np.sqrt(p).sum())
    tvt, tvp = _stats(seqs_a, seqs_b, V)
    return DistVerdict(int(ta.sum()), tvt, float(np.quantile(null[:, 0], q)), tvp, float(np.quantile(null[:, 1], q)),
                       scale)


# ------------------------------------------------------------------------------ planted bugs (power check)
# Each wraps a backend's tree_accept_sampled(tokens, first_child, next_sibling, n_nodes, probs, uniforms, depth)
# and changes the target probabilities it decides with; probs = softmax(logits / T) over the last axis.

def _temperature_bug(accept):
    """Verify at half the temperature: softmax(logits / (T/2)) = probs^2, renormalized."""
    def buggy(tokens, first_child, next_sibling, n_nodes, probs, uniforms, depth):
        sharp = probs * probs
        return accept(tokens, first_child, next_sibling, n_nodes, sharp / sharp.sum(-1, keepdim=True), uniforms,
                      depth)
    return buggy


def _draft_bias_bug(accept):
    """The draft gets a head start: softmax(logits + 3 at each row's first child token) = probs x e^3 there."""
    def buggy(tokens, first_child, next_sibling, n_nodes, probs, uniforms, depth):
        child = first_child.to(torch.int64)                                 # [B, N] first child row, -1 = leaf
        tok = tokens.gather(1, child.clamp(min=0))                          # its token
        boost = torch.zeros_like(probs).scatter_(2, tok[..., None], 3.0) * (child >= 0)[..., None]
        biased = probs * boost.exp()
        return accept(tokens, first_child, next_sibling, n_nodes, biased / biased.sum(-1, keepdim=True), uniforms,
                      depth)
    return buggy


PLANTED = {"verify_at_half_temperature": _temperature_bug, "draft_biased_verify": _draft_bias_bug}
