"""GPU tests of the kv_compact CUDA kernel against kdbench.references.kv_compact.compact_kv, bit-exact:
in place, every layer in one launch, rows past each request's tree left untouched (they hold NaN, so a
stray read or write shows)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kdbench.references import kv_compact as ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    layers: int
    batch: int
    dim: int      # D: 576 = the MLA latent row; odd sizes take the narrow-vector paths
    dtype: str
    nodes: int    # N tree rows per request
    width: int    # A = max_depth + 1 accepted slots
    seed: int


CASES = [
    Case(2, 3, 576, "bfloat16", 17, 16, 1),
    Case(61, 2, 576, "bfloat16", 65, 16, 2),      # every layer of Kimi-K2 in one launch
    Case(2, 64, 576, "bfloat16", 65, 16, 3),
    Case(2, 5, 7, "float32", 30, 16, 4),           # 28-byte rows: 4-byte vectors
    Case(2, 4, 3, "bfloat16", 30, 16, 5),          # 6-byte rows: 2-byte elements
    Case(1, 3, 64, "float32", 1100, 1025, 6),      # 1025 accepted rows: several load/store groups
]
IDS = [f"l{c.layers}-b{c.batch}-D{c.dim}-{c.dtype}-N{c.nodes}-A{c.width}" for c in CASES]


def _ext():
    from kdbench.backends import cuda_ext  # on a GPU machine a failed build is an error, not a skip
    return cuda_ext


def _accepted(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[B, A] strictly increasing rows from 0 (-1 padding) and [B] lengths: random paths, every 4th request
    already in place, one root-only request and one full-width request."""
    acc = np.full((case.batch, case.width), -1, dtype=np.int32)
    lens = np.zeros(case.batch, dtype=np.int32)
    for b in range(case.batch):
        k = int(rng.integers(1, min(case.width, case.nodes) + 1))
        k = {0: min(case.width, case.nodes), 2: 1}.get(b, k)
        rows = np.sort(rng.choice(np.arange(1, case.nodes), size=k - 1, replace=False))
        if b % 4 == 1:
            rows = np.arange(1, k)
        acc[b, :k] = np.concatenate([[0], rows])
        lens[b] = k
    return acc, lens


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_reference(case):
    rng = np.random.default_rng(case.seed)
    past = rng.integers(1, 64, case.batch).astype(np.int32)
    seq = int(past.max()) + case.nodes + 3
    cache = rng.normal(0, 1, (case.layers, case.batch, seq, case.dim))
    for b in range(case.batch):
        cache[:, b, past[b] + case.nodes:] = np.nan  # rows nobody may read or write
    t = torch.from_numpy(cache).to(DTYPES[case.dtype])
    cache = t.double().numpy()                       # the values the kernel sees
    acc, lens = _accepted(case, rng)
    dev = t.to(DEVICE)
    i32 = lambda a: torch.from_numpy(a).to(DEVICE)   # noqa: E731
    _ext().kv_compact(dev, i32(past), i32(acc), i32(lens))
    got = dev.double().cpu().numpy()
    for b in range(case.batch):
        want, _ = ref.compact_kv(cache[:, b], int(past[b]), acc[b, :lens[b]])
        assert np.array_equal(got[:, b], want, equal_nan=True), f"request {b}: accepted {acc[b, :lens[b]].tolist()}"


def test_bad_inputs_name_the_argument():
    cuda_ext = _ext()
    cache = torch.zeros(2, 2, 8, 4, device=DEVICE)
    i32 = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    acc = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(RuntimeError, match="accepted must be int32"):
        cuda_ext.kv_compact(cache, i32, acc.long(), i32)
    with pytest.raises(RuntimeError, match="cache must be bfloat16 or float32"):
        cuda_ext.kv_compact(cache.half(), i32, acc, i32)
    with pytest.raises(RuntimeError, match="cache must be contiguous"):
        cuda_ext.kv_compact(cache.transpose(2, 3), i32, acc, i32)
    with pytest.raises(RuntimeError, match="accept_len must be \\[B\\]"):
        cuda_ext.kv_compact(cache, i32, acc, i32[:1])


def test_cuda_graph_replay_matches_eager():
    cuda_ext = _ext()
    rng = np.random.default_rng(9)
    case = Case(4, 8, 576, "bfloat16", 65, 16, 9)
    acc, lens = (torch.from_numpy(a).to(DEVICE) for a in _accepted(case, rng))
    past = torch.full((case.batch,), 5, dtype=torch.int32, device=DEVICE)
    start = torch.randn(case.layers, case.batch, 80, case.dim, device=DEVICE).to(torch.bfloat16)
    eager, captured = start.clone(), start.clone()
    cuda_ext.kv_compact(eager, past, acc, lens)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cuda_ext.kv_compact(start.clone(), past, acc, lens)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        cuda_ext.kv_compact(captured, past, acc, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, captured)
