"""The block drafter (context cache semantics, batch independence, tap defaults) and the synthetic drafter
(the true token's rank and mass, its name, its errors)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdbench.model import drafter as drafter_mod
from kdbench.model import mla
from kdbench.model.drafter import BlockDrafter, DrafterConfig, default_taps
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer


@pytest.fixture(scope="module")
def target():
    return Transformer.from_reference(get_preset("tiny"), 2)


def _taps(seed, B, T, F):
    return torch.randn(B, T, F, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_draft_shapes_and_shared_weights(target):
    d = BlockDrafter.random(target, seed=0)
    assert d.depth == 15 and d.dc.mask_id == target.cfg.vocab_size - 1 and d.tap_layers == (0, 1)
    assert d.embed is target.w["embed"] and d.lm_head is target.w["lm_head"]
    d.reset(2, 64)
    d.begin(_taps(0, 2, 5, 2 * target.cfg.hidden), torch.tensor([5, 3], dtype=torch.int32))
    logits = d.draft(torch.tensor([4, 9]), d.ctx_len, kv_limit=64)
    assert logits.shape == (2, 15, target.cfg.vocab_size) and torch.isfinite(logits).all()


def test_incremental_context_equals_one_shot(target):
    """begin(all rows) == begin(first rows) + commit(rest): the context cache is position-exact."""
    d = BlockDrafter.random(target, seed=1, block_size=6)
    taps = _taps(1, 1, 9, 2 * target.cfg.hidden)
    d.reset(1, 32)
    d.begin(taps, torch.tensor([9], dtype=torch.int32))
    one = d.draft(torch.tensor([7]), d.ctx_len, 32)
    d.reset(1, 32)
    d.begin(taps[:, :4], torch.tensor([4], dtype=torch.int32))
    d.commit(torch.cat((taps[:, 4:], taps[:, :2]), 1), torch.tensor([5], dtype=torch.int32))  # 2 garbage rows
    assert int(d.ctx_len[0]) == 9
    torch.testing.assert_close(d.draft(torch.tensor([7]), d.ctx_len, 32), one, rtol=1e-12, atol=1e-12)


def test_rows_beyond_context_are_invisible_and_batch_independent(target):
    d = BlockDrafter.random(target, seed=2, block_size=4)
    F = 2 * target.cfg.hidden
    d.reset(2, 16)
    d.begin(_taps(2, 2, 6, F), torch.tensor([6, 2], dtype=torch.int32))
    both = d.draft(torch.tensor([3, 5]), d.ctx_len, 16)
    d.ctx_k[:, 1, 2:] = 1e6  # rows past request 1's context length must not matter
    d.ctx_v[:, 1, 2:] = float("nan")
    torch.testing.assert_close(d.draft(torch.tensor([3, 5]), d.ctx_len, 16), both, rtol=0, atol=0)
    single = BlockDrafter(d.dc, target, d.w)
    single.reset(1, 16)
    single.begin(_taps(2, 2, 6, F)[1:, :2], torch.tensor([2], dtype=torch.int32))
    torch.testing.assert_close(single.draft(torch.tensor([5]), single.ctx_len, 16), both[1:], rtol=1e-12, atol=1e-12)
    changed = _taps(3, 2, 6, F)
    d.begin(changed, torch.tensor([6, 2], dtype=torch.int32))
    assert not torch.allclose(d.draft(torch.tensor([3, 5]), d.ctx_len, 16)[0], both[0]), "context must matter"


def test_default_taps_follow_the_reference_formula():
    assert default_taps(36, 5) == (1, 9, 17, 25, 33)           # Qwen3-8B drafter
    assert default_taps(24, 5) == (1, 6, 11, 16, 21)           # Qwen2.5-0.5B
    assert default_taps(61, 6) == (1, 12, 24, 35, 47, 58)      # Kimi-K2.5 DFlash
    assert default_taps(36, 1) == (18,)
    assert default_taps(4, 3) == (0, 2, 3) and default_taps(2, 2) == (0, 1)  # degenerate: spread over all


def test_drafter_config_errors(target):
    with pytest.raises(ValueError, match="block_size"):
        DrafterConfig.for_target(target.cfg, block_size=1)
    with pytest.raises(ValueError, match="n_kv_heads"):
        DrafterConfig.for_target(target.cfg, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="mask_token_id"):
        DrafterConfig.for_target(target.cfg, mask_token_id=target.cfg.vocab_size)


def test_synthetic_true_token_rank_and_mass():
    V, L, B = 12, 6, 400
    oracle = [list(np.random.default_rng(b).integers(0, V, 20)) for b in range(B)]
    s = SyntheticDrafter(oracle, V, depth=L, quality=0.7, rank_probs=(0.5, 0.3, 0.2), seed=3)
    assert s.name == "synthetic(q=0.7,ranks=0.5/0.3/0.2)"
    s.reset(B, 32)
    start = torch.full((B,), 4)
    logits = s.draft(torch.zeros(B, dtype=torch.int64), start, 32)  # [B, L, V]
    true = torch.tensor([o[5:5 + L] for o in oracle])               # positions start + 1 .. start + L
    rank = (logits > logits.gather(-1, true[..., None])).sum(-1)    # tokens strictly above the true one
    freq = torch.bincount(rank.flatten(), minlength=3).double() / (B * L)
    assert rank.max() <= 2 and torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.04)
    p = torch.softmax(logits, -1)
    top = p.max(-1).values
    assert torch.allclose(top, torch.full_like(top, 0.7 / (1 - 0.3 ** V)), rtol=1e-5), "rank 0 holds ~quality"
    assert (torch.sort(p, -1, descending=True).values[..., 1:] / torch.sort(p, -1, descending=True).values[..., :-1]
            ).sub(0.3).abs().max() < 1e-4, "geometric profile"


def test_synthetic_past_oracle_end_and_errors():
    s = SyntheticDrafter([[1, 2, 3]], 8, depth=4, quality=1.0)
    assert s.name == "synthetic(q=1)"
    s.reset(1, 16)
    logits = s.draft(torch.tensor([3]), torch.tensor([2]), 16)     # every depth is past the oracle's end
    assert torch.isfinite(logits).all() and logits.shape == (1, 4, 8)
    with pytest.raises(ValueError, match="quality"):
        SyntheticDrafter([[1]], 8, quality=0.0)
    with pytest.raises(ValueError, match="oracle"):
        SyntheticDrafter([[9]], 8)
    with pytest.raises(ValueError, match="batch"):
        SyntheticDrafter([[1], [2]], 8).reset(3, 16)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the lm_head GEMM writing float32)")])])
def test_draft_logits_of_a_half_drafter_are_the_float32_accumulators(device, monkeypatch):
    """As the target's head (plans/0017): a bf16 drafter's logits are the lm_head GEMM's float32 accumulators
    (mla.logits_f32), never rounded to bf16, so tree_build's top-k sees no bf16 ties: against the float64 product
    of the same bf16 final-norm rows the error is float32 summation, far below one bf16 rounding."""
    model = Transformer.from_reference(get_preset("tiny"), 2)
    w = {k: v.to(device=device, dtype=torch.float32 if k.endswith("gate_bias") else torch.bfloat16)
         for k, v in model.w.items()}
    d = BlockDrafter.random(Transformer(model.cfg, w), seed=3)
    d.reset(2, 64)
    d.begin(_taps(1, 2, 6, 2 * model.cfg.hidden).to(device=device, dtype=torch.bfloat16),
            torch.tensor([6, 4], dtype=torch.int32, device=device))
    rows = []                                                   # the final-norm rows the head multiplies
    monkeypatch.setattr(drafter_mod, "logits_f32", lambda h, lm: rows.append(h) or mla.logits_f32(h, lm))
    got = d.draft(torch.tensor([4, 9], device=device), d.ctx_len, kv_limit=64)
    want = rows[0].double() @ d.lm_head.double().T
    err = float((got.double() - want).abs().max() / want.abs().max())
    rounded = float((got.bfloat16().double() - want).abs().max() / want.abs().max())
    assert got.dtype == torch.float32 and got.shape == (2, 15, model.cfg.vocab_size)
    assert err < 1e-5 and rounded > 10 * err, (err, rounded)
