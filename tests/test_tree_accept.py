"""GPU tests of the tree_accept CUDA kernels against kdbench.references.tree_accept: the greedy walk and the
sampled rule (one inverse-CDF draw per node from given uniforms, then the walk), bit-exact; the sampler
also by distribution (chi-square on a small vocabulary)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kdbench.references import tree_accept as ref
from kdbench.references import tree_build

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"


@dataclass(frozen=True)
class Case:
    batch: int
    depth: int   # L = max_depth
    vocab: int
    budget: int  # N = budget + 1 rows; requests get random budgets in [0, budget] (request 0: exactly budget)
    seed: int


CASES = [Case(1, 15, 64, 1, 1), Case(3, 15, 300, 7, 2), Case(2, 15, 500, 63, 3), Case(2, 8, 50, 64, 4),
         Case(5, 15, 1000, 65, 5), Case(2, 15, 2000, 1024, 6), Case(64, 15, 300, 256, 7)]
IDS = [f"b{c.batch}-L{c.depth}-V{c.vocab}-B{c.budget}" for c in CASES]


def _ext():
    from kdbench.backends import cuda_ext  # on a GPU machine a failed build is an error, not a skip
    return cuda_ext


def _trees(case: Case, rng: np.random.Generator):
    budgets = [case.budget] + [int(rng.integers(0, case.budget + 1)) for _ in range(case.batch - 1)]
    trees = [tree_build.build_tree(rng.normal(0, 2.0, (case.depth, case.vocab)), b, int(rng.integers(0, case.vocab)))
             for b in budgets]
    padded = [tree_build.pad_tree_arrays(t, case.budget + 1) for t in trees]
    dev = lambda key, dt: torch.from_numpy(np.stack([p[key] for p in padded])).to(dt).to(DEVICE)  # noqa: E731
    args = (dev("tokens", torch.int64), dev("first_child", torch.int32), dev("next_sibling", torch.int32),
            torch.tensor([t.size for t in trees], dtype=torch.int32, device=DEVICE))
    return trees, args


def _targets_along_a_path(tree, n_rows: int, vocab: int, rng) -> np.ndarray:
    """Random targets, except along the path to a random node, so that the walk goes deep."""
    targets = rng.integers(0, vocab, size=n_rows).astype(np.int64)
    node = int(rng.integers(0, tree.size))
    while node > 0:
        targets[tree.parents[node]] = tree.tokens[node]
        node = int(tree.parents[node])
    return targets


def _check_result(res, b: int, want_acc: np.ndarray, want_bonus: int, width: int):
    acc = res.accepted[b].cpu().numpy()
    n = len(want_acc)
    assert acc[:n].tolist() == want_acc.tolist(), f"request {b}: accepted {acc.tolist()} != {want_acc.tolist()}"
    assert (acc[n:] == -1).all() and acc.shape == (width,), f"request {b}: padding {acc.tolist()}"
    assert int(res.accept_len[b]) == n and int(res.bonus[b]) == want_bonus, f"request {b}: len/bonus"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_greedy_matches_reference(case):
    rng = np.random.default_rng(case.seed)
    trees, args = _trees(case, rng)
    targets = np.stack([_targets_along_a_path(t, case.budget + 1, case.vocab, rng) for t in trees])
    res = _ext().tree_accept_greedy(*args, torch.from_numpy(targets).to(DEVICE), case.depth)
    for b, tree in enumerate(trees):
        want_acc, want_bonus = ref.accept_greedy(tree, targets[b, :tree.size])
        _check_result(res, b, want_acc, want_bonus, case.depth + 1)


def test_greedy_stops_at_max_depth():
    rng = np.random.default_rng(8)
    case = Case(1, 15, 20, 200, 8)
    trees, args = _trees(case, rng)
    deepest = [int(np.argmax(t.depths)) for t in trees]
    targets = np.stack([_targets_along_a_path(t, case.budget + 1, case.vocab, rng) for t in trees])
    for b, (tree, node) in enumerate(zip(trees, deepest)):  # walk to the deepest node
        while node > 0:
            targets[b, tree.parents[node]] = tree.tokens[node]
            node = int(tree.parents[node])
    res = _ext().tree_accept_greedy(*args, torch.from_numpy(targets).to(DEVICE), 3)
    for b, tree in enumerate(trees):
        full, _ = ref.accept_greedy(tree, targets[b, :tree.size])
        assert len(full) > 4, "the test needs a path longer than max_depth + 1"
        _check_result(res, b, full[:4], int(targets[b, full[3]]), 4)


def test_padding_rows_are_never_accepted():
    """Padding rows carry the root token and parent 0 but are not linked: a target equal to the root
    token at the root must stop the walk there."""
    logits = np.full((2, 10), -5.0)
    logits[0, 3] = logits[1, 4] = 5.0
    padded = tree_build.pad_tree_arrays(tree_build.build_tree(logits, 1, 9), 4)  # rows 2, 3: token 9
    dev = lambda key, dt: torch.from_numpy(padded[key][None]).to(dt).to(DEVICE)  # noqa: E731
    res = _ext().tree_accept_greedy(dev("tokens", torch.int64), dev("first_child", torch.int32),
                                    dev("next_sibling", torch.int32), torch.tensor([2], dtype=torch.int32).to(DEVICE),
                                    torch.tensor([[9, 0, 0, 0]]).to(DEVICE), 2)
    assert res.accepted[0].tolist() == [0, -1, -1] and int(res.accept_len[0]) == 1 and int(res.bonus[0]) == 9


def _probs(case: Case, trees, rng, zero_frac: float) -> np.ndarray:
    """[B, N, V] float32 target probabilities with extra mass on each node's children and exact zeros."""
    p = rng.dirichlet(np.full(case.vocab, 0.3), size=(case.batch, case.budget + 1))
    for b, t in enumerate(trees):
        for i in range(t.size):
            kids = t.tokens[t.parents == i]
            p[b, i, kids] += rng.uniform(0, 3.0, len(kids))
    p[rng.random(p.shape) < zero_frac] = 0.0
    return p.astype(np.float32)


