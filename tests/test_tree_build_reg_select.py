"""The register path's selection (csrc/tree_build_reg.h) restated in numpy step for step, on the CPU: the bf16
order keys and 64-bit candidate keys against float order, and select_top's two bisections (value bits with the
early stop, then tied ids) against a sort by (value desc, id asc) on random, tied, flat and short element sets.
The CUDA code itself runs in tests/test_tree_build.py (GPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

KID_BITS, LOCAL_ID_BITS = 18, 13


def bf16_order(h: np.ndarray) -> np.ndarray:
    """bf16_order: 16-bit bf16 patterns -> order keys (-0 as +0)."""
    h = np.where(h == 0x8000, 0, h).astype(np.uint32)
    return (h ^ np.where(h & 0x8000, 0xFFFF, 0x8000)).astype(np.uint32)


def key_of(v: np.ndarray, ids: np.ndarray) -> np.ndarray:
    hi = ((v.astype(np.uint64) << np.uint64(16)) | np.where(v & 0x8000, 0, 0xFFFF).astype(np.uint64))
    return (hi << np.uint64(32)) | (~ids.astype(np.uint32)).astype(np.uint64)


def float_order_key(x: np.ndarray) -> np.ndarray:
    u = np.where(x == 0, np.float32(0), x).astype(np.float32).view(np.uint32)
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def select_top(v: np.ndarray, ids: np.ndarray, k: int, idbits: int) -> tuple[int, int, int]:
    """select_top: (tv, xi, kept); an element is kept iff v > tv or (v == tv and id <= xi). v 0: no element."""
    live = v[v != 0]
    n = live.size
    if n <= k:
        return 0, 2**31 - 1, n
    o, an = int(np.bitwise_or.reduce(live)), int(np.bitwise_and.reduce(live))
    vary = o ^ an
    tv = an & ~vary
    for bit in range(15, -1, -1):
        if not (vary >> bit) & 1:
            continue
        cand = tv | (1 << bit)
        c = int((v >= cand).sum())          # v 0 never counts: cand >= 1
        if c >= k:
            tv = cand
        if c == k:
            return cand, 2**31 - 1, k
    gt, eq = int((v > tv).sum()), int((v == tv).sum())
    r = k - gt
    if r >= eq:
        return tv, 2**31 - 1, gt + eq
    xi = 0
    for bit in range(idbits - 1, -1, -1):
        cand = xi | (1 << bit)
        if int(((v == tv) & (ids < cand)).sum()) < r:
            xi = cand
    return tv, xi, k


def _kept(v, ids, cut):
    tv, xi, _ = cut
    return (v != 0) & ((v > tv) | ((v == tv) & (ids <= xi)))


def test_bf16_order_keys_follow_float_order():
    h = np.arange(65536, dtype=np.uint32)
    x = torch.from_numpy(h.astype(np.int32).astype(np.int16)).view(torch.bfloat16).float().numpy()
    ok = ~np.isnan(x) & ~np.isposinf(x)
    h, x = h[ok], x[ok]
    o = bf16_order(h)
    assert o.min() >= 1, "every bf16 allowed in logits (-inf included) has a key >= 1: 0 stays 'no element'"
    order = np.argsort(x, kind="stable")
    xs, os_ = x[order], o[order]
    assert np.all((np.diff(os_.astype(np.int64)) > 0) == (np.diff(xs) > 0)), "keys rise exactly where values do"
    assert bf16_order(np.array([0x8000]))[0] == bf16_order(np.array([0x0000]))[0], "-0 and +0 are one key"
    ids = np.arange(h.size, dtype=np.uint32)
    want = (float_order_key(x).astype(np.uint64) << np.uint64(32)) | (~ids).astype(np.uint64)
    assert np.array_equal(key_of(o, ids), want), "key_of is make_key of the bf16 value"


def _sets(rng):
    yield "normal", (rng.normal(0, 3, 8192))
    yield "ties", rng.integers(-4, 5, 8192) * 0.5
    yield "flat", np.full(8192, 1.5)
    yield "short", rng.normal(0, 3, 40)
    yield "neginf", np.where(rng.random(8192) < 0.99, -np.inf, rng.normal(0, 3, 8192))
    yield "merge", rng.normal(0, 3, 5120)


@pytest.mark.parametrize("k", [1, 16, 64, 65, 256])
def test_select_top_keeps_the_reference_top_k(k):
    rng = np.random.default_rng(k)
    for name, x in _sets(rng):
        xb = torch.from_numpy(x).to(torch.bfloat16)
        h = xb.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)
        v = bf16_order(h)
        idbits = KID_BITS if name == "merge" else LOCAL_ID_BITS
        ids = rng.permutation(1 << idbits)[:x.size] if name == "merge" else np.arange(x.size)
        v = np.where(rng.random(x.size) < 0.05, 0, v) if name == "normal" else v   # some slots hold no element
        cut = select_top(v, ids, k, idbits)
        kept = _kept(v, ids, cut)
        live = np.flatnonzero(v != 0)
        want = live[np.lexsort((ids[live], -v[live].astype(np.int64)))][:k]
        assert kept.sum() == cut[2] == min(k, live.size), f"{name}: kept {kept.sum()}, cut says {cut[2]}"
        assert set(np.flatnonzero(kept)) == set(want), f"{name}: not the top {k} by (value desc, id asc)"
