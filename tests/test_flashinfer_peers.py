"""GPU tests of the FlashInfer peer backends of tree_verify_mla (suite/backends/flashinfer_mla.py) through the
family and the registry, against the float64 reference: the cascade on random, padded and ragged trees, the
prefix alone against the prefix-only truth, the causal pass on chains. Skipped without a GPU or FlashInfer."""
from __future__ import annotations

import pytest
import torch

from kdbench import config
from kdbench.backends import registry
from kdbench.families import tree_verify_mla as fam
from kdbench.shapes import TreeVerifyMlaShape

REASON = registry.available("flashinfer_cascade", "cuda" if torch.cuda.is_available() else "cpu")[1]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=f"FlashInfer peers: {REASON}")]

TOL = config.Tolerance(rtol=0.05, atol=0.02, rel_l2=0.01, max_outside_pct=0.1)   # the scenario's bf16 figures


def _case(backend: str, seed: int, **shape) -> config.Case:
    return config.Case("t", "kernel", f"peer-{seed}", "tree_verify_mla", (backend,), TreeVerifyMlaShape(**shape),
                       "bfloat16", seed, 1, TOL, config.Timing(), "test")


CASCADE = [dict(batch=3, heads=16, nodes=65, past_len=300, ragged=True),
           dict(batch=2, heads=64, nodes=17, past_len=4097, ragged=True, padding=2),   # padding rows: o 0
           dict(batch=1, heads=8, nodes=1, past_len=1),                                # context 1, one node
           dict(batch=2, heads=128, nodes=129, past_len=63)]                           # 3 mask words, H 128


@pytest.mark.parametrize("backend", ["flashinfer_cascade", "flashinfer_prefix"])
@pytest.mark.parametrize("shape", CASCADE, ids=lambda s: f"B{s['batch']}H{s['heads']}T{s['nodes']}")
def test_peer_matches_its_float64_truth(backend, shape):
    case = _case(backend, 11 + shape["nodes"], **shape)
    inputs = fam.make_inputs(case, case.seed)
    want = fam.reference_for(backend, inputs, case) or fam.reference(inputs, case)
    res = fam.check(fam.run(backend, inputs, case, "cuda"), want, TOL)
    assert res.passed, res.worst
    assert "lse" in fam.run(backend, inputs, case, "cuda")     # natural-log lse, checked with o_lat


def test_prefix_peer_is_not_the_full_answer():
    """flashinfer_prefix skips the tree block: against the full reference it must fail (the label is true)."""
    case = _case("flashinfer_prefix", 5, batch=2, heads=16, nodes=65, past_len=64)
    inputs = fam.make_inputs(case, 5)
    assert not fam.check(fam.run("flashinfer_prefix", inputs, case, "cuda"), fam.reference(inputs, case), TOL).passed


@pytest.mark.parametrize("nodes", [1, 17, 65])
def test_causal_peer_on_chains(nodes):
    case = _case("flashinfer_causal", 20 + nodes, batch=2, heads=64, nodes=nodes, past_len=1000, ragged=True,
                 tree="chain")
    inputs = fam.make_inputs(case, case.seed)
    res = fam.check(fam.run("flashinfer_causal", inputs, case, "cuda"), fam.reference(inputs, case), TOL)
    assert res.passed, res.worst


def test_causal_peer_refuses_random_trees():
    case = _case("flashinfer_causal", 1, batch=1, heads=8, nodes=17, past_len=10)
    assert "chain" in fam.unsupported("flashinfer_causal", case)
