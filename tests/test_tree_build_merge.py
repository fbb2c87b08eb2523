"""The split-row merge of the tree_build vocabulary pass (csrc/tree_build_merge.h, merge_sorted_lists) and the
bitonic sort's warp-owned stages (tree_build_select.h), compiled for the host (the merge with the one-thread block
policy par::HostBlk): the top-k of n sorted, 0-padded key lists must equal a sort of their union, over list counts
that need one or several capacity groups, k not a power of two, k = 1, and lists shorter than k (a split that held
fewer keys). The GPU runs the same code through tests/test_tree_build.py."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kdbench.backends import cuda_build

# per case "M n k" then n * k keys in hex (the merge), or "S p" then p keys (the bitonic sort, every stage run for
# all kThreads threads in turn: the threads of a stage touch disjoint pairs); prints the resulting keys in hex.
HARNESS = r"""
#include "tree_build.cu"
#include <cstdio>
#include <vector>
int main() {
  int cases = 0;
  if (scanf("%d", &cases) != 1) return 1;
  for (int t = 0; t < cases; ++t) {
    char mode;
    int n, k = 1;
    if (scanf(" %c %d", &mode, &n) != 2 || (mode == 'M' && scanf("%d", &k) != 1)) return 1;
    std::vector<uint64_t> in(size_t(n) * k), keys(kdb::vocab::kCap, 0xdeadbeefull);  // poisoned
    for (uint64_t& x : in) { unsigned long long u; if (scanf("%llx", &u) != 1) return 1; x = u; }
    int out = k;
    if (mode == 'M') {
      kdb::vocab::merge_sorted_lists<kdb::par::HostBlk>(keys.data(), kdb::vocab::kCap, in.data(), n, k);
    } else {
      for (int i = 0; i < n; ++i) keys[i] = in[i];
      for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1)
          for (int tid = 0; tid < kdb::vocab::kThreads; ++tid) kdb::vocab::bitonic_stage(keys.data(), n, size, stride, tid);
      out = n;
    }
    for (int j = 0; j < out; ++j) printf("%llx%c", (unsigned long long)keys[j], j + 1 < out ? ' ' : '\n');
  }
  return 0;
}
"""

# (lists, k): one group; several groups (k 100 -> p 128: 48 lists per group; k 1024: 6); k = 1, 2, odd k.
SHAPES = [(2, 1), (3, 1), (7, 2), (20, 64), (25, 64), (4, 64), (40, 16), (81, 100), (8, 1024), (13, 1024),
          (2, 1024), (5, 3), (9, 63), (9, 65), (130, 16), (3, 256), (33, 256)]


def _lists(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n lists of k distinct nonzero 64-bit keys sorted descending; about a third of the lists hold fewer than k
    keys (0-padded); about a quarter of the cases draw keys from a narrow range so lists interleave densely."""
    narrow = rng.random() < 0.25
    lo, hi = (1 << 40, (1 << 40) + 8 * n * k) if narrow else (1, 1 << 63)
    pool = rng.choice(np.arange(lo, hi, dtype=np.uint64), n * k, replace=False) if narrow else \
        np.unique(rng.integers(lo, hi, 2 * n * k, dtype=np.uint64))[: n * k]
    rng.shuffle(pool)
    out = np.zeros((n, k), np.uint64)
    for s in range(n):
        m = int(rng.integers(0, k + 1)) if rng.random() < 0.35 else k
        out[s, :m] = np.sort(pool[s * k:s * k + m])[::-1]
    return out


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compiles the merge for the host)")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return cuda_build.build_host_program(HARNESS, tmp_path_factory.mktemp("merge_host"), "merge_host")


def _run(exe, cases: list[tuple[str, list[int], np.ndarray]]) -> list[np.ndarray]:
    lines = [str(len(cases))]
    for mode, dims, keys in cases:
        lines += [" ".join([mode, *map(str, dims)]), " ".join(f"{int(v):x}" for v in keys.ravel())]
    out = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    rows = out.splitlines()
    assert len(rows) == len(cases)
    return [np.array([int(v, 16) for v in row.split()], np.uint64) for row in rows]


@needs_nvcc
def test_merge_sorted_lists_on_host_is_the_top_k_of_the_union(harness):
    rng = np.random.default_rng(2026)
    cases = [("M", [n, k], _lists(rng, n, k)) for n, k in SHAPES for _ in range(3)]
    for (_, (n, k), lists), got in zip(cases, _run(harness, cases)):
        np.testing.assert_array_equal(got, np.sort(lists.ravel())[::-1][:k], err_msg=f"{n} lists, k {k}")


@needs_nvcc
def test_bitonic_stages_sort_descending(harness):
    """bitonic_sort_desc's warp-owned stage mapping (sort_warps, bitonic_stage) at every power of two it sorts
    (vocabulary pass up to 1024 keys, builder up to 2048), with duplicates and zeros (padding)."""
    rng = np.random.default_rng(7)
    cases = []
    for lg in range(0, 12):
        p = 1 << lg
        for dup in (False, True):
            keys = rng.integers(0, 6 if dup else 1 << 63, p, dtype=np.uint64)
            cases.append(("S", [p], keys))
    for (_, (p,), keys), got in zip(cases, _run(harness, cases)):
        np.testing.assert_array_equal(got, np.sort(keys)[::-1], err_msg=f"p {p}")
