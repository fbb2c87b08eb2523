"""The torch target model (suite/model) against the float64 numpy reference: prefill, decode and tree verify
(batched, ragged), routing, expert dispatch, weights init and KDTR round trip."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kdbench.model import moe as tmoe
from kdbench.model import weights as tw
from kdbench.model.presets import get_preset
from kdbench.model.transformer import Transformer
from kdbench.references import model as ref
from kdbench.references import moe as ref_moe
from kdbench.references import tree_build as ref_tb


REL = 1e-9  # float64 torch vs float64 numpy: different summation orders only


def _rel_err(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


@pytest.fixture(scope="module", params=["tiny", "tiny-groups"])
def setup(request):
    cfg = get_preset(request.param)
    seed = 5
    taps = tuple(range(cfg.n_layers))
    return cfg, ref.init_weights(cfg, seed), Transformer.from_reference(cfg, seed, tap_layers=taps)


def _prefill_batch(model, prompts, max_len=64):
    B, P = len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros(B, P, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = torch.tensor(p)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    cache = model.new_cache(B, max_len)
    out = model.forward(tokens, torch.arange(P).expand(B, P), cache, torch.zeros(B, dtype=torch.int32))
    cache.lengths.copy_(lens)
    return out, cache


def test_prefill_and_decode_match_reference(setup):
    cfg, w_np, model = setup
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (7, 3, 11)]  # ragged
    out, cache = _prefill_batch(model, prompts)
    nxt = [int(t) for t in rng.integers(0, cfg.vocab_size, len(prompts))]
    dec = model.forward(torch.tensor(nxt)[:, None], cache.lengths.long()[:, None], cache, cache.lengths)
    for b, p in enumerate(prompts):
        r_out, r_cache = ref.prefill(w_np, cfg, p)
        assert _rel_err(out.logits[b, :len(p)], r_out.logits) < REL, f"prefill logits, request {b}"
        taps = np.concatenate(list(r_out.layer_outputs), axis=-1)  # [T, n_layers * d]
        assert _rel_err(out.taps[b, :len(p)], taps) < REL, f"prefill taps, request {b}"
        r_dec = ref.decode(w_np, cfg, nxt[b], r_cache)
        assert _rel_err(dec.logits[b], r_dec.logits) < REL, f"decode logits, request {b}"
        kv = cache.kv[:, b, :len(p) + 1].numpy()  # the cache rows, every layer
        want = np.stack([np.concatenate([c, k], -1) for c, k in zip(r_cache.c_kv, r_cache.k_pe)])
        assert _rel_err(kv, want) < REL, f"cache rows, request {b}"


def test_logit_rows_selects_last_prompt_token(setup):
    cfg, _, model = setup
    prompts = [[1, 2, 3, 4], [5, 6]]
    full, _ = _prefill_batch(model, prompts)
    cache = model.new_cache(2, 16)
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    out = model.forward(tokens, torch.arange(4).expand(2, 4), cache, torch.zeros(2, dtype=torch.int32),
                        logit_rows=torch.tensor([3, 1]))
    assert out.logits.shape == (2, 1, cfg.vocab_size)
    assert _rel_err(out.logits[0, 0], full.logits[0, 3]) < REL and _rel_err(out.logits[1, 0], full.logits[1, 1]) < REL


def test_tree_verify_matches_reference(setup):
    """Two requests with different trees and prefix lengths, padded to one N (padding rows present)."""
    cfg, w_np, model = setup
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (6, 9)]
    _, cache = _prefill_batch(model, prompts)
    cache.kv[:, :, 21:] = float("nan")  # unused rows (inside kv_limit too) must never reach an output
    trees = [ref_tb.build_tree(rng.standard_normal((4, cfg.vocab_size)), budget, root)
             for budget, root in ((9, 17), (5, 40))]
    N = 12
    arrays = [ref_tb.pad_tree_arrays(t, N) for t in trees]
    tokens = torch.tensor(np.stack([a["tokens"] for a in arrays]))
    positions = cache.lengths.long()[:, None] + torch.tensor(np.stack([a["depths"] for a in arrays]))
    anc = torch.tensor(np.stack([a["bitmask"] for a in arrays]).view(np.int64))
    out = model.forward(tokens, positions, cache, cache.lengths, anc, kv_limit=32)
    for b, (p, tree) in enumerate(zip(prompts, trees)):
        _, r_cache = ref.prefill(w_np, cfg, p)
        r = ref.tree_verify(w_np, cfg, tree.tokens, tree.depths, ref_tb.visibility(tree), r_cache)
        assert _rel_err(out.logits[b, :tree.size], r.logits) < REL, f"tree logits, request {b}"
        assert np.isfinite(out.logits[b].numpy()).all(), "padding rows must stay finite"
    # attn="cuda" over a cache wider than bf16 is refused (a silent torch fallback would be timed as cuda)
    with pytest.raises(ValueError, match="bfloat16 cache"):
        model.forward(tokens, positions, cache, cache.lengths, anc, kv_limit=32, attn="cuda")


def test_route_matches_reference_with_ties():
    cfg = get_preset("tiny-groups")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, cfg.hidden))
    gate = rng.standard_normal((cfg.n_routed_experts, cfg.hidden)) / 8
    gate[5] = gate[4]  # identical experts: exact score ties, broken by the lower index
    gate[9] = gate[1]
    bias = np.round(rng.standard_normal(cfg.n_routed_experts), 1) * 0.05
    bias[5] = bias[4]
    for c in (cfg, get_preset("tiny")):
        g = gate[:c.n_routed_experts]
        idx, wts = tmoe.route(torch.tensor(x), torch.tensor(g), torch.tensor(bias[:c.n_routed_experts]), c)
        r_idx, r_w = ref_moe.route(x, g, bias[:c.n_routed_experts], c)
        assert (idx.numpy() == r_idx).all(), f"{c.name}: routing indices differ"
        assert _rel_err(wts, r_w) < 1e-12


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5)])
def test_grouped_dispatch_equals_loop(dtype, atol):
    """torch._grouped_mm over expert-sorted slots (the GPU path) equals the per-expert loop; CPU float32."""
    cfg = dataclasses.replace(get_preset("tiny"), hidden=64, moe_intermediate=32, n_routed_experts=8)
    w = tw.from_numpy(ref.init_weights(cfg, 4), dtype=dtype)
    x = torch.randn(13, cfg.hidden, generator=torch.Generator().manual_seed(0), dtype=dtype)
    if not tmoe._grouped_available(x, w["layers.1.experts.w1"]):
        pytest.skip("torch._grouped_mm does not run on CPU float32 in this torch build")
    loop = tmoe.moe_forward(w, cfg, 1, x, dispatch="loop")
    grouped = tmoe.moe_forward(w, cfg, 1, x, dispatch="grouped")
    torch.testing.assert_close(grouped, loop, atol=atol, rtol=1e-5)


def test_torch_init_and_kdtr_roundtrip(tmp_path):
    cfg = get_preset("tiny")
    w = tw.init_weights(cfg, seed=1, dtype=torch.float32)
    tw.check_weights(cfg, w)
    assert abs(float(w["embed"].std()) - 1.0) < 0.05 and abs(float(w["layers.0.wo"].std()) * 8 - 1.0) < 0.1
    assert torch.equal(w["embed"], tw.init_weights(cfg, seed=1, dtype=torch.float32)["embed"]), "seeded"
    wb = {k: v.to(torch.bfloat16) if k != "layers.1.gate_bias" else v for k, v in w.items()}
    for ws in (w, wb):
        tw.save(tmp_path / "w.kdtr", ws)
        back = tw.load(tmp_path / "w.kdtr")
        assert all(torch.equal(back[k], ws[k]) and back[k].dtype == ws[k].dtype for k in ws)


def test_bad_model_options():
    cfg = get_preset("tiny")
    w = tw.init_weights(cfg, 0)
    with pytest.raises(ValueError, match="kv_lora_rank 512"):
        Transformer(cfg, w, attn="cuda")
    with pytest.raises(ValueError, match="tap layers"):
        Transformer(cfg, w, tap_layers=(5,))
    with pytest.raises(ValueError, match="missing"):
        Transformer(cfg, {k: v for k, v in w.items() if k != "norm"})


def test_rms_norm_takes_the_eager_formula_off_the_gpu_and_under_autograd():
    """CPU tensors, float32 / float64 and tensors that need a gradient run the eager formula (the Triton norm
    has no backward); its value is x / rms(x) * w."""
    from kdbench.model import mla
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 40, generator=g), torch.randn(40, generator=g)
    assert not mla._fused_norm_runs(x.bfloat16(), w.bfloat16())
    want = x.double() / x.double().pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w.double()
    assert torch.allclose(mla.rms_norm(x.double(), w.double(), 1e-6), want, rtol=1e-12, atol=0)
    xr = x.clone().requires_grad_()
    mla.rms_norm(xr, w, 1e-6).sum().backward()
    assert xr.grad is not None and torch.isfinite(xr.grad).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the Triton norm of the default path)")
@pytest.mark.parametrize("rows, d", [(1, 7168), (7, 1536), (520, 512), (3, 7)])
def test_rms_norm_on_the_gpu_is_one_launch_of_the_same_formula(rows, d):
    """bf16 on a GPU: the fused norm (a strided input included, like the latent's slice of kv_a's output) equals
    the eager formula within one bf16 rounding and float64 within bf16 tolerance; under autograd the eager one runs."""
    from kdbench.model import mla
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, d + 64, generator=g, device="cuda") * 3).bfloat16()[:, :d]
    w = (torch.randn(d, generator=g, device="cuda") * 0.05 + 1).bfloat16()
    assert mla._fused_norm_runs(x, w)
    got = mla.rms_norm(x, w, 1e-6)
    xf = x.float()
    eager = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    want = x.double() / x.double().pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w.double()
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    ulp = (eager.float().abs() * 2 ** -7).clamp(min=1e-30)               # one bf16 step at each value
    assert ((got.float() - eager.float()).abs() <= ulp).all()
    assert float((got.double() - want).abs().max() / want.abs().max()) < 8e-3
    with torch.enable_grad():
        assert not mla._fused_norm_runs(x.clone().requires_grad_(), w)


def test_rope_takes_the_eager_formula_off_the_gpu_and_under_autograd():
    from kdbench.model import mla
    cfg = get_preset("kimi-k2-slice-2")
    freqs = mla.inv_freq(cfg, "cpu")
    x, pos = torch.randn(2, 3, 4, 64).bfloat16(), torch.randint(0, 100, (2, 3))
    assert not mla._fused_rope_runs(x, pos, freqs)
    xr = torch.randn(2, 3, 64, requires_grad=True)
    mla.rope_interleaved(xr, pos, freqs).sum().backward()
    assert xr.grad is not None


def test_rope_refuses_heads_per_program_that_are_not_a_power_of_2():
    from kdbench.model import fused_triton as ft
    x, pos, freqs = torch.zeros(1, 1, 8, 64), torch.zeros(1, 1, dtype=torch.int64), torch.zeros(32, dtype=torch.float64)
    for bad in (0, 6, -4):
        with pytest.raises(ValueError, match="block_heads must be a power of 2"):
            ft.rope(x, pos, freqs, block_heads=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the Triton RoPE of the default path)")
@pytest.mark.parametrize("shape, lead, pos_form", [((3, 5, 64, 64), 128, "random"), ((2, 7, 64), 512, "random"),
                                                    ((1, 1, 128, 64), 128, "int32"), ((4, 65, 64), 0, "prefill")])
def test_rope_on_the_gpu_is_one_launch_of_the_same_rotation(shape, lead, pos_form):
    """bf16 views like q_pe (the last 64 of 192 per head) and k_pe (the last 64 of the 576-wide kv_a output) at
    positions up to 131K (int64, int32, or prefill's arange expanded over the batch: batch stride 0): the Triton
    RoPE equals the eager rotation within one bf16 rounding (bit-equal on most elements: no FMA contraction), and
    float64 within bf16 tolerance; under autograd the eager one runs."""
    from kdbench.model import fused_triton as ft
    from kdbench.model import mla
    cfg = get_preset("kimi-k2-slice-2")
    g = torch.Generator(device="cuda").manual_seed(len(shape) + lead)
    freqs = mla.inv_freq(cfg, "cuda")
    x = torch.randn(*shape[:-1], shape[-1] + lead, generator=g, device="cuda").bfloat16()[..., lead:]
    pos = torch.randint(0, 131072, shape[:2], generator=g, device="cuda")
    if pos_form == "int32":
        pos = pos.int()
    elif pos_form == "prefill":
        pos = torch.arange(shape[1], device="cuda").expand(shape[0], shape[1])
    assert mla._fused_rope_runs(x, pos, freqs)
    with torch.enable_grad():
        assert not mla._fused_rope_runs(x.clone().requires_grad_(), pos, freqs)
    ang = pos.double()[..., None] * freqs
    eager = mla._rotate(x, torch.cos(ang), torch.sin(ang))
    shp = ang.shape[:2] + (1,) * (x.dim() - 3) + ang.shape[-1:]
    c, s, xd = torch.cos(ang).view(shp), torch.sin(ang).view(shp), x.double()
    want = torch.stack((xd[..., 0::2] * c - xd[..., 1::2] * s, xd[..., 0::2] * s + xd[..., 1::2] * c), -1).flatten(-2)
    ulp = (eager.float().abs() * 2 ** -7).clamp(min=1e-30)
    # the shipped form (float32 cos / sin of the float64-reduced angle), s11's float64 cos / sin, all heads or 8 a program
    for got in (mla.rope_interleaved(x, pos, freqs), ft.rope(x, pos, freqs, fp64_trig=True),
                ft.rope(x, pos, freqs, block_heads=64), ft.rope(x, pos, freqs, block_heads=8)):
        assert got.shape == x.shape and got.dtype == torch.bfloat16 and got.is_contiguous()
        assert ((got.float() - eager.float()).abs() <= ulp).all()
        assert float((got == eager).float().mean()) > 0.99
        assert float((got.double() - want).abs().max() / want.abs().max()) < 8e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the half-input GEMM with float32 output)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 520])
def test_gate_logits_on_the_gpu_are_the_float32_matmul_of_the_half_inputs(dtype, rows):
    """One GEMM of the half inputs with float32 output (no float32 weight copy): the half-input GEMM itself, float32
    values within float32 summation error of the float64 dot product of the same half values (tensor cores add in
    float32 with truncation: a few 1e-6 of the largest), on fresh inputs with ties in the weight."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 7168, generator=g, device="cuda").to(dtype)
    w = (torch.randn(384, 7168, generator=g, device="cuda") * 7168 ** -0.5).to(dtype)
    w[1] = w[0]                                                       # two experts with equal logits
    got = tmoe.gate_logits(x, w)
    want = x.double() @ w.double().T
    assert got.dtype == torch.float32 and torch.equal(got[:, 0], got[:, 1])
    assert torch.equal(got, torch.mm(x, w.T, out_dtype=torch.float32)), "the half-input GEMM ran, not a fallback"
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < 1e-5, err      # tensor-core float32 accumulation: 3e-6 and 4e-6 seen on the H200 (s11 call C)


def _bf16_target(batch_invariant: bool, device: str = "cpu") -> Transformer:
    model = Transformer.from_reference(get_preset("tiny"), 5, batch_invariant=batch_invariant)
    w = {k: v.to(device=device, dtype=torch.float32 if k.endswith("gate_bias") else torch.bfloat16)
         for k, v in model.w.items()}
    return Transformer(model.cfg, w, batch_invariant=batch_invariant)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "invariant"])
