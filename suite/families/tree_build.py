"""tree_build family: draft logits [B, L, V] -> per-request DDTrees padded to N = max_budget + 1 rows.

Backends: numpy_ref (the reference heap), torch (torch topk + logsumexp on the device, copy to the host,
Python heap: what serving stacks do), cpu_heap (the same with the C++ heap), cuda (the fused vocabulary pass
+ GPU best-first builder).
"""
from __future__ import annotations

import numpy as np

from kdbench.families import common
from kdbench.references import tree_build as ref

BACKENDS = ("numpy_ref", "torch", "cpu_heap", "cuda")
EXACT = ("tokens", "parents", "depths", "first_child", "next_sibling", "n_nodes", "anc")


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


def reference(inputs: dict, case) -> dict:
    n = case.shape.budget + 1
    rows = []
    for b in range(case.shape.batch):
        tree = ref.build_tree(inputs["logits"][b], int(inputs["budgets"][b]), int(inputs["root_tokens"][b]))
        arrays = ref.pad_tree_arrays(tree, n)
        arrays["anc"] = arrays["bitmask"]                      # [N, W] uint64
        rows.append(arrays)
    out = {k: np.stack([r[k] for r in rows]) for k in EXACT if k != "n_nodes"}
    out["n_nodes"] = np.array([int(np.asarray(r["n_nodes"])) for r in rows])
    return out


def run(backend: str, inputs: dict, case, device: str) -> dict:
    if backend == "numpy_ref":
        return reference(inputs, case)
    tree = timed(backend, inputs, case, device)()
    out = {k: common.to_numpy(getattr(tree, k)).astype(np.int64) for k in EXACT if k != "anc"}
    out["anc"] = common.to_numpy(tree.anc).view(np.uint64)
    return out


def timed(backend: str, inputs: dict, case, device: str):
    if backend == "numpy_ref":
        return lambda: reference(inputs, case)
    module = common.backend_module(backend)
    logits = common.to_torch(inputs["logits"], device, common.run_dtype(case.dtype))
    budgets = common.to_torch(inputs["budgets"], device)
    roots = common.to_torch(inputs["root_tokens"], device)
    past = common.to_torch(inputs["past_lens"], device)
    return lambda: module.tree_build(logits, budgets, roots, past, case.shape.budget)


def check(got: dict, want: dict, tol):
    return common.check_outputs(got, want, tol, exact_keys=EXACT)


def bytes_moved(case, inputs: dict) -> float:
    """Logits read once: the floor of the vocabulary pass (the tree outputs are negligible beside it)."""
    s = case.shape
    return float(s.batch * s.depth * s.vocab * common.ELEMENT_BYTES[common.run_dtype(case.dtype)])


def flops(case, inputs: dict) -> float:
    """exp + add per logit for the logsumexp and one compare per logit for the selection: ~3 per element."""
    s = case.shape
    return 3.0 * s.batch * s.depth * s.vocab
