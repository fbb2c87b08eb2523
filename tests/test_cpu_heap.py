"""The C++ CPU heap (kdbench._cpu_heap, csrc/tree_build_cpu.h) equals the Python reference heap
(build_tree_from_topk + pad_tree_arrays) bit for bit: random and tie-heavy cases, boundaries, threads,
float32/float64 inputs, clear ValueErrors on bad input; the backend equals torch_ops.tree_build."""
import numpy as np
import pytest
import torch

from kdbench import _cpu_heap
from kdbench.backends import cpu_heap, torch_ops
from kdbench.references.tree_build import build_tree_from_topk, pad_tree_arrays, topk_logprobs

KEYS = ("tokens", "parents", "depths", "ranks", "scores", "first_child", "next_sibling", "bitmask", "n_nodes")


def reference(lp, tok, budgets, roots, n_max) -> dict:
    """Per request: the reference heap on K = min(K, budget) columns, padded to n_max, stacked."""
    rows = [pad_tree_arrays(build_tree_from_topk(lp[b][:, :budgets[b]], tok[b][:, :budgets[b]], int(budgets[b]),
                                                 int(roots[b])), n_max) for b in range(len(budgets))]
    return {k: np.stack([r[k] for r in rows]) if rows else None for k in KEYS}


def assert_same(got: dict, want: dict, msg=""):
    assert list(got) == list(KEYS), msg
    for k in KEYS:
        if want[k] is None:  # B = 0
            assert got[k].shape[0] == 0, msg
            continue
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, f"{k} {msg}"
        assert got[k].tobytes() == want[k].tobytes(), f"{k} differs {msg}: {got[k]} vs {want[k]}"  # bit-exact


def topk_batch(logits: np.ndarray, k: int):
    """[B, L, V] -> (top_lp [B, L, K] float64, top_tok [B, L, K]) with the reference's order."""
    pairs = [topk_logprobs(x, k) for x in logits]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def run_both(lp, tok, budgets, roots, n_max, n_threads=1, msg=""):
    budgets, roots = np.asarray(budgets, np.int64), np.asarray(roots, np.int64)
    got = _cpu_heap.build(lp, tok, budgets, roots, n_max, n_threads)
    want = reference(lp.astype(np.float64), tok, budgets, roots, n_max)
    assert_same(got, want, msg)
    return got


# ------------------------------------------------------------------------------------------ equality

@pytest.mark.parametrize("seed", range(7000, 7120))  # 120 cases, seed = the case's recorded seed
def test_random_tie_free_cases(seed):
    rng = np.random.default_rng(seed)
    b, l, v = int(rng.integers(1, 5)), int(rng.integers(1, 7)), int(rng.integers(2, 13))
    logits = rng.standard_normal((b, l, v)) * rng.uniform(0.5, 4.0)
    lp, tok = topk_batch(logits, v)
    lp = lp.astype(np.float32) if seed % 2 else lp                       # both input dtypes
    budgets = rng.integers(0, min(sum(v ** d for d in range(1, l + 1)) + 3, 200), b)
    got = run_both(lp, tok, budgets, rng.integers(0, v, b), int(budgets.max()) + 1 + seed % 3, msg=f"seed {seed}")
    for i in range(b):                                                   # the case really is tie-free
        s = got["scores"][i, 1:got["n_nodes"][i]]
        assert len(np.unique(s)) == len(s), f"seed {seed}: tied scores, pick another generator"


TIE_SEEDS = range(7200, 7260)


def tie_case(seed: int):
    """Integer log-probs in {0, -1, -2, -3}: sums are exact, so score ties are exact and the rank tuple
    decides (a prefix before its extensions; across depths and parents). -> (lp, tok, budgets, roots)."""
    rng = np.random.default_rng(seed)
    b, l, k = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 7))
    lp = -np.sort(rng.integers(0, 4, (b, l, k)), axis=-1).astype(np.float64)  # rows descending
    tok = np.stack([[rng.permutation(50)[:k] for _ in range(l)] for _ in range(b)]).astype(np.int64)
    return lp, tok, rng.integers(0, 60, b), rng.integers(0, 50, b)


