"""CPU timing of the tree_build heap alone: the C++ heap (kdbench._cpu_heap) vs the Python reference heap,
batch 32, budget 256, L = 15, K = 256 (top-K of V = 32000 float32 logits, computed once outside the timing).

Run with `pytest tests/benchmarks/test_bench_cpu_heap.py --benchmark-only`. Napkin math per request:
256 pops and <= 512 pushes on a heap of <= 257 entries (~8 levels), so ~6k comparisons; the padded
outputs are 257 rows x (7 int64/float64 + 5 mask words) ~ 25 KB, and the ancestor bits are 257 x 5 words
copied once. Python costs ~1.7 us per node in heapq + tuple building; C++ should be ~50-100x lower.
"""
import numpy as np
import pytest
import torch

from kdbench import _cpu_heap
from kdbench.backends.torch_ops import topk_logprobs
from kdbench.references.tree_build import build_tree_from_topk, pad_tree_arrays

B, L, V, BUDGET = 32, 15, 32000, 256
N = BUDGET + 1


@pytest.fixture(scope="module")
def top():
    """(top_lp [B, L, K] float64, top_tok [B, L, K] int64, budgets [B], roots [B]); seed 6100."""
    g = torch.Generator().manual_seed(6100)
    lp, tok = topk_logprobs(torch.randn(B, L, V, generator=g) * 3.0, BUDGET)
    return lp.double().numpy(), tok.numpy(), np.full(B, BUDGET, np.int64), np.arange(B, dtype=np.int64)


def python_heap(lp, tok, budgets, roots):
    return [build_tree_from_topk(lp[b], tok[b], int(budgets[b]), int(roots[b])) for b in range(len(budgets))]


def python_heap_padded(lp, tok, budgets, roots):
    """What torch_ops.tree_build runs on the host: the heap, then pad_tree_arrays, per request."""
    return [pad_tree_arrays(t, N) for t in python_heap(lp, tok, budgets, roots)]


def test_bench_python_heap(benchmark, top):
    trees = benchmark.pedantic(python_heap, args=top, rounds=10, warmup_rounds=1)
    assert all(t.size == N for t in trees)


def test_bench_python_heap_padded(benchmark, top):
    rows = benchmark.pedantic(python_heap_padded, args=top, rounds=10, warmup_rounds=1)
    assert all(int(r["n_nodes"]) == N for r in rows)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_bench_cpp_heap(benchmark, top, n_threads):
    out = benchmark.pedantic(_cpu_heap.build, args=(*top, N, n_threads), rounds=200, warmup_rounds=5)
    want = python_heap_padded(*top)[0]                                   # request 0 equals the reference
    assert out["tokens"][0].tolist() == want["tokens"].tolist()
    assert out["scores"][0].tobytes() == want["scores"].tobytes()
