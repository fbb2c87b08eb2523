"""DDTree acceptance: the greedy tree walk (T = 0) and the lossless sampled rule (T > 0: one target
sample per node by inverse CDF, then the same walk). numpy float64; see ../shared/notes/ddtree.md §4."""
from __future__ import annotations

import numpy as np

from .tree_build import Tree


def _child_maps(tree: Tree) -> list[dict[int, int]]:
    """token -> child index, per node. Siblings carry distinct tokens (distinct ranks at one depth)."""
    maps: list[dict[int, int]] = [{} for _ in range(tree.size)]
    for i in range(1, tree.size):
        maps[tree.parents[i]][int(tree.tokens[i])] = i
    return maps


def accept_greedy(tree: Tree, target_tokens) -> tuple[np.ndarray, int]:
    """target_tokens [n+1] int: the target's chosen token at every node (argmax at T = 0).

    Walk from the root: while target_tokens[cur] is the token of a child of cur, move to that child.
    Returns (accepted node indices, root first, int64 [tau]; bonus = target_tokens[last accepted]).
    The committed tokens are tree.tokens[accepted]; the bonus is the next round's root, not in the KV.
    """
    t = np.asarray(target_tokens)
    if t.shape != (tree.size,) or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"target_tokens must be an int array of shape ({tree.size},), got {t.dtype} {t.shape}")
    children = _child_maps(tree)
    cur, accepted = 0, [0]
    while int(t[cur]) in children[cur]:
        cur = children[cur][int(t[cur])]
        accepted.append(cur)
    return np.array(accepted, dtype=np.int64), int(t[cur])


def sample_inverse_cdf(probs, u: float) -> int:
    """One draw from unnormalised probs [V] given a uniform u in [0, 1).

    Rule (the CUDA kernel must match it): p = probs upcast to float64; c = the sequential float64
    running sum, c[j] = (((p[0] + p[1]) + p[2]) + ... + p[j]) (np.cumsum, which is sequential, not
    pairwise); t = u * c[V-1]; return the smallest j with t < c[j].
    A zero-probability token j has c[j] == c[j-1] <= t (or c[0] == 0 <= t), so it is never returned;
    t < c[V-1] for every u < 1, so some j exists.
    """
    p = np.asarray(probs).astype(np.float64)  # [V]
    if p.ndim != 1 or len(p) == 0:
        raise ValueError(f"probs must be a non-empty 1-D array, got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("probs must be finite and >= 0")
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    c = np.cumsum(p)                          # [V] sequential float64 running sum
    if c[-1] <= 0:
        raise ValueError("probs sum to 0")
    return int(np.searchsorted(c, u * c[-1], side="right"))  # first j with c[j] > t


def sample_per_node(target_probs, uniforms) -> np.ndarray:
    """target_probs [n+1, V], uniforms [n+1] -> [n+1] int64, one inverse-CDF sample per tree row."""
    p = np.asarray(target_probs)
    u = np.asarray(uniforms, dtype=np.float64)
    if p.ndim != 2 or u.shape != (p.shape[0],):
        raise ValueError(f"need target_probs [n+1, V] and uniforms [n+1], got {p.shape} and {u.shape}")
    return np.array([sample_inverse_cdf(p[i], float(u[i])) for i in range(len(u))], dtype=np.int64)


def accept_sampled(tree: Tree, target_probs, uniforms) -> tuple[np.ndarray, int]:
    """Lossless sampled acceptance (the paper's rule): sample every node from the target (inverse CDF
    with its own uniform), then the greedy walk over those samples. Every committed token is then a
    draw from the target's conditional at its true prefix; no draft probabilities are needed."""
    if np.asarray(target_probs).shape[0] != tree.size:
        raise ValueError(f"target_probs has {np.asarray(target_probs).shape[0]} rows, tree has {tree.size}")
    return accept_greedy(tree, sample_per_node(target_probs, uniforms))


def accept_batch(trees: list[Tree], target_tokens) -> list[tuple[np.ndarray, int]]:
    """Greedy acceptance per request. target_tokens: a list of [n_b+1] arrays, or one padded
    [B, n_max] array (padding rows are unreachable, so their values never matter)."""
    if len(target_tokens) != len(trees):
        raise ValueError(f"{len(trees)} trees but {len(target_tokens)} target rows")
    return [accept_greedy(tree, np.asarray(t)[: tree.size]) for tree, t in zip(trees, target_tokens)]
