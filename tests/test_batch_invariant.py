"""Batch invariance of every op of the invariant target mode (suite/model/invariant.py): a row's output is
bitwise the same in calls of M = 1, 7, 64, 520, 4160 rows with random other rows. CPU: float64 and float32
(fixed pairwise trees); CUDA: bf16 Triton kernels at Kimi-K2 widths. Also the ops' values against float64."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from invariant_helpers import CASES, anc_bits, bitwise_equal, check_rows_invariant, depths, randn, tree_with_chain

from kdbench.model import invariant as inv
from kdbench.model import moe as tmoe
from kdbench.model.mla import attention_absorbed, visible_mask
from kdbench.model.presets import get_preset


def _dims(device):
    """(d, N, H, dn, dc, dr, E, mi): real widths on the GPU, small ones on the CPU."""
    return (7168, 1536, 64, 128, 512, 64, 16, 2048) if device == "cuda" else (40, 24, 3, 8, 16, 8, 6, 12)


@pytest.mark.parametrize("device,dtype", CASES)
def test_linear_and_head_products(device, dtype):
    d, N, H, dn, dc, _, _, _ = _dims(device)
    g = torch.Generator().manual_seed(11)
    w = randn(g, N, d, device=device, dtype=dtype, scale=d ** -0.5)
    target = randn(g, d, device=device, dtype=dtype)
    mk = lambda n, gen: randn(gen, n, d, device=device, dtype=dtype)  # noqa: E731
    check_rows_invariant(lambda x: inv.linear(x, w), target, mk, seed=1)
    ref = target.double() @ w.double().T
    got = inv.linear(target[None], w)[0].double()
    assert (got - ref).abs().max() <= 0.02 * ref.abs().max(), "linear value"
    w_kn = randn(g, H, dn, dc, device=device, dtype=dtype, scale=dn ** -0.5)     # W_UK layout [H, dn, dc]
    big = randn(g, 1, H, dn + 5, device=device, dtype=dtype)[..., :dn][0]           # a strided view, like q_nope
    mkh = lambda n, gen: randn(gen, n, H, dn, device=device, dtype=dtype)  # noqa: E731
    check_rows_invariant(lambda x: inv.head_matmul(x, w_kn, w_is_kn=True), big, mkh, seed=2)
    w_nk = randn(g, H, dn, dc, device=device, dtype=dtype, scale=dc ** -0.5)     # W_UV layout [H, dv, dc]
    mkc = lambda n, gen: randn(gen, n, H, dc, device=device, dtype=dtype)  # noqa: E731
    check_rows_invariant(lambda x: inv.head_matmul(x, w_nk, w_is_kn=False), mkc(1, g)[0], mkc, seed=3)


@pytest.mark.parametrize("device,dtype", CASES)
def test_rms_norm_and_router(device, dtype):
    d, _, _, _, _, _, E, _ = _dims(device)
    g = torch.Generator().manual_seed(12)
    wn = randn(g, d, device=device, dtype=dtype, scale=0.05) + 1
    mk = lambda n, gen: randn(gen, n, d + 3, device=device, dtype=dtype, scale=3.0)[:, :d]  # noqa: E731
    check_rows_invariant(lambda x: inv.rms_norm(x, wn, 1e-6), mk(1, g)[0], mk, seed=4)
    cfg = dataclasses.replace(get_preset("tiny-groups"), n_routed_experts=2 * E, n_group=2, topk_group=1,
                              n_experts_per_tok=3)   # group-limited routing, normalized top-k
    wg = randn(g, 2 * E, d, device=device, dtype=dtype, scale=d ** -0.5)
    bias = (torch.randn(2 * E, generator=g) * 0.1).to(device)
    def both(x):  # idx and weights of the router, side by side
        return torch.cat([t.double() for t in tmoe.route(x, wg, bias, cfg, invariant_mode=True)], -1)
    mkr = lambda n, gen: randn(gen, n, d, device=device, dtype=dtype)  # noqa: E731
    check_rows_invariant(lambda x: inv.gate_logits(x, wg), mkr(1, g)[0], mkr, seed=5)
    check_rows_invariant(both, mkr(1, g)[0], mkr, seed=6)


@pytest.mark.parametrize("device,dtype", CASES)
def test_experts_and_moe_combine(device, dtype):
    """Expert GEMMs + combine for a target row with fixed routing among rows routed at random."""
    d, _, _, _, _, _, E, mi = _dims(device)
    k = 4
    g = torch.Generator().manual_seed(13)
    w1, w3 = (randn(g, E, mi, d, device=device, dtype=dtype, scale=d ** -0.5) for _ in range(2))
    w2 = randn(g, E, d, mi, device=device, dtype=dtype, scale=mi ** -0.5)

    def pack(n, gen):  # rows = [x | idx | weights] in float64 (exact for every dtype here)
        x = randn(gen, n, d, device=device, dtype=dtype).double()
        idx = torch.argsort(torch.rand(n, E, generator=gen), dim=1)[:, :k].double().to(device)
        wts = torch.rand(n, k, generator=gen, dtype=torch.float64).to(device)
        return torch.cat((x, idx, wts), -1)

    def run(rows):
        x, idx, wts = rows[:, :d].to(dtype), rows[:, d:d + k].long(), rows[:, d + k:].to(torch.float32)
        return inv.experts(x, idx, wts, w1, w2, w3)

    target = pack(1, g)[0]
    check_rows_invariant(run, target, pack, seed=7)
    x, idx, wts = target[None, :d].to(dtype), target[None, d:d + k].long(), target[None, d + k:]
    want = sum(wts[0, j] * tmoe.swiglu(x.double(), w1[idx[0, j]].double(), w2[idx[0, j]].double(),
                                       w3[idx[0, j]].double()) for j in range(k))
    got = run(target[None]).double()
    assert (got - want).abs().max() <= 0.03 * want.abs().max(), "experts value"


def _attn_case(device, dtype, B, T, c_max, seed, H, dc, dr):
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    S = c_max + T + 1
    kv = randn(g, B, S, dc + dr, device=device, dtype=dtype)
    past = torch.from_numpy(rng.integers(1, c_max + 1, B)).to(torch.int32).to(device)
    pars = [tree_with_chain(T, [0], rng) for _ in range(B)]
    anc = anc_bits(pars, T).to(device)
    q_lat, q_pe = randn(g, B, T, H, dc, device=device, dtype=dtype), randn(g, B, T, H, dr, device=device, dtype=dtype)
    return q_lat, q_pe, kv, past, anc, pars


@pytest.mark.parametrize("device,dtype", CASES)
def test_attention_rows_and_ar_equals_verify(device, dtype):
    """(1) A tree row's output is independent of the other requests/rows (B*T = M); (2) a tree node at depth d
    equals the AR row at position c + d whose prefix holds the node's ancestors' rows (the compacted cache)."""
    _, _, H, _, dc, dr, _, _ = _dims(device)
    H = 16 if device == "cuda" else H
    scale = 0.07
    base = _attn_case(device, dtype, 1, 9, 40, 20, H, dc, dr)
    want = inv.attention(*base[:5], scale)[0]                              # [T, H, dc] of the target request
    for M, T in ((7, 7), (64, 9), (520, 65), (4160, 65)):
        B = M // T
        q_lat, q_pe, kv, past, anc, pars = _attn_case(device, dtype, B, T, 40, 21 + M, H, dc, dr)
        if T == 9:   # the target request (first) inside a batch of M rows
            for t, x in zip((q_lat, q_pe, kv, past, anc), base[:5]):
                t[0] = x[0]
            got = inv.attention(q_lat, q_pe, kv, past, anc, scale)[0]
            assert bitwise_equal(got, want), f"attention rows, M={M}"
        out = inv.attention(q_lat, q_pe, kv, past, anc, scale)
        _check_ar_equals_verify(out, q_lat, q_pe, kv, past, pars, scale, b=B - 1)
    vis = visible_mask(base[3], 9, base[2].shape[1], base[4])
    ref = attention_absorbed(*(t.double() for t in base[:3]), vis, scale, dc)[0]
    assert (want.double() - ref).abs().max() <= 0.02 * ref.abs().max(), "attention value"


def _check_ar_equals_verify(out, q_lat, q_pe, kv, past, pars, scale, b):
    """For every node t of request b: AR (T = 1) over a cache with the node's ancestors at c..c+d-1."""
    c = int(past[b])
    dep = depths(pars[b])
    for t in range(q_lat.shape[1]):
        chain = [t]
        while pars[b][chain[-1]] >= 0:
            chain.append(int(pars[b][chain[-1]]))
        chain = chain[::-1]                                                # root .. t
        kv_ar = kv[b:b + 1].clone()
        kv_ar[0, c:c + len(chain)] = kv[b, [c + j for j in chain]]
        pos = torch.tensor([c + int(dep[t])], dtype=torch.int32, device=kv.device)
        ar = inv.attention(q_lat[b:b + 1, t:t + 1], q_pe[b:b + 1, t:t + 1], kv_ar, pos, None, scale)[0, 0]
        assert bitwise_equal(ar, out[b, t]), f"AR != verify at node {t} (depth {dep[t]})"


