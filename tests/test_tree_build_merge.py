"""The split-row merge of the tree_build vocabulary pass (csrc/tree_build_merge.h, merge_sorted_lists), compiled for
the host with the one-thread block policy par::HostBlk: the top-k of n sorted, 0-padded key lists must equal a sort
of their union, over list counts that need one or several capacity groups, k not a power of two, k = 1, and lists
shorter than k (a split that held fewer keys). The GPU runs the same code through tests/test_tree_build.py."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kdbench.backends import cuda_build

# per case "n k" then n * k keys in hex; prints the k merged keys in hex.
HARNESS = r"""
#include "tree_build.cu"
#include <cstdio>
#include <vector>
int main() {
  int cases = 0;
  if (scanf("%d", &cases) != 1) return 1;
  for (int t = 0; t < cases; ++t) {
    int n, k;
    if (scanf("%d %d", &n, &k) != 2) return 1;
    std::vector<uint64_t> in(size_t(n) * k), keys(kdb::vocab::kCap, 0xdeadbeefull);  // poisoned
    for (uint64_t& x : in) { unsigned long long u; if (scanf("%llx", &u) != 1) return 1; x = u; }
    kdb::vocab::merge_sorted_lists<kdb::par::HostBlk>(keys.data(), kdb::vocab::kCap, in.data(), n, k);
    for (int j = 0; j < k; ++j) printf("%llx%c", (unsigned long long)keys[j], j + 1 < k ? ' ' : '\n');
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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compiles the merge for the host)")
def test_merge_sorted_lists_on_host_is_the_top_k_of_the_union(tmp_path):
    src, exe = tmp_path / "merge_host.cu", tmp_path / "merge_host"
    src.write_text(HARNESS)
    cmd = [cuda_build.nvcc_path() or "nvcc", *cuda_build.CUDA_FLAGS, *cuda_build.arch_flags((9, 0)),
           f"-I{cuda_build.CSRC}", str(src), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    rng = np.random.default_rng(2026)
    cases = [(n, k, _lists(rng, n, k)) for n, k in SHAPES for _ in range(3)]
    lines = [str(len(cases))]
    for n, k, lists in cases:
        lines += [f"{n} {k}", " ".join(f"{int(v):x}" for v in lists.ravel())]
    out = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    rows = out.splitlines()
    assert len(rows) == len(cases)
    for (n, k, lists), row in zip(cases, rows):
        got = np.array([int(v, 16) for v in row.split()], np.uint64)
        want = np.sort(lists.ravel())[::-1][:k]
        np.testing.assert_array_equal(got, want, err_msg=f"{n} lists, k {k}")
