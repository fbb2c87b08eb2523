"""DDTree tree build (paper Algorithm 1), its variants (chain, width-capped, static k-ary), a brute-force
oracle, and the layouts a verify pass needs (visibility, positions, first-child/next-sibling, bitmask,
padding). numpy float64; see ../shared/notes/ddtree.md §2 and plans/0002-references.md."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # eq=False: numpy fields make dataclass __eq__/__hash__ ill-defined
class Tree:
    """Nodes in pop order (score non-increasing); index 0 is the root (the bonus token)."""
    tokens: np.ndarray   # [n+1] int64, tokens[0] = root token
    parents: np.ndarray  # [n+1] int64, parents[0] = -1
    depths: np.ndarray   # [n+1] int64, depths[0] = 0
    ranks: np.ndarray    # [n+1] int64, rank of the token at its depth (0-based); ranks[0] = -1
    scores: np.ndarray   # [n+1] float64, log Q(prefix); scores[0] = 0.0

    def __post_init__(self):
        n1 = len(self.tokens)
        for name, dtype in (("tokens", np.int64), ("parents", np.int64), ("depths", np.int64),
                            ("ranks", np.int64), ("scores", np.float64)):
            arr = np.array(getattr(self, name), dtype=dtype)  # a private copy in the documented dtype
            if arr.shape != (n1,):
                raise ValueError(f"Tree.{name} has shape {arr.shape}, expected ({n1},)")
            arr.setflags(write=False)  # frozen means frozen: callers copy before editing
            object.__setattr__(self, name, arr)

    @property
    def size(self) -> int:
        return len(self.tokens)


def _make_tree(root_token: int, nodes: list[tuple[int, int, int, int, float]]) -> Tree:
    """nodes: (token, parent, depth, rank, score) for nodes 1..n, in order."""
    cols = list(zip(*nodes)) if nodes else [(), (), (), (), ()]
    i64 = lambda head, col: np.array([head, *col], dtype=np.int64)  # noqa: E731
    return Tree(tokens=i64(root_token, cols[0]), parents=i64(-1, cols[1]), depths=i64(0, cols[2]),
                ranks=i64(-1, cols[3]), scores=np.array([0.0, *cols[4]], dtype=np.float64))


# ---------------------------------------------------------------------------------------------------
# top-K log-probs
# ---------------------------------------------------------------------------------------------------

def topk_logprobs(draft_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-depth top-K of the full-vocabulary log-softmax.

    draft_logits [L, V], any float dtype, upcast exactly to float64. K = min(k, V).
    Returns (top_lp [L, K] float64, top_tok [L, K] int64).
    Order (the CUDA kernel must match it): by the input logit value descending, and among exactly equal
    logits by smaller token id first. lp = logit - lse is then non-increasing along each row, so this is
    also "sorted by log-prob descending, ties by smaller token id".
    lse = m + log(sum(exp(x - m))), m = row max, over all V tokens, so every lp <= 0.
    -inf logits are allowed (lp = -inf); NaN, +inf or an all -inf row raise ValueError.
    """
    x = np.asarray(draft_logits)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"draft_logits must be a 2-D float array [L, V], got {x.dtype} {x.shape}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    x = x.astype(np.float64)                                       # [L, V]
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("draft_logits contains NaN or +inf")
    L, V = x.shape
    m = x.max(axis=1, keepdims=True) if V else np.zeros((L, 1))    # [L, 1]
    if L and V and np.isneginf(m).any():
        raise ValueError("a row of draft_logits is all -inf (no token has probability > 0)")
    lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))     # [L, 1]
    K = min(k, V)
    top_tok = np.stack([_topk_row(row, K) for row in x]) if L else np.zeros((0, K), np.int64)
    top_tok = top_tok.reshape(L, K).astype(np.int64)
    top_lp = np.take_along_axis(x, top_tok, axis=1) - lse          # [L, K]
    return top_lp, top_tok


