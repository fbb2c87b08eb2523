"""tree_build family: draft logits [B, L, V] -> per-request DDTrees padded to N = max_budget + 1 rows.

Backends: numpy_ref (the reference heap), torch (torch topk + logsumexp on the device, copy to the host,
Python heap: what serving stacks do), cpu_heap (the same with the C++ heap), cuda (the fused vocabulary pass
+ GPU best-first builder).

The check has two levels, because the backends' log-probs are float32 (x - lse) and the reference's float64:
(1) the top-K each backend built its trees from (TreeBatch.top_lp / top_tok) against the reference's, tokens
exactly and log-probs within TOPK_LP_TOL; (2) its trees bit-exact against the reference heap run on that top-K. A direct tree comparison would flag near-ties
below float32 resolution (seen on the H200: score gaps of 3e-8 and 3e-7 among 257 popped nodes) as bugs.
"""
from __future__ import annotations

import numpy as np

from kdbench.backends import registry
from kdbench.check import merge
from kdbench.config import Tolerance
from kdbench.families import common
from kdbench.references import tree_build as ref

EXACT = ("tokens", "parents", "depths", "first_child", "next_sibling", "n_nodes", "anc")
TOPK = ("top_lp", "top_tok")        # [B, L, K]: K = min(budget, V), the columns the builder can use
TOPK_LP_TOL = Tolerance(rtol=1e-6, atol=1e-5)   # float32 x - lse against float64 (lse ~ 10: 1e-6 of it)
BUILD_INPUTS = "build_inputs"       # not an output: budgets and roots, to rebuild trees from a backend's top-K


def make_inputs(case, seed: int) -> dict:
    shape, rng = case.shape, np.random.default_rng(seed)
    b, l, v = shape.batch, shape.depth, shape.vocab
    dtype = common.run_dtype(case.dtype)
    if shape.logits == "ties":      # few distinct values: many exact ties inside and across rows
        logits = common.round_to(rng.integers(-4, 5, size=(b, l, v)).astype(np.float64) * 0.5, dtype)
    elif shape.logits == "peaked":  # one dominant token per row, like a confident drafter
        logits = common.standard_normal(rng, (b, l, v), "float32")
        logits[np.arange(b)[:, None], np.arange(l)[None, :], rng.integers(0, v, (b, l))] += 12.0
        logits = common.round_to(logits, dtype)
    else:                           # float32 draws on threads: B 64 x 15 x 163840 is 1.6e8 of them
        logits = common.standard_normal(rng, (b, l, v), dtype, scale=3.0)
    budgets = (rng.integers(1, shape.budget + 1, size=b) if shape.ragged_budgets and shape.budget > 0
               else np.full(b, shape.budget))
    return {
        "logits": logits,                                     # [B, L, V] float32 (bf16 values for bf16)
        "budgets": budgets.astype(np.int32),                  # [B]
        "root_tokens": rng.integers(0, v, size=b).astype(np.int64),
        "past_lens": rng.integers(1, 4096, size=b).astype(np.int32),
    }


def _k(case) -> int:
    return min(case.shape.budget, case.shape.vocab)


def reference(inputs: dict, case) -> dict:
    tops = [ref.topk_logprobs(inputs["logits"][b], _k(case)) for b in range(case.shape.batch)]
    out = trees_from_topk([t[0] for t in tops], [t[1] for t in tops], inputs["budgets"], inputs["root_tokens"],
                          case.shape.budget + 1)
    out["top_lp"], out["top_tok"] = np.stack([t[0] for t in tops]), np.stack([t[1] for t in tops])
    out[BUILD_INPUTS] = {"budgets": inputs["budgets"], "root_tokens": inputs["root_tokens"]}
    return out


def trees_from_topk(top_lp, top_tok, budgets, roots, n: int) -> dict:
    """The reference heap (Algorithm 1) on per-request top-K tables -> padded tree arrays [B, N, ...]."""
    rows = []
    for b in range(len(budgets)):
        tree = ref.build_tree_from_topk(np.asarray(top_lp[b], dtype=np.float64), np.asarray(top_tok[b]),
                                        int(budgets[b]), int(roots[b]))
        arrays = ref.pad_tree_arrays(tree, n)
        arrays["anc"] = arrays["bitmask"]                      # [N, W] uint64
        rows.append(arrays)
    out = {k: np.stack([r[k] for r in rows]) for k in EXACT if k != "n_nodes"}
    out["n_nodes"] = np.array([int(np.asarray(r["n_nodes"])) for r in rows])
    return out


def run(backend: str, inputs: dict, case, device: str) -> dict:
    return outputs(backend, timed(backend, inputs, case, device)(), inputs, case)


def outputs(backend: str, result, inputs: dict, case) -> dict:
    """A timed call's TreeBatch -> the checked numpy arrays."""
    tree = result
    out = {k: common.to_numpy(getattr(tree, k)).astype(np.int64) for k in EXACT if k != "anc"}
    out["anc"] = common.to_numpy(tree.anc).view(np.uint64)
    k = _k(case)
    if k > 0 and case.shape.depth > 0:   # the top-K the trees were built from (the kernel's own vocabulary pass)
        out["top_lp"] = common.to_numpy(tree.top_lp[..., :k])
        out["top_tok"] = common.to_numpy(tree.top_tok[..., :k]).astype(np.int64)
    return out


def timed(backend: str, inputs: dict, case, device: str):
    build = registry.get(backend).op("tree_build")
    logits = common.to_torch(inputs["logits"], device, common.run_dtype(case.dtype))
    budgets = common.to_torch(inputs["budgets"], device)
    roots = common.to_torch(inputs["root_tokens"], device)
    past = common.to_torch(inputs["past_lens"], device)
    return lambda: build(logits, budgets, roots, past, case.shape.budget)


unsupported = common.every_backend      # every backend runs every case of this family
reference_for = common.case_reference   # and does the whole work


def check(got: dict, want: dict, tol):
    """The two-level check of the module docstring; trees only when there is no top-K (depth 0, budget 0)."""
    trees = {k: v for k, v in want.items() if k in EXACT}
    if not all(k in got for k in TOPK):
        return common.check_outputs(got, trees, tol, exact_keys=EXACT)
    meta = want[BUILD_INPUTS]
    same_topk = all(np.array_equal(np.asarray(got[k], dtype=want[k].dtype), want[k]) for k in TOPK)
    # the reference's trees were built from exactly these tables (numpy_ref): no second heap run
    own = trees if same_topk else trees_from_topk(got["top_lp"], got["top_tok"], meta["budgets"],
                                                  meta["root_tokens"], want["parents"].shape[1])
    return merge([common.check_outputs(got, {k: want[k] for k in TOPK}, TOPK_LP_TOL, exact_keys=("top_tok",)),
                  common.check_outputs(got, own, tol, exact_keys=EXACT)])


def bytes_moved(case, inputs: dict) -> float:
    """Logits read once: the floor of the vocabulary pass (the tree outputs are negligible beside it)."""
    s = case.shape
    return float(s.batch * s.depth * s.vocab * common.ELEMENT_BYTES[common.run_dtype(case.dtype)])


def flops(case, inputs: dict) -> float:
    """exp + add per logit for the logsumexp and one compare per logit for the selection: ~3 per element."""
    s = case.shape
    return 3.0 * s.batch * s.depth * s.vocab