def test_key_lists_follow_depth_order():
    """Ancestors are listed by depth even when tree slots are not in depth order; causal = 0..t."""
    par = np.array([-1, 0, 0, 2, 1, 3])
    kl = inv.key_lists(torch.tensor([5], dtype=torch.int32), 6, anc_bits([par], 6))
    assert kl.nt.tolist() == [1, 2, 2, 3, 3, 4] and kl.tidx[5, :4].tolist() == [0, 2, 3, 5]
    perm_par = np.array([-1, 3, 0, 0, 2])   # slot 1's parent is slot 3 (a later slot): order by depth still
    kl = inv.key_lists(torch.tensor([2], dtype=torch.int32), 5, anc_bits([perm_par], 5))
    assert kl.tidx[1, :3].tolist() == [0, 3, 1]
    kc = inv.key_lists(torch.tensor([0, 4], dtype=torch.int32), 3, None)
    assert kc.nt.tolist() == [1, 2, 3, 1, 2, 3] and kc.c.tolist() == [0, 0, 0, 4, 4, 4]


def test_tree_sum_ignores_trailing_zeros():
    """The property the CPU attention needs: padding a key list with zeros never changes a tree sum."""
    x = torch.randn(5, 37, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    for n in (38, 64, 100):
        padded = torch.cat((x, torch.zeros(5, n - 37)), -1)
        assert bitwise_equal(inv.tree_sum(padded), inv.tree_sum(x))


def test_cuda_without_triton_raises(monkeypatch):
    """No silent fallback: a CUDA tensor without the Triton kernels is an error naming the cause."""
    monkeypatch.setattr(inv.tk, "AVAILABLE", False)
    monkeypatch.setattr(inv.tk, "IMPORT_ERROR", "import triton failed: test")
    cuda_like = type("CudaTensor", (), {"device": torch.device("cuda")})()   # a stand-in: no GPU needed
    with pytest.raises(RuntimeError, match="needs Triton .import triton failed: test.; it has no fallback"):
        inv._cuda(cuda_like)
    assert inv._cuda(torch.zeros(1)) is False
