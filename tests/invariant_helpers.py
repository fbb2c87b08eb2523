"""Shared pieces of the batch-invariance tests: devices and dtypes, the call sizes M, random trees with an
embedded chain, and bitwise comparison. A target row is placed at a random index among M random rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

M_SIZES = (1, 7, 64, 520, 4160)
GPU_REASON = "needs a CUDA GPU with Triton: the batch-invariant kernels (the CPU paths are tested in float64/32)"
# (device, dtype): CPU paths in float64 and float32 (invariant by construction), CUDA in bf16 (Triton kernels)
CASES = [pytest.param("cpu", torch.float64, id="cpu-f64"), pytest.param("cpu", torch.float32, id="cpu-f32"),
         pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=[
             pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=GPU_REASON)])]


def randn(gen: torch.Generator, *shape, device, dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same bits (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def place(target: torch.Tensor, others: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """Rows of `others` with `target` (one row) inserted at a random index; returns (rows, index)."""
    i = int(rng.integers(0, others.shape[0] + 1))
    return torch.cat((others[:i], target[None], others[i:]), dim=0), i


def check_rows_invariant(fn, target: torch.Tensor, make_others, seed: int, sizes=M_SIZES) -> None:
    """fn(rows [M, ...]) -> [M, ...]: the target row's output is bitwise the same for every M in sizes, with
    fresh random other rows (make_others(n, gen)) per size."""
    rng = np.random.default_rng(seed)
    want = fn(target[None])[0]
    for M in sizes:
        gen = torch.Generator().manual_seed(seed * 7919 + M)
        rows, i = place(target, make_others(M - 1, gen), rng)
        got = fn(rows)[i]
        diff = (got.double() - want.double()).abs().max()
        assert bitwise_equal(got, want), f"M={M} (seed {seed}, row {i}): max diff {diff}"


def tree_with_chain(T: int, chain_slots: list[int], rng: np.random.Generator) -> np.ndarray:
    """Parents [T] of a random tree (parent index < own index) in which chain_slots form a root-first chain."""
    parent = np.full(T, -1, dtype=np.int64)
    for j in range(1, T):
        parent[j] = rng.integers(0, j)
    for a, b in zip(chain_slots, chain_slots[1:]):
        parent[b] = a
    assert chain_slots[0] == 0
    return parent


def anc_bits(parents: list[np.ndarray], T: int) -> torch.Tensor:
    """[B, T, ceil(T/64)] int64 ancestor-or-self bits of each request's tree."""
    W = (T + 63) // 64
    out = np.zeros((len(parents), T, W), dtype=np.uint64)
    for b, par in enumerate(parents):
        for j in range(T):
            a = j
            while a >= 0:
                out[b, j, a // 64] |= np.uint64(1) << np.uint64(a % 64)
                a = par[a]
    return torch.from_numpy(out.view(np.int64))


def depths(par: np.ndarray) -> np.ndarray:
    d = np.zeros(len(par), dtype=np.int64)
    for j in range(1, len(par)):
        d[j] = d[par[j]] + 1
    return d
