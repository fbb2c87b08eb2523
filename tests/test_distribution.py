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


def _spec(world, seed=2):
    target, drafter, prompts, _, _ = world
    return distcheck.sample(target, drafter, prompts, COPIES, NEW, POLICY, TEMP, seed=seed)


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
    with distcheck.planted(bug):
        spec = _spec(world)
    assert distcheck.engine._accept.__name__ == "_accept"          # restored
    v = distcheck.compare(plain, spec, groups, target.cfg.vocab_size)
    assert not v.same, v
