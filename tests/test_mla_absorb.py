"""The kernel path's absorbed products without layout copies (mla.absorb_into, unabsorb, attention_cuda_absorbed):
the same numbers as the einsums they replace, written in place into the kernel's query buffer (q_pe beside them
untouched) and into wo's input layout; the predicate; on a GPU, the whole attention and the whole forward against
the einsum path."""
from __future__ import annotations

import pytest
import torch

from kdbench.model import mla

CASES = [(2, 3, 4, 16, 32, 8), (1, 1, 64, 128, 512, 64), (3, 7, 5, 9, 11, 3)]   # B, T, H, dn, dc, dr (odd sizes too)


def _q_nope(B, T, H, dn, dr, gen, dtype):
    """A q_nope view as the model makes one: the first dn of each head's dn + dr (last stride 1, head stride dn+dr)."""
    return torch.randn(B, T, H, dn + dr, generator=gen, dtype=torch.float64).to(dtype)[..., :dn]


@pytest.mark.parametrize("B, T, H, dn, dc, dr", CASES)
def test_absorb_into_is_the_einsum_in_place(B, T, H, dn, dc, dr):
    g = torch.Generator().manual_seed(B * 100 + T * 10 + H)
    q_nope = _q_nope(B, T, H, dn, dr, g, torch.float64)
    w_uk = torch.randn(H, 2 * dn, dc, generator=g, dtype=torch.float64)[:, :dn]   # a wkv_b view, as split_wkv_b
    q = torch.full((B, T, H, dc + dr), float("nan"), dtype=torch.float64)           # poisoned
    q[..., dc:] = 7.0
    mla.absorb_into(q_nope, w_uk, q)
    want = torch.einsum("bthn,hnc->bthc", q_nope, w_uk)
    assert torch.allclose(q[..., :dc], want, rtol=1e-12, atol=1e-12)
    assert bool((q[..., dc:] == 7.0).all())                                           # the rope slots untouched


@pytest.mark.parametrize("B, T, H, dn, dc, dr", CASES)
def test_unabsorb_is_the_einsum_in_wo_layout(B, T, H, dn, dc, dr):
    g = torch.Generator().manual_seed(B + T + H)
    o_lat = torch.randn(B, T, H, dc, generator=g, dtype=torch.float64)
    w_uv = torch.randn(H, 2 * dn, dc, generator=g, dtype=torch.float64)[:, dn:]
    got = mla.unabsorb(o_lat, w_uv)
    want = torch.einsum("bthc,hvc->bthv", o_lat, w_uv).flatten(2)
    assert got.shape == (B, T, H * dn) and torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_fused_absorb_needs_bf16_no_grad_and_the_switch():
    x, w = torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16), torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    assert mla.fused_absorb_runs(x, w, w)
    assert not mla.fused_absorb_runs(x.float(), w.float(), w.float()) and not mla.fused_absorb_runs(x, w.float(), w)
    assert not mla.fused_absorb_runs(x, w, w.float())
    wg = w.clone().requires_grad_()
    with torch.enable_grad():
        assert not mla.fused_absorb_runs(x, wg, w)          # bmm(out=) refuses a result that needs a gradient
    with torch.no_grad():
        assert mla.fused_absorb_runs(x, wg, w)
    mla.FUSED_ABSORB = False
    try:
        assert not mla.fused_absorb_runs(x, w, w)
    finally:
        mla.FUSED_ABSORB = True


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the tree_verify_mla kernel)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("B, T", [(1, 1), (8, 1), (3, 65)])
def test_attention_cuda_absorbed_equals_the_einsum_path(B, T):
    from kdbench.backends.chain_device import chain_anc
    g = torch.Generator(device="cuda").manual_seed(B * 7 + T)
    H, dn, dc, dr, past = 64, 128, 512, 64, 200
    q_nope = (torch.randn(B, T, H, dn + dr, generator=g, device="cuda") * 0.3).bfloat16()[..., :dn]
    q_pe = (torch.randn(B, T, H, dr, generator=g, device="cuda") * 0.3).bfloat16()
    wkv = (torch.randn(H, 2 * dn, dc, generator=g, device="cuda") * 0.05).bfloat16()
    w_uk, w_uv = wkv[:, :dn], wkv[:, dn:]
    kv = (torch.randn(B, past + T, dc + dr, generator=g, device="cuda") * 0.5).bfloat16()
    lens = torch.full((B,), past, dtype=torch.int32, device="cuda")
    anc = chain_anc(T, B, "cuda") if T > 1 else torch.ones(B, 1, 1, dtype=torch.int64, device="cuda")
    got = mla.attention_cuda_absorbed(q_nope, q_pe, w_uk, w_uv, kv, lens, anc, 0.1)
    q_lat = torch.einsum("bthn,hnc->bthc", q_nope, w_uk)
    want = torch.einsum("bthc,hvc->bthv", mla.attention_cuda(q_lat, q_pe, kv, lens, anc, 0.1), w_uv).flatten(2)
    rel = float((got.float() - want.float()).norm() / want.float().norm())
    assert got.shape == want.shape and rel < 1e-2, rel
    ref = _chain_attention64(q_nope.double(), q_pe.double(), w_uk.double(), w_uv.double(), kv.double(), past, 0.1)
    assert float((got.double() - ref).norm() / ref.norm()) < 1e-2


