"""The adaptive tree policy (the CaDDTree idea): per round, grow the DDTree in its pop order only while the
expected tokens per unit of verify cost still rises. Expected tokens of the first n nodes = 1 + sum of their
prefix masses exp(score) (DDTree's surrogate, notes/ddtree.md §2.3); cost = 1 + row_cost * n, in units of a
root-only verify, so row_cost is the marginal verify cost of one tree row (suite/costmodel.py gives it)."""
from __future__ import annotations

import numpy as np

from kdbench.references.tree_build import Tree

from .torch_ops import BuildOne, build_ddtree


def best_size(scores: np.ndarray, row_cost: float) -> int:
    """scores [n+1] (pop order, root first) -> the node count n* in 0..n maximizing
    (1 + sum_{i<=n*} exp(scores[i])) / (1 + row_cost * n*); ties go to the smaller tree."""
    gain = np.exp(np.asarray(scores[1:], dtype=np.float64))
    n = np.arange(len(gain) + 1)
    ratio = (1.0 + np.concatenate(([0.0], np.cumsum(gain)))) / (1.0 + row_cost * n)
    return int(np.argmax(ratio))  # argmax returns the first maximum


def adaptive(row_cost: float) -> BuildOne:
    """Algorithm 1 up to `budget` nodes, cut to its best_size prefix (the first n pops of Algorithm 1 are
    Algorithm 1 at budget n: the pop order does not depend on the budget)."""
    if not row_cost >= 0:
        raise ValueError(f"row_cost must be >= 0, got {row_cost}")

    def build(lp: np.ndarray, tok: np.ndarray, budget: int, root: int) -> Tree:
        full = build_ddtree(lp, tok, budget, root)
        return build_ddtree(lp, tok, best_size(full.scores, row_cost), root)
    return build
