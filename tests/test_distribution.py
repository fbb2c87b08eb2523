"""T > 0 losslessness by distribution on the trained pair (small CI size): speculative ddtree output has the
token and lag-1 pair marginals of plain sampling (TV within the permutation threshold), and the check has
power: a planted temperature bug and a planted draft-biased verify are both caught. The H200 version
(>= 20k tokens, T = 0.8 and 1.0) is reports/h200/pair/pair_distribution.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdbench import distcheck, pair
from kdbench.engine.stages import Policy
from kdbench.prompts import token_prompts

PROMPTS, COPIES, NEW, TEMP = 6, 8, 40, 1.0     # 6 prompts (code, prose) x 8 copies x 40 tokens = 1920 per arm
POLICY = Policy(kind="ddtree", budget=8)


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    target = pair.load_target("cpu", torch.float32)
    drafter = pair.load_drafter(target)
    prompts = token_prompts("code", PROMPTS // 2, 24) + token_prompts("prose", PROMPTS // 2, 24)
    groups = [i for i in range(PROMPTS) for _ in range(COPIES)]
    plain = distcheck.sample(target, None, prompts, COPIES, NEW, Policy(kind="ar"), TEMP, seed=1)
    return target, drafter, prompts, groups, plain


def _spec(world, seed=2, bug=None):
    target, drafter, prompts, _, _ = world
    return distcheck.sample(target, drafter, prompts, COPIES, NEW, POLICY, TEMP, seed=seed, bug=bug)


def test_tv_and_threshold_basics():
    a = np.array([3.0, 1.0, 0.0])
    assert distcheck.tv(a, a * 7) == 0.0 and distcheck.tv(a, np.array([0.0, 0.0, 5.0])) == 1.0
    assert distcheck.tv({1: 2.0, 2: 2.0}, {1: 1.0, 3: 1.0}) == pytest.approx(0.5)


def test_speculative_sampling_matches_plain_sampling(world):
    target, _, _, groups, plain = world
    v = distcheck.compare(plain, _spec(world), groups, target.cfg.vocab_size)
    assert v.tokens == PROMPTS * COPIES * NEW
    assert v.same, v
    assert 0 < v.threshold_token < 1 and 0 < v.threshold_pair < 1


@pytest.mark.parametrize("bug", sorted(distcheck.PLANTED))
def test_planted_bugs_are_caught(world, bug):
    target, _, _, groups, plain = world
    v = distcheck.compare(plain, _spec(world, bug=bug), groups, target.cfg.vocab_size)
    assert not v.same, v


def test_the_planted_path_without_a_bug_is_generate(world):
    """The bug hook drives engine.prepare/step itself: with an identity 'bug' it must give generate()'s
    tokens exactly (same seed), so a caught bug is the bug, not the loop."""
    assert _spec(world, seed=5, bug=lambda accept: accept) == _spec(world, seed=5)


@pytest.mark.parametrize("bug", sorted(distcheck.PLANTED))
def test_planted_bugs_equal_their_logit_form(bug):
    """Each probability-space bug equals the logit change it stands for (half temperature; +3 on the draft)."""
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.normal(size=(2, 5, 11)))
    tokens = torch.from_numpy(rng.integers(0, 11, size=(2, 5)))
    first_child = torch.tensor([[1, 3, -1, 4, -1], [2, -1, 4, -1, -1]], dtype=torch.int32)
    seen = {}
    distcheck.PLANTED[bug](lambda *a: seen.setdefault("probs", a[4]))(
        tokens, first_child, None, None, torch.softmax(logits, -1), None, 4)
    if bug == "verify_at_half_temperature":
        want = torch.softmax(logits / 0.5, -1)
    else:
        child = first_child.to(torch.int64)
        boost = torch.zeros_like(logits).scatter_(2, tokens.gather(1, child.clamp(min=0))[..., None], 3.0)
        want = torch.softmax(logits + boost * (child >= 0)[..., None], -1)
    torch.testing.assert_close(seen["probs"], want, rtol=1e-12, atol=1e-14)