def _topk_row(row: np.ndarray, K: int) -> np.ndarray:
    """Token ids of the K largest values, (value desc, id asc); O(V) selection then an O(K log K) sort."""
    if K == 0:
        return np.zeros(0, np.int64)
    thr = np.partition(row, len(row) - K)[len(row) - K]            # the K-th largest value
    above = np.flatnonzero(row > thr)
    at = np.flatnonzero(row == thr)[: K - len(above)]              # ties at the cut: smallest ids
    sel = np.concatenate([above, at])
    return sel[np.lexsort((sel, -row[sel]))]                       # primary -value, secondary id


# ---------------------------------------------------------------------------------------------------
# Algorithm 1: best-first build over rank tuples
# ---------------------------------------------------------------------------------------------------

def _check_top(top_lp: np.ndarray, top_tok: np.ndarray) -> None:
    if top_lp.ndim != 2 or top_tok.shape != top_lp.shape:
        raise ValueError(f"top_lp {top_lp.shape} and top_tok {top_tok.shape} must both be [L, K]")
    if np.isnan(top_lp).any() or (top_lp > 0).any():
        raise ValueError("top_lp must be log-probs: no NaN, every value <= 0")
    if (top_lp[:, 1:] > top_lp[:, :-1]).any():  # a comparison, not np.diff: -inf - -inf is NaN
        raise ValueError("each row of top_lp must be sorted descending (rank 0 = most probable)")


def build_tree_from_topk(top_lp: np.ndarray, top_tok: np.ndarray, budget: int, root_token: int) -> Tree:
    """Algorithm 1 on per-depth top-K log-probs [L, K] (rows sorted descending).

    Pops the `budget` best prefixes (the root is not counted). Heap key (-score, rank_tuple): on an exact
    score tie the lexicographically smaller rank tuple pops first (a prefix before its extensions).
    Scores are float64; a sibling's score is updated incrementally, s - lp[r] + lp[r+1], and a first
    child's is s + lp[d, 0], exactly as the official code. Entries whose new log-prob is -inf (zero
    probability) are never pushed, so the tree can be smaller than `budget` only when fewer prefixes
    of positive probability exist.
    """
    top_lp = np.asarray(top_lp, dtype=np.float64)    # [L, K]
    top_tok = np.asarray(top_tok, dtype=np.int64)    # [L, K]
    _check_top(top_lp, top_tok)
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    L, K = top_lp.shape
    nodes: list[tuple[int, int, int, int, float]] = []
    heap: list[tuple] = []
    if budget > 0 and L > 0 and K > 0 and top_lp[0, 0] > -np.inf:
        s0 = float(top_lp[0, 0])
        heap.append((-s0, (0,), 0, 1, 0, s0))        # (-score, ranks, parent, depth, rank, score)
    while heap and len(nodes) < budget:
        _, ranks, parent, d, r, s = heapq.heappop(heap)
        nodes.append((int(top_tok[d - 1, r]), parent, d, r, s))
        node = len(nodes)                            # index of the node just popped
        if r + 1 < K and top_lp[d - 1, r + 1] > -np.inf:
            s_sib = s - float(top_lp[d - 1, r]) + float(top_lp[d - 1, r + 1])
            heapq.heappush(heap, (-s_sib, ranks[:-1] + (r + 1,), parent, d, r + 1, s_sib))
        if d < L and top_lp[d, 0] > -np.inf:
            s_child = s + float(top_lp[d, 0])
            heapq.heappush(heap, (-s_child, ranks + (0,), node, d + 1, 0, s_child))
    return _make_tree(root_token, nodes)


def build_tree(draft_logits: np.ndarray, budget: int, root_token: int) -> Tree:
    """DDTree: K = min(budget, V) per depth (Lemma 1: nothing beyond top-budget can enter); budget 0 -> root."""
    top_lp, top_tok = topk_logprobs(draft_logits, max(budget, 0))
    return build_tree_from_topk(top_lp, top_tok, budget, root_token)


def build_tree_batch(draft_logits: np.ndarray, budgets, root_tokens) -> list[Tree]:
    """draft_logits [B, L, V], budgets [B], root_tokens [B] -> one Tree per request."""
    x = np.asarray(draft_logits)
    if x.ndim != 3 or len(budgets) != len(x) or len(root_tokens) != len(x):
        raise ValueError(f"need draft_logits [B, L, V] with B budgets and B root tokens, got "
                         f"{x.shape}, {len(budgets)} budgets, {len(root_tokens)} root tokens")
    return [build_tree(x[b], int(budgets[b]), int(root_tokens[b])) for b in range(len(x))]