def test_head_logits_of_a_half_model_are_never_rounded_to_bf16(batch_invariant):
    """plans/0017: the lm_head's float32 accumulation is the logits. Against the float64 product of the same bf16
    values the error is float32 summation (~1e-7 of the largest), where a bf16 rounding of the logits is ~1e-3;
    in the batch-invariant mode a row's logits are the same bits in a 1-row and a 9-row call."""
    model = _bf16_target(batch_invariant)
    g = torch.Generator().manual_seed(17)
    h = torch.randn(3, 3, model.cfg.hidden, generator=g).bfloat16()
    got = model.head(h)
    hidden = model.ops.rms_norm(h, model.w["norm"], model.cfg.rms_eps)
    want = hidden.double() @ model.w["lm_head"].double().T
    err = float((got.double() - want).abs().max() / want.abs().max())
    rounded = float((got.bfloat16().double() - want).abs().max() / want.abs().max())
    assert got.dtype == torch.float32 and got.shape == (3, 3, model.cfg.vocab_size)
    assert err < 1e-5 and rounded > 10 * err, (err, rounded)
    if batch_invariant:
        assert torch.equal(model.head(h[:1, :1]), got[:1, :1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the lm_head GEMM writing float32)")
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "invariant"])
def test_head_logits_on_the_gpu_are_the_float32_accumulators(batch_invariant):
    """The same on the GPU: one GEMM of the bf16 inputs writing float32 (the default: torch.mm with out_dtype, no
    fallback), float32 summation error against float64 (tensor cores: a few 1e-6)."""
    model = _bf16_target(batch_invariant, "cuda")
    h = torch.randn(8, 65, model.cfg.hidden, generator=torch.Generator(device="cuda").manual_seed(3),
                    device="cuda").bfloat16()
    got = model.head(h)
    hidden = model.ops.rms_norm(h, model.w["norm"], model.cfg.rms_eps)
    want = hidden.double() @ model.w["lm_head"].double().T
    assert got.dtype == torch.float32
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5
    if not batch_invariant:
        h2 = hidden.reshape(-1, hidden.shape[-1])
        assert torch.equal(got.reshape(h2.shape[0], -1), torch.mm(h2, model.w["lm_head"].T, out_dtype=torch.float32))


def test_float64_swiglu_gives_a_row_the_same_bits_among_any_rows():
    """The exact CPU checks (expert parallelism against one process, AR against verify) need each row of an expert
    GEMM to be independent of the call's row count: every row of calls of 1 .. 70 rows and 128 / 300 rows has the
    bits it has in the 300-row call."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(300, 64, generator=g, dtype=torch.float64)
    w1, w3 = torch.randn(2, 32, 64, generator=g, dtype=torch.float64)
    w2 = torch.randn(64, 32, generator=g, dtype=torch.float64)
    want = tmoe.swiglu(x, w1, w2, w3)
    for m in list(range(1, 71)) + [128, 300]:
        assert torch.equal(tmoe.swiglu(x[:m].clone(), w1, w2, w3), want[:m]), m
