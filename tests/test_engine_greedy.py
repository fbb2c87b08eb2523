"""Greedy speculative decoding is lossless: DDTree and chain (and the other tree policies) produce exactly the
tokens of greedy AR decoding, batched (ragged prompts) and unbatched, for the block and synthetic drafters."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdbench.engine.engine import generate
from kdbench.engine.stages import Policy
from kdbench.model.drafter import BlockDrafter
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer


N_PROMPTS, MAX_NEW, SEED = 20, 16, 0
BUDGETS = (1, 2, 8, 64)


def assert_same_tokens(got: list[list[int]], want: list[list[int]], prompts, label: str) -> None:
    """Names the first request and position where the speculative tokens leave the AR tokens."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            pos = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            raise AssertionError(f"{label}: prompt {i} {prompts[i]} diverges from AR at generated position "
                                 f"{pos}: got {g[pos:pos + 4]}, AR {w[pos:pos + 4]} (lengths {len(g)}, {len(w)})")


@pytest.fixture(scope="module")
def world():
    """A tiny float64 target, 20 ragged random prompts, their greedy AR tokens and drafters."""
    model = Transformer.from_reference(get_preset("tiny"), SEED)
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(0, model.cfg.vocab_size - 1, int(n)).tolist() for n in rng.integers(1, 13, N_PROMPTS)]
    ar = generate(model, None, prompts, MAX_NEW, Policy("ar"))
    oracle = [p + t for p, t in zip(prompts, ar.tokens)]
    return dict(model=model, prompts=prompts, ar=ar.tokens, oracle=oracle,
                block=BlockDrafter.random(model, seed=1))


def _synthetic(world, idx=None, depth=15):
    oracle = world["oracle"] if idx is None else [world["oracle"][i] for i in idx]
    return SyntheticDrafter(oracle, world["model"].cfg.vocab_size, depth=depth, quality=0.6,
                            rank_probs=(0.55, 0.25, 0.12, 0.08), seed=4)


@pytest.mark.parametrize("kind", ["ddtree", "chain"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_batched_synthetic_matches_ar(world, kind, budget):
    res = generate(world["model"], _synthetic(world), world["prompts"], MAX_NEW, Policy(kind, budget))
    assert_same_tokens(res.tokens, world["ar"], world["prompts"], f"{kind} B={budget} batched")
    taus = [t for s in res.steps for t in s.tau]
    assert max(taus) > 1, "the synthetic drafter must get drafts accepted (deep walks exercised)"
    assert max(taus) <= min(budget, 15) + 1


@pytest.mark.parametrize("kind,budget", [("ddtree", 1), ("ddtree", 8), ("chain", 8), ("ddtree", 64)])
def test_batched_block_drafter_matches_ar(world, kind, budget):
    res = generate(world["model"], world["block"], world["prompts"], MAX_NEW, Policy(kind, budget))
    assert_same_tokens(res.tokens, world["ar"], world["prompts"], f"{kind} B={budget} block drafter")


@pytest.mark.parametrize("kind", ["ddtree", "chain"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_unbatched_matches_ar(world, kind, budget):
    for i in (0, 7, 13):
        drafter = _synthetic(world, [i]) if budget != 2 else world["block"]
        res = generate(world["model"], drafter, [world["prompts"][i]], MAX_NEW, Policy(kind, budget))
        assert_same_tokens(res.tokens, [world["ar"][i]], [world["prompts"][i]], f"{kind} B={budget} unbatched #{i}")


@pytest.mark.parametrize("policy", [Policy("ddtree_width_capped", 24, max_width=2),
                                    Policy("static_kary", branching=(3, 2, 2, 1)), Policy("ddtree", 0)])
def test_other_policies_match_ar(world, policy):
    res = generate(world["model"], _synthetic(world), world["prompts"], MAX_NEW, policy)
    assert_same_tokens(res.tokens, world["ar"], world["prompts"], policy.label)


def test_records_account_for_every_token(world):
    res = generate(world["model"], _synthetic(world), world["prompts"], MAX_NEW, Policy("ddtree", 8))
    assert res.drafter.startswith("synthetic(q=0.6") and res.policy == "ddtree(B=8)"
    for b in range(N_PROMPTS):
        taus = [s.tau[b] for s in res.steps]
        live = [t for t in taus if t > 0]
        assert taus[:len(live)] == live, "a finished request commits nothing afterwards"
        assert MAX_NEW - 1 <= sum(live) <= MAX_NEW - 1 + 15, "1 token from prefill, then sum(tau) covers the rest"
        assert all(s.accepted_depth[b] == max(s.tau[b] - 1, 0) and 1 <= s.tree_size[b] <= 9 for s in res.steps)
    assert set(res.steps[0].stage_ns) == {"draft", "build", "verify", "accept", "compact", "commit"}
    assert all(v > 0 for s in res.steps for v in s.stage_ns.values())
    assert 1.0 < res.mean_tau == pytest.approx(sum(t for s in res.steps for t in s.tau) /
                                               sum(1 for s in res.steps for t in s.tau if t > 0))
