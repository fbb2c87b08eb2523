"""CPU timing of the numpy tree_build reference at the paper's shape (L = 15, V = 32000, budgets 64/256).

Run with `pytest tests/benchmarks --benchmark-only`. Napkin math: the top-K is O(L*V) = 480k float32
reads (~1.9 MB) per build; the heap is O(B log B) Python steps, so B = 256 should cost ~4x B = 64 there.
"""
import numpy as np
import pytest

from kdbench.references.tree_build import build_tree, build_tree_from_topk, topk_logprobs

L, V = 15, 32000


@pytest.fixture(scope="module")
def draft_logits():
    return (np.random.default_rng(6000).standard_normal((L, V)) * 3.0).astype(np.float32)  # seed 6000


@pytest.mark.parametrize("budget", [64, 256])
def test_bench_build_tree(benchmark, draft_logits, budget):
    tree = benchmark.pedantic(build_tree, args=(draft_logits, budget, 1), rounds=20, warmup_rounds=2)
    assert tree.size == budget + 1


@pytest.mark.parametrize("budget", [64, 256])
def test_bench_heap_only(benchmark, draft_logits, budget):
    """Algorithm 1 alone on precomputed top-K (what a GPU top-K + CPU heap split would leave on the CPU)."""
    top_lp, top_tok = topk_logprobs(draft_logits, budget)
    tree = benchmark.pedantic(build_tree_from_topk, args=(top_lp, top_tok, budget, 1), rounds=20, warmup_rounds=2)
    assert tree.size == budget + 1
