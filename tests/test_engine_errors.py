"""Bad inputs to the engine give a clear ValueError (or the documented empty result), never a crash."""
from __future__ import annotations

import pytest
import torch

from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.stages import MAX_BUDGET, Policy, get_stages
from kdbench.model.drafter import BlockDrafter
from kdbench.model.synthetic import SyntheticDrafter


@pytest.fixture(scope="module")
def model():
    return target_from_preset("tiny", 0, dtype=torch.float64, reference_init=True)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="unknown model preset 'tiny2'.*kimi-k2"):
        target_from_preset("tiny2", 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(budget=-1), "budget"), (dict(budget=MAX_BUDGET + 1), "budget"), (dict(budget=2.5), "budget"),
    (dict(kind="beam"), "unknown policy kind"), (dict(kind="ddtree_width_capped", budget=8), "max_width"),
    (dict(kind="static_kary"), "branching"), (dict(kind="static_kary", branching=(0, 2)), "branching"),
    (dict(kind="static_kary", branching=(8, 8, 8, 8)), "nodes"),
])
def test_bad_policies(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Policy(**kwargs)


def test_budget_at_the_maximum_is_accepted():
    assert Policy("ddtree", MAX_BUDGET).nodes(15) == MAX_BUDGET


@pytest.mark.parametrize("prompts,match", [
    ([], "prompts is empty"), ([[1, 2], []], "prompt 1 is empty"), ([[1, 256]], "outside"), ([[-1]], "outside"),
])
def test_bad_prompts(model, prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(model, None, prompts, 4, Policy("ar"))


def test_max_new_tokens(model):
    res = generate(model, None, [[1, 2], [3]], 0, Policy("ar"))
    assert res.tokens == [[], []] and res.steps == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, None, [[1]], -1, Policy("ar"))
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, None, [[1]], model.cfg.max_seq_len, Policy("ar"))
    assert len(generate(model, None, [[1]], 1, Policy("ar")).tokens[0]) == 1


def test_bad_run_arguments(model):
    drafter = BlockDrafter.random(model, 0, block_size=4)
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(model, None, [[1]], 4, Policy("ddtree", 8))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, None, [[1]], 4, Policy("ar"), temperature=-0.5)
    with pytest.raises(ValueError, match="deeper than the drafter"):
        generate(model, drafter, [[1]], 4, Policy("static_kary", branching=(2, 2, 2, 2)))
    with pytest.raises(ValueError, match="policy must be a Policy"):
        generate(model, drafter, [[1]], 4, "ddtree")
    with pytest.raises(ValueError, match="oracles for 1 requests"):
        generate(model, SyntheticDrafter([[1, 2]], 256), [[1], [2]], 4, Policy("ddtree", 4))


def test_bad_backends(model):
    with pytest.raises(ValueError, match="unknown backend 'triton'"):
        get_stages("triton", Policy())
    # tiny's latent (32 + 8) does not fit the kernel; an absent extension is a RuntimeError with the reason
    with pytest.raises((ValueError, RuntimeError), match="cuda"):
        generate(model, BlockDrafter.random(model, 0), [[1]], 4, Policy("ddtree", 8), backend="cuda")
