"""The tree_build family's two-level check on CPU: the top-K against float64 (tokens exact, log-probs within
float32 resolution) and the trees bit-exact against the reference heap on the backend's own top-K."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kdbench.config import Tolerance
from kdbench.families import tree_build as fam
from kdbench.shapes import TreeBuildShape

EXACT = Tolerance(rtol=0, atol=0)


def _case(**kw):
    return SimpleNamespace(shape=TreeBuildShape(**{"batch": 3, "budget": 40, "vocab": 50, "depth": 6, **kw}),
                           dtype="float32", seed=1)


def _kernel_like(want: dict, top_lp: np.ndarray) -> dict:
    """What a float32 backend returns: its top-K and the trees the reference heap builds from them."""
    meta = want[fam.BUILD_INPUTS]
    got = fam.trees_from_topk(top_lp, want["top_tok"], meta["budgets"], meta["root_tokens"],
                              want["parents"].shape[1])
    return {**got, "top_lp": top_lp, "top_tok": want["top_tok"].copy()}


def test_reference_output_passes_its_own_check():
    case = _case()
    inputs = fam.make_inputs(case, seed=3)
    want = fam.reference(inputs, case)
    assert fam.check(fam.reference(inputs, case), want, EXACT).passed   # a second run of the reference


def test_float32_rounding_of_the_scores_is_not_a_tree_bug():
    """Exact ties resolved differently after sub-float32 changes of the scores (-1e-8 per rank: each row stays
    sorted) still pass: the builder is judged on its own inputs, the scores against float64 within tolerance."""
    case = _case(logits="ties")
    inputs = fam.make_inputs(case, seed=4)
    want = fam.reference(inputs, case)
    nudged = want["top_lp"] - 1e-8 * np.arange(want["top_lp"].shape[-1])
    got = _kernel_like(want, nudged)
    assert not np.array_equal(got["parents"], want["parents"]), "the nudge must resolve some ties differently"
    assert fam.check(got, want, EXACT).passed


def test_wrong_tree_or_top_k_fails_and_names_it():
    case = _case()
    inputs = fam.make_inputs(case, seed=5)
    want = fam.reference(inputs, case)
    bad_tree = _kernel_like(want, want["top_lp"].copy())
    bad_tree["parents"][1, 7] += 1
    res = fam.check(bad_tree, want, EXACT)
    assert not res.passed and "parents" in res.worst
    bad_lp = _kernel_like(want, want["top_lp"] + 1e-3)
    res = fam.check(bad_lp, want, EXACT)
    assert not res.passed and "top_lp" in res.worst
    swapped = _kernel_like(want, want["top_lp"].copy())
    swapped["top_tok"][0, 0, [0, 1]] = swapped["top_tok"][0, 0, [1, 0]]
    assert not fam.check(swapped, want, EXACT).passed