def build_chain(draft_logits: np.ndarray, root_token: int, length: int | None = None) -> Tree:
    """Vanilla DFlash: the argmax token at depths 1..length (default L), one child per node.

    Same as Algorithm 1 with K = 1 and budget = length (argmax ties -> smaller token id)."""
    L = np.asarray(draft_logits).shape[0]
    length = L if length is None else length
    if not 0 <= length <= L:
        raise ValueError(f"length must be in [0, L={L}], got {length}")
    top_lp, top_tok = topk_logprobs(draft_logits, 1)
    return build_tree_from_topk(top_lp[:length], top_tok[:length], length, root_token)


def build_tree_width_capped(draft_logits: np.ndarray, budget: int, root_token: int, max_width: int) -> Tree:
    """Algorithm 1 with at most max_width candidate tokens per depth: K = min(budget, V, max_width)."""
    if max_width < 1:
        raise ValueError(f"max_width must be >= 1, got {max_width}")
    top_lp, top_tok = topk_logprobs(draft_logits, min(max(budget, 0), max_width))
    return build_tree_from_topk(top_lp, top_tok, budget, root_token)


def _rank_tuples_scores(top_lp: np.ndarray, widths) -> list[tuple[float, tuple[int, ...]]]:
    """Every rank tuple of depth 1..len(widths) with ranks[i] < widths[i], scored by a plain sum."""
    out = []
    for d in range(1, len(widths) + 1):
        for ranks in itertools.product(*(range(w) for w in widths[:d])):
            out.append((float(sum(top_lp[i, r] for i, r in enumerate(ranks))), ranks))
    return out


def build_static_kary(draft_logits: np.ndarray, root_token: int, branching: tuple[int, ...]) -> Tree:
    """Static tree for acceptance studies: every node at depth i has branching[i] children, the
    top-branching[i] tokens of depth i+1. len(branching) <= L. Nodes are ordered as Algorithm 1 would
    pop them, (-score, rank tuple), so every invariant of a built tree holds; score = sum of lp on the
    path."""
    branching = tuple(int(b) for b in branching)
    L, V = np.asarray(draft_logits).shape
    if len(branching) > L or any(not 1 <= b <= V for b in branching):
        raise ValueError(f"branching {branching} needs len <= L={L} and every entry in [1, V={V}]")
    top_lp, top_tok = topk_logprobs(draft_logits, max(branching, default=0))
    prefixes = sorted(_rank_tuples_scores(top_lp, branching), key=lambda e: (-e[0], e[1]))
    index = {(): 0}
    nodes = []
    for i, (score, ranks) in enumerate(prefixes, start=1):
        index[ranks] = i
        d = len(ranks)
        nodes.append((int(top_tok[d - 1, ranks[-1]]), index[ranks[:-1]], d, ranks[-1], score))
    return _make_tree(root_token, nodes)


def brute_force_top_prefixes(top_lp: np.ndarray, budget: int) -> list[tuple[int, ...]]:
    """Oracle: enumerate all K + K^2 + ... + K^L rank tuples (zero-probability ones excluded), sort by
    (-score, rank tuple) with score a plain sum, return the first `budget`. Small L, K only."""
    top_lp = np.asarray(top_lp, dtype=np.float64)  # [L, K]
    L, K = top_lp.shape
    if sum(K ** d for d in range(1, L + 1)) > 2_000_000:
        raise ValueError(f"brute force over L={L}, K={K} is too large")
    scored = [e for e in _rank_tuples_scores(top_lp, (K,) * L) if e[0] > -np.inf]
    scored.sort(key=lambda e: (-e[0], e[1]))
    return [ranks for _, ranks in scored[:budget]]


def prefix_ranks(tree: Tree) -> list[tuple[int, ...]]:
    """Rank tuple of every node (root = ()), for comparing with brute_force_top_prefixes."""
    out: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):
        out.append(out[tree.parents[i]] + (int(tree.ranks[i]),))
    return out


