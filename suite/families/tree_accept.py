"""tree_accept family: walk each request's tree with the target's tokens (greedy argmax, or one inverse-CDF
sample per node from given uniforms) -> accepted rows (root first), accept length, bonus token."""
from __future__ import annotations

import numpy as np

from kdbench.backends import registry
from kdbench.families import common
from kdbench.references import tree_accept as ref
from kdbench.references import tree_build

EXACT = ("accepted", "accept_len", "bonus")


def make_inputs(case, seed: int) -> dict:
    s, rng = case.shape, np.random.default_rng(seed)
    n = s.budget + 1
    trees = [tree_build.build_tree(rng.normal(0, 2.0, (s.depth, s.vocab)), int(rng.integers(0, s.budget + 1)),
                                   int(rng.integers(0, s.vocab))) for _ in range(s.batch)]
    padded = [tree_build.pad_tree_arrays(t, n) for t in trees]
    out = {k: np.stack([p[k] for p in padded]) for k in ("tokens", "first_child", "next_sibling")}
    out["n_nodes"] = np.array([t.size for t in trees], dtype=np.int32)
    if s.mode == "greedy":
        out["target_tokens"] = np.stack([_targets_along_a_path(t, n, s.vocab, rng) for t in trees])
    else:
        probs = rng.dirichlet(np.full(s.vocab, 0.3), size=(s.batch, n))
        for b, t in enumerate(trees):   # put mass on the children so that walks go deep
            for i in range(t.size):
                kids = t.tokens[t.parents == i]
                probs[b, i, kids] += rng.uniform(0, 3.0, len(kids))
        probs /= probs.sum(-1, keepdims=True)
        out["target_probs"] = common.round_to(probs, "float32")
        out["uniforms"] = rng.uniform(0, 1, (s.batch, n))
    out["_trees"] = trees
    return out


def _targets_along_a_path(tree, n: int, vocab: int, rng) -> np.ndarray:
    """Random targets, except along the path to a random node, so the accepted walk goes deep."""
    targets = rng.integers(0, vocab, size=n).astype(np.int64)
    node = int(rng.integers(0, tree.size))
    while node > 0:
        parent = int(tree.parents[node])
        targets[parent] = tree.tokens[node]
        node = parent
    return targets


def reference(inputs: dict, case) -> dict:
    width = case.shape.depth + 1
    acc = np.full((case.shape.batch, width), -1, dtype=np.int64)
    lens = np.zeros(case.shape.batch, dtype=np.int64)
    bonus = np.zeros(case.shape.batch, dtype=np.int64)
    for b, tree in enumerate(inputs["_trees"]):
        size = tree.size
        if case.shape.mode == "greedy":
            a, bonus[b] = ref.accept_greedy(tree, inputs["target_tokens"][b, :size])
        else:
            a, bonus[b] = ref.accept_sampled(tree, inputs["target_probs"][b, :size], inputs["uniforms"][b, :size])
        acc[b, :len(a)] = a
        lens[b] = len(a)
    return {"accepted": acc, "accept_len": lens, "bonus": bonus}


def run(backend: str, inputs: dict, case, device: str) -> dict:
    return outputs(backend, timed(backend, inputs, case, device)(), inputs, case)


def outputs(backend: str, result, inputs: dict, case) -> dict:
    return {k: common.to_numpy(getattr(result, k)).astype(np.int64) for k in EXACT}


def timed(backend: str, inputs: dict, case, device: str):
    entry = registry.get(backend)
    t = {k: common.to_torch(inputs[k], device) for k in ("tokens", "n_nodes")}
    for k in ("first_child", "next_sibling"):
        t[k] = common.to_torch(inputs[k].astype(np.int32), device)
    args = (t["tokens"], t["first_child"], t["next_sibling"], t["n_nodes"])
    depth = case.shape.depth
    if case.shape.mode == "greedy":
        target = common.to_torch(inputs["target_tokens"], device)
        accept = entry.op("tree_accept_greedy")
        return lambda: accept(*args, target, depth)
    probs = common.to_torch(inputs["target_probs"], device, "float32")
    uniforms = common.to_torch(inputs["uniforms"], device)
    accept = entry.op("tree_accept_sampled")
    return lambda: accept(*args, probs, uniforms, depth)


unsupported = common.every_backend      # every backend runs every case of this family
reference_for = common.case_reference   # and does the whole work


def check(got: dict, want: dict, tol):
    return common.check_outputs(got, want, tol, exact_keys=EXACT)


def bytes_moved(case, inputs: dict) -> float:
    """Tree arrays and targets read once (greedy); the node rows of the probabilities (sampled)."""
    s = case.shape
    n = s.budget + 1
    per_node = 8 + 4 + 4 + (8 if s.mode == "greedy" else 4 * s.vocab + 8)
    return float(s.batch * n * per_node)


def flops(case, inputs: dict) -> float:
    s = case.shape
    return float(s.batch * (s.budget + 1) * (1 if s.mode == "greedy" else s.vocab))