def _chain_attention64(q_nope, q_pe, w_uk, w_uv, kv, past: int, scale: float) -> torch.Tensor:
    """float64 absorbed MLA under a chain tree: row t sees the past keys and tree keys 0..t -> [B, T, H * dv]."""
    B, T, H, _ = q_nope.shape
    dc = w_uk.shape[-1]
    q = torch.cat((torch.einsum("bthn,hnc->bthc", q_nope, w_uk), q_pe), -1)                # [B, T, H, dc + dr]
    scores = torch.einsum("bthd,bsd->bths", q, kv) * scale                                  # [B, T, H, S]
    seen = torch.arange(kv.shape[1], device=kv.device)[None, :] <= past + torch.arange(T, device=kv.device)[:, None]
    p = torch.softmax(scores.masked_fill(~seen[None, :, None, :], float("-inf")), -1)
    o_lat = torch.einsum("bths,bsc->bthc", p, kv[..., :dc])
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv).flatten(2)


@pytest.mark.gpu
@needs_gpu
def test_absorbed_products_allocate_no_layout_copies():
    """absorb_into writes the query buffer without a temporary (a copy-back would allocate one), unabsorb allocates
    its output only: the 'no layout copies' the profile showed, pinned by the caching allocator's counters."""
    g = torch.Generator(device="cuda").manual_seed(3)
    B, T, H, dn, dc, dr = 8, 65, 64, 128, 512, 64
    q_nope = torch.randn(B, T, H, dn + dr, generator=g, device="cuda").bfloat16()[..., :dn]
    wkv = torch.randn(H, 2 * dn, dc, generator=g, device="cuda").bfloat16()
    q = torch.empty(B, T, H, dc + dr, dtype=torch.bfloat16, device="cuda")
    o_lat = torch.randn(B, T, H, dc, generator=g, device="cuda").bfloat16()
    mla.absorb_into(q_nope, wkv[:, :dn], q), mla.unabsorb(o_lat, wkv[:, dn:])   # cuBLAS workspaces, warm
    torch.cuda.synchronize()
    count = lambda: torch.cuda.memory_stats()["allocation.all.allocated"]  # noqa: E731
    before = count()
    mla.absorb_into(q_nope, wkv[:, :dn], q)
    assert count() == before
    mla.unabsorb(o_lat, wkv[:, dn:])
    assert count() == before + 1


@pytest.mark.gpu
@needs_gpu
def test_forward_with_and_without_the_fused_absorb_agree():
    from kdbench.engine.engine import target_from_preset
    from kdbench.engine.floor import _inputs
    model = target_from_preset("kimi-k2-slice-2", 29, device="cuda", dtype=torch.bfloat16)
    outs = []
    for fused in (True, False):
        tokens, positions, cache, lens, anc = _inputs(model, 2, 9, 64, 0)
        mla.FUSED_ABSORB = fused
        try:
            with torch.no_grad():
                outs.append(model.forward(tokens, positions, cache, lens, anc, attn="cuda", tap_layers=()).logits)
        finally:
            mla.FUSED_ABSORB = True
    a, b = outs
    assert float((a - b).norm() / b.norm()) < 2e-2
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) > 0.9