@pytest.mark.parametrize("case", [Case(2, 15, 1, 7, 10), Case(3, 15, 7, 15, 11), Case(2, 15, 1000, 63, 12),
                                  Case(2, 15, 4099, 64, 13), Case(2, 4, 32768, 15, 14), Case(16, 15, 300, 256, 15)],
                         ids=lambda c: f"b{c.batch}-V{c.vocab}-B{c.budget}")
def test_sampled_matches_reference(case):
    rng = np.random.default_rng(case.seed)
    trees, args = _trees(case, rng)
    probs = _probs(case, trees, rng, zero_frac=0.3 if case.vocab > 1 else 0.0)
    probs[..., 0] += 1e-3 * (probs.sum(-1) == 0)  # every row needs some mass
    uniforms = rng.uniform(0, 1, (case.batch, case.budget + 1))
    uniforms[0, 0] = 0.0  # the first positive token
    res = _ext().tree_accept_sampled(*args, torch.from_numpy(probs).to(DEVICE), torch.from_numpy(uniforms).to(DEVICE),
                                     case.depth)
    sampled = res.sampled.cpu().numpy()
    for b, tree in enumerate(trees):
        want = ref.sample_per_node(probs[b], uniforms[b])  # every row, padding included
        assert sampled[b].tolist() == want.tolist(), f"request {b}: samples differ"
        want_acc, want_bonus = ref.accept_sampled(tree, probs[b, :tree.size], uniforms[b, :tree.size])
        _check_result(res, b, want_acc, want_bonus, case.depth + 1)


def _root_only(batch: int, rows: int):
    """Trees of the root alone, padded to `rows` rows: the sampler runs on every row anyway."""
    i32 = lambda v: torch.full((batch, rows), v, dtype=torch.int32, device=DEVICE)  # noqa: E731
    return (torch.zeros(batch, rows, dtype=torch.int64, device=DEVICE), i32(-1), i32(-1),
            torch.ones(batch, dtype=torch.int32, device=DEVICE))


def test_sampler_exact_boundaries():
    probs = np.array([[[1, 1, 1, 1, 0], [0, 1, 0, 0, 1], [0, 0, 0, 0, 2], [3, 0, 0, 0, 0]]], dtype=np.float32)
    uniforms = np.array([[0.25, 0.5, 0.0, 0.999999]])  # t = c[j] exactly at the first two: strict < moves on
    res = _ext().tree_accept_sampled(*_root_only(1, 4), torch.from_numpy(probs).to(DEVICE),
                                     torch.from_numpy(uniforms).to(DEVICE), 2)
    want = ref.sample_per_node(probs[0], uniforms[0])
    assert res.sampled[0].tolist() == want.tolist() == [1, 4, 4, 0]


def test_sampler_distribution_chi_square():
    """16 x 1024 draws from p = [.1, .2, .3, .4, 0]: counts fit (chi-square, 3 dof, p = 0.001 cut 16.27)
    and the zero-probability token never appears."""
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.0], dtype=np.float32)
    rng = np.random.default_rng(16)
    probs = torch.from_numpy(np.broadcast_to(p, (16, 1024, 5)).copy()).to(DEVICE)
    uniforms = torch.from_numpy(rng.uniform(0, 1, (16, 1024))).to(DEVICE)
    sampled = _ext().tree_accept_sampled(*_root_only(16, 1024), probs, uniforms, 1).sampled.cpu().numpy().ravel()
    counts = np.bincount(sampled, minlength=5)
    assert counts[4] == 0
    expected = p[:4].astype(np.float64) * sampled.size
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, f"chi-square {chi2:.2f} with counts {counts.tolist()}"


def test_cuda_graph_replay_matches_eager():
    rng = np.random.default_rng(17)
    case = Case(4, 15, 500, 64, 17)
    trees, args = _trees(case, rng)
    probs = torch.from_numpy(_probs(case, trees, rng, 0.0)).to(DEVICE)
    uniforms = torch.from_numpy(rng.uniform(0, 1, (case.batch, case.budget + 1))).to(DEVICE)
    run = lambda: _ext().tree_accept_sampled(*args, probs, uniforms, case.depth)  # noqa: E731
    eager = run()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(eager._fields, eager, captured):
        assert torch.equal(a, b), name
