"""Sampled speculative decoding (T > 0) is lossless in distribution: the first three generated tokens of many
seeded runs follow the target's exact joint distribution (chi-square, tiny vocabulary, fixed seeds)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from kdbench.engine.engine import generate, greedy_oracle
from kdbench.engine.stages import Policy
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer


V, PROMPT, N_RUNS, N_TOK, TEMP = 16, [3, 7, 1], 3000, 3, 1.0
P_MIN = 1e-3  # conservative: fixed seeds make the verdict deterministic; the power check below needs p << P_MIN


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof > x) = Q(dof/2, x/2), the regularized upper incomplete gamma (series / continued fraction)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_pre = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1:  # series for the lower function P
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-16 * abs(total):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300  # modified Lentz continued fraction for Q
    b, c, d = z + 1 - a, 1 / tiny, 1 / (z + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_pre) * h


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Goodness of fit; cells with expected count < min_expected are pooled into one."""
    n = counts.sum()
    exp = probs * n
    small = exp < min_expected
    obs_cells = np.append(counts[~small], counts[small].sum())
    exp_cells = np.append(exp[~small], exp[small].sum())
    keep = exp_cells > 0
    stat = float(((obs_cells[keep] - exp_cells[keep]) ** 2 / exp_cells[keep]).sum())
    return chi2_sf(stat, int(keep.sum()) - 1)


def test_chi2_sf_known_quantiles():
    for x, dof in ((3.841459, 1), (18.307038, 10), (67.504807, 50)):
        assert chi2_sf(x, dof) == pytest.approx(0.05, abs=1e-5)
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(200.0, 10) < 1e-30


@pytest.fixture(scope="module")
def world():
    cfg = dataclasses.replace(get_preset("tiny"), name="tiny-v16", vocab_size=V)
    model = Transformer.from_reference(cfg, 11)
    return dict(model=model, joint=exact_joint(model, TEMP), joint_hot=exact_joint(model, 1.5))


def exact_joint(model, temp: float) -> np.ndarray:
    """[V, V, V] P(t1, t2, t3 | PROMPT) under softmax(logits / temp), from batched float64 forwards."""
    def next_probs(seqs):
        seqs = torch.tensor(seqs)
        B, T = seqs.shape
        out = model.forward(seqs, torch.arange(T).expand(B, T), model.new_cache(B, T), torch.zeros(B, dtype=torch.int32))
        return torch.softmax(out.logits[:, -1] / temp, -1).numpy()
    p1 = next_probs([PROMPT])[0]                                                    # [V]
    p2 = next_probs([PROMPT + [a] for a in range(V)])                               # [V, V]
    p3 = next_probs([PROMPT + [a, b] for a in range(V) for b in range(V)]).reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def _counts(tokens: list[list[int]]) -> np.ndarray:
    t = np.array(tokens)[:, :N_TOK]
    return np.bincount((t[:, 0] * V + t[:, 1]) * V + t[:, 2], minlength=V ** 3).astype(np.float64)


@pytest.mark.parametrize("policy", [Policy("ddtree", 8), Policy("chain", 4)])
def test_sampled_tokens_follow_the_target(world, policy):
    model = world["model"]
    oracle = greedy_oracle(model, [PROMPT], 20)
    drafter = SyntheticDrafter(oracle * N_RUNS, V, depth=4, quality=0.5, rank_probs=(0.5, 0.3, 0.2), seed=2)
    res = generate(model, drafter, [PROMPT] * N_RUNS, N_TOK, policy, temperature=TEMP, seed=7)
    counts = _counts(res.tokens)
    assert max(t for s in res.steps for t in s.tau) > 1, "drafts were accepted under sampling"
    p = chi2_pvalue(counts, world["joint"].ravel())
    assert p > P_MIN, f"{policy.label}: first {N_TOK} tokens do not follow the target (chi-square p = {p:.2e})"
    p_hot = chi2_pvalue(counts, world["joint_hot"].ravel())
    assert p_hot < 1e-6, f"power check: T = 1.5 expectations should be rejected, p = {p_hot:.2e}"


def test_sampled_ar_follows_the_target_and_is_seeded(world):
    model = world["model"]
    res = generate(model, None, [PROMPT] * N_RUNS, N_TOK, Policy("ar"), temperature=TEMP, seed=8)
    assert chi2_pvalue(_counts(res.tokens), world["joint"].ravel()) > P_MIN
    a = generate(model, None, [PROMPT] * 20, N_TOK, Policy("ar"), temperature=TEMP, seed=9).tokens
    b = generate(model, None, [PROMPT] * 20, N_TOK, Policy("ar"), temperature=TEMP, seed=9).tokens
    c = generate(model, None, [PROMPT] * 20, N_TOK, Policy("ar"), temperature=TEMP, seed=10).tokens
    assert a == b and a != c