# ---------------------------------------------------------------------------------------------------
# layouts for verify and accept
# ---------------------------------------------------------------------------------------------------

def visibility(tree: Tree) -> np.ndarray:
    """[n+1, n+1] bool, vis[i, j] = node j is an ancestor-or-self of node i (root visible to all)."""
    n1 = tree.size
    vis = np.zeros((n1, n1), dtype=bool)
    vis[0, 0] = True
    for i in range(1, n1):
        vis[i, :i] = vis[tree.parents[i], :i]  # parent < i, so its row is final
        vis[i, i] = True
    return vis


def positions(tree: Tree, past_len: int) -> np.ndarray:
    """[n+1] int64 RoPE positions: past_len + depth (siblings share a position)."""
    return (past_len + tree.depths).astype(np.int64)


def first_child_next_sibling(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """EAGLE LCRS layout: (first_child [n+1], next_sibling [n+1]) int64, -1 = none. Children are linked
    in increasing index order, which is rank order (invariant 2.5(2))."""
    n1 = tree.size
    first = np.full(n1, -1, dtype=np.int64)
    nxt = np.full(n1, -1, dtype=np.int64)
    last = np.full(n1, -1, dtype=np.int64)  # last child linked so far, per parent
    for i in range(1, n1):
        p = tree.parents[i]
        if first[p] < 0:
            first[p] = i
        else:
            nxt[last[p]] = i
        last[p] = i
    return first, nxt


def _pack_bits(vis: np.ndarray, n_words: int) -> np.ndarray:
    """[R, C] bool -> [R, n_words] uint64; column j goes to word j // 64, bit j % 64 (LSB first)."""
    out = np.zeros((vis.shape[0], n_words), dtype=np.uint64)
    for j in np.flatnonzero(vis.any(axis=0)):
        out[:, j // 64] |= vis[:, j].astype(np.uint64) << np.uint64(j % 64)
    return out


def ancestor_bitmask(tree: Tree, n_words: int | None = None) -> np.ndarray:
    """[n+1, W] uint64, W = ceil((n+1)/64) by default: bit j % 64 of word j // 64 in row i is set iff
    node j is an ancestor-or-self of node i."""
    need = -(-tree.size // 64)
    n_words = need if n_words is None else n_words
    if n_words < need:
        raise ValueError(f"n_words={n_words} < {need} words needed for {tree.size} nodes")
    return _pack_bits(visibility(tree), n_words)


def pad_tree_arrays(tree: Tree, n_max: int) -> dict[str, np.ndarray]:
    """Fixed-size [n_max] arrays for batching. Padding rows (index >= tree.size): parent 0, depth 1,
    token = root token, rank -1, score -inf, no children and not linked as anyone's child (so
    unreachable by the accept walk), and they see only the root and themselves."""
    n1 = tree.size
    if n_max < n1:
        raise ValueError(f"n_max={n_max} < tree.size={n1}")
    pad = n_max - n1

    def fill(arr, value, dtype):
        return np.concatenate([arr, np.full(pad, value, dtype=dtype)]).astype(dtype)

    vis = np.zeros((n_max, n_max), dtype=bool)
    vis[:n1, :n1] = visibility(tree)
    vis[n1:, 0] = True
    vis[np.arange(n1, n_max), np.arange(n1, n_max)] = True
    first, nxt = first_child_next_sibling(tree)
    return {
        "tokens": fill(tree.tokens, tree.tokens[0], np.int64),
        "parents": fill(tree.parents, 0, np.int64),
        "depths": fill(tree.depths, 1, np.int64),
        "ranks": fill(tree.ranks, -1, np.int64),
        "scores": fill(tree.scores, -np.inf, np.float64),
        "first_child": fill(first, -1, np.int64),
        "next_sibling": fill(nxt, -1, np.int64),
        "visibility": vis,                                        # [n_max, n_max] bool
        "bitmask": _pack_bits(vis, -(-n_max // 64)),              # [n_max, ceil(n_max/64)] uint64
        "n_nodes": np.array(n1, dtype=np.int64),                  # 0-d: real rows are [0, n_nodes)
    }