@pytest.mark.parametrize("seed", TIE_SEEDS)
def test_tie_heavy_integer_logprobs(seed):
    run_both(*tie_case(seed), 61, msg=f"seed {seed}")


def test_tie_heavy_cases_do_tie():
    """Most tie cases pop nodes with exactly equal scores (else the test above would prove little)."""
    tied = 0
    for seed in TIE_SEEDS:
        lp, tok, budgets, roots = tie_case(seed)
        got = _cpu_heap.build(lp, tok, budgets, roots, 61)
        tied += any(len(np.unique(s[1:n])) < n - 1 for s, n in zip(got["scores"], got["n_nodes"]))
    assert tied >= 0.75 * len(TIE_SEEDS), f"only {tied} of {len(TIE_SEEDS)} tie cases have ties"


@pytest.mark.parametrize("budget", [0, 1, 7, 64, 1024])
def test_budgets_at_paper_depth(budget):
    """L = 15, V = 2000, K = max(budget, 1); budget 1024 gives N = 1025 rows, W = 17 mask words."""
    rng = np.random.default_rng(7300 + budget)
    lp, tok = topk_batch(rng.standard_normal((2, 15, 2000)).astype(np.float32) * 3, max(budget, 1))
    run_both(lp.astype(np.float32), tok, [budget, budget // 2], [3, 4], budget + 1, msg=f"budget {budget}")


def test_v_smaller_than_budget_takes_every_prefix():
    lp, tok = topk_batch(np.random.default_rng(7400).standard_normal((1, 3, 3)), 3)
    got = run_both(lp, tok, [50], [1], 51)
    assert got["n_nodes"].tolist() == [1 + 3 + 9 + 27]  # root + every prefix of L = 3, V = 3


def test_depth_one_and_degenerate_shapes():
    lp, tok = topk_batch(np.random.default_rng(7401).standard_normal((3, 1, 9)), 9)
    got = run_both(lp, tok, [0, 4, 9], [1, 2, 3], 12)                     # L = 1: stars
    assert got["depths"][2, 1:10].tolist() == [1] * 9
    for shape in [(2, 0, 4), (2, 3, 0), (0, 3, 4)]:                       # L = 0, K = 0, B = 0: root only
        b = shape[0]
        run_both(np.zeros(shape), np.zeros(shape, np.int64), [5] * b, [7] * b, 6, msg=str(shape))


def test_zero_probability_entries_are_never_pushed():
    """-inf log-probs never enter: the tree stops at the prefixes of positive probability, then pads."""
    logits = np.random.default_rng(7402).standard_normal((2, 3, 10))
    logits[:, :, 6:] = -np.inf                                            # 6 possible tokens per depth
    logits[1, 1, 1:] = -np.inf                                            # request 1: one token at depth 2
    lp, tok = topk_batch(logits, 10)
    got = run_both(lp, tok, [300, 300], [0, 0], 301)                       # 301 rows: 5 mask words
    assert got["n_nodes"].tolist() == [1 + 6 + 36 + 216, 1 + 6 + 6 + 36]
    assert (got["scores"][got["scores"] > -np.inf] <= 0).all()


def test_threads_give_the_same_trees():
    rng = np.random.default_rng(7403)
    lp, tok = topk_batch(rng.standard_normal((13, 6, 40)), 40)
    budgets, roots = rng.integers(0, 41, 13), rng.integers(0, 40, 13)
    one = run_both(lp, tok, budgets, roots, 41, n_threads=1)
    for n_threads in (2, 3, 16):                                          # 16 > B: capped at B
        many = _cpu_heap.build(lp, tok, budgets, roots, 41, n_threads)
        assert_same(many, one, f"{n_threads} threads")


# ------------------------------------------------------------------------------------------ bad inputs

def _good():
    lp, tok = topk_batch(np.random.default_rng(7500).standard_normal((2, 3, 5)), 5)
    return {"top_lp": lp, "top_tok": tok, "budgets": np.array([3, 4]), "roots": np.array([0, 1]), "n_max": 5}


def _with(**changes):
    args = _good()
    for k, f in changes.items():
        args[k] = f(args[k])
    return args


def _set(idx, value):
    def f(a):
        a = a.copy()
        a[idx] = value
        return a
    return f


BAD = [  # (case id, args, message fragment)
    ("tok_shape", _with(top_tok=lambda a: a[:, :, :4].copy()), "top_tok shape"),
    ("budgets_len", _with(budgets=lambda a: a[:1].copy()), "must both have B = 2"),
    ("roots_len", _with(roots=lambda a: np.zeros(3, np.int64)), "must both have B = 2"),
    ("negative_budget", _with(budgets=_set(1, -1)), r"budgets\[1\] = -1"),
    ("budget_over_n_max", _with(budgets=_set(0, 5)), r"n_max - 1 = 4"),
    ("n_max_0", _with(n_max=lambda n: 0, budgets=lambda a: np.zeros(2, np.int64)), r"n_max must be in \[1, 65536\]"),
    ("n_max_huge", _with(n_max=lambda n: 65537), r"n_max must be in \[1, 65536\], got 65537"),
    ("depth_over_16_bits", _with(top_lp=lambda a: np.zeros((2, 65536, 0)),     # K = 0: no bytes
                                 top_tok=lambda a: np.zeros((2, 65536, 0), np.int64)), "L = 65536 > 65535"),
    ("lp_int", _with(top_lp=lambda a: a.astype(np.int64)), "float32 or float64"),
    ("tok_int32", _with(top_tok=lambda a: a.astype(np.int32)), "top_tok must be int64"),
    ("budgets_int32", _with(budgets=lambda a: a.astype(np.int32)), "budgets must be int64"),
    ("lp_strided", _with(top_lp=lambda a: np.repeat(a, 2, axis=2)[:, :, ::2]), "C-contiguous"),
    ("lp_2d", _with(top_lp=lambda a: a[0].copy()), "must have 3 dims"),
    ("lp_nan", _with(top_lp=_set((1, 2, 3), np.nan)), r"top_lp\[1, 2, 3\] = nan"),
    ("lp_positive", _with(top_lp=_set((0, 1, 0), 0.5)), "must be <= 0"),
    ("lp_unsorted", _with(top_lp=_set((0, 0, 4), -1e-9)), "sorted descending"),
]


@pytest.mark.parametrize("args, fragment", [pytest.param(a, f, id=i) for i, a, f in BAD])
def test_bad_inputs_raise_value_error(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        _cpu_heap.build(args["top_lp"], args["top_tok"], args["budgets"], args["roots"], args["n_max"])


# ------------------------------------------------------------------------------------------ backend

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_equals_torch_ops(dtype):
    """Same TreeBatch as the torch backend's Python heap: ragged budgets, one 0, bf16 ties, padding."""
    g = torch.Generator().manual_seed(7600)
    logits = (torch.randn(5, 6, 300, generator=g) * 3).to(dtype)
    budgets = torch.tensor([0, 1, 17, 64, 40], dtype=torch.int32)
    roots, past = torch.tensor([5, 6, 7, 8, 9]), torch.tensor([0, 3, 100, 7, 1], dtype=torch.int32)
    got = cpu_heap.tree_build(logits, budgets, roots, past, 64, n_threads=2)
    want = torch_ops.tree_build(logits, budgets, roots, past, 64)
    for name, a, b in zip(want._fields, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, name
        assert torch.equal(a, b), name


def test_backend_rejects_out_of_range_budgets():
    logits = torch.zeros(2, 3, 10)
    with pytest.raises(ValueError, match="budgets"):
        cpu_heap.tree_build(logits, torch.tensor([1, 9]), torch.tensor([0, 0]), torch.tensor([0, 0]), 8)
    with pytest.raises(ValueError, match="B = 2"):
        cpu_heap.tree_build(logits, torch.tensor([1]), torch.tensor([0, 0]), torch.tensor([0, 0]), 8)
