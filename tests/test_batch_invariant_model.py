"""The batch-invariant target as a whole: one request's logits and KV rows are bitwise those of AR alone in AR
batches and tree verifies of M = 1..4160 rows (suite/model/invariant_check.py); greedy speculative decoding equals
AR token for token, also in bf16; the invariant model still matches the float64 reference; no near-tie excuse."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from invariant_helpers import GPU_REASON

from kdbench import runner
from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.stages import Policy
from kdbench.kinds import generation as gen
from kdbench.model import invariant as inv
from kdbench.model.invariant_check import check_forward
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer
from kdbench.results import load_records

FULL = dict(ar_batches=(7, 64, 520), verify_shapes=((1, 65), (8, 65), (64, 65)))   # M = 7..4160
SHORT = dict(ar_batches=(7, 64), verify_shapes=((1, 65), (8, 65)))


@pytest.mark.parametrize("dtype,sizes", [(torch.float32, FULL), (torch.float64, FULL)], ids=["f32", "f64"])
def test_forward_rows_are_batch_invariant_cpu(dtype, sizes):
    model = target_from_preset("tiny-groups", 3, dtype=dtype, batch_invariant=True)
    assert check_forward(model, **sizes) == []


def test_the_check_catches_an_m_dependent_gemm(monkeypatch):
    """A GEMM whose rounding depends on M (here: scaled by 1 + 2^-20 * (M % 3)) fails the check, in logits
    and in the written KV rows, for AR batches and verifies alike."""
    exact = inv.linear
    monkeypatch.setattr(inv, "linear", lambda x, w: exact(x, w) * (1 + 2.0 ** -20 * (x[..., 0].numel() % 3)))
    model = target_from_preset("tiny", 3, dtype=torch.float64, batch_invariant=True)
    fails = check_forward(model, ar_batches=(7,), verify_shapes=((1, 65),))
    assert any(f.startswith("ar B=7") and "logits" in f for f in fails), fails
    assert any(f.startswith("verify B=1 T=65") and "kv" in f for f in fails), fails


def test_invariant_model_matches_default_in_float64():
    """Invariance is not bought with wrong values: float64 invariant vs default forward (the reference's)."""
    cfg_name, seed = "tiny-groups", 5
    base = target_from_preset(cfg_name, seed, dtype=torch.float64, reference_init=True)
    model = Transformer(base.cfg, base.w, batch_invariant=True)
    rng = np.random.default_rng(0)
    tok = torch.from_numpy(rng.integers(0, base.cfg.vocab_size, (3, 9)))
    outs = []
    for m in (base, model):
        cache = m.new_cache(3, 16)
        outs.append(m.forward(tok, torch.arange(9).expand(3, 9), cache, torch.zeros(3, dtype=torch.int32)).logits)
    assert (outs[0] - outs[1]).abs().max() <= 1e-12 * outs[0].abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_greedy_speculative_equals_ar_exactly(dtype):
    """DDTree (budgets 16, 64) and chain give AR's tokens bit for bit at batch 3 with ragged prompts."""
    model = target_from_preset("tiny", 7, dtype=dtype, batch_invariant=True)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 256, n).tolist() for n in (9, 4, 13)]
    ar = generate(model, None, prompts, 20, Policy(kind="ar"))
    oracle = [p + t for p, t in zip(prompts, ar.tokens)]
    for policy in (Policy("ddtree", 16), Policy("ddtree", 64), Policy("chain", 15)):
        drafter = SyntheticDrafter(oracle, 256, depth=6, quality=0.6, rank_probs=(0.5, 0.3, 0.2), seed=4)
        spec = generate(model, drafter, prompts, 20, policy)
        assert spec.tokens == ar.tokens, policy.label
        assert max(t for st in spec.steps for t in st.tau) > 2, "the drafter was never right: test too weak"


def test_invariant_divergence_is_never_excused():
    """In batch-invariant mode any divergence is a MISMATCH with its position, whatever the logit gap."""
    model = target_from_preset("tiny", 7, dtype=torch.bfloat16, batch_invariant=True)
    prompts = [[1, 2, 3, 4]]
    ar = [generate(model, None, prompts, 6, Policy(kind="ar"))]
    logits = gen.next_logits(model, prompts[0] + ar[0].tokens[0][:2]).double()
    runner_up = int(torch.argsort(logits, descending=True)[1])
    planted = [type(ar[0])(tokens=[ar[0].tokens[0][:2] + [runner_up] + ar[0].tokens[0][3:]])]
    assert gen.losslessness(model, prompts, ar, ar) == ("yes", False)
    verdict, bug = gen.losslessness(model, prompts, ar, planted)
    assert bug and verdict.startswith("no: MISMATCH (prompt 0, position 2"), verdict
    loose = Transformer(model.cfg, model.w)   # the default mode excuses the same gap when it is tiny (bf16)
    gap = abs(float(logits[ar[0].tokens[0][2]] - logits[runner_up]))
    assert (gen.losslessness(loose, prompts, ar, planted)[1]) == (gap >= gen.NEAR_TIE_LOGIT[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=GPU_REASON)
def test_forward_rows_are_batch_invariant_cuda():
    """bf16 on the GPU, a 2-layer model at reduced width with the real MLA latent shape (dc 512, dr 64)."""
    cfg = dataclasses.replace(get_preset("kimi-k2-slice-2"), hidden=1024, n_heads=16, q_lora_rank=256,
                              intermediate=1024, moe_intermediate=256, n_routed_experts=32, vocab_size=4096)
    model = Transformer.random(cfg, 3, device="cuda", dtype=torch.bfloat16, batch_invariant=True)
    assert check_forward(model, **FULL) == []


SCENARIO = """
name: inv
kind: acceptance
seed: 9
cases:
  - name: bf16-exact
    backends: [torch]
    shape: {model: tiny, policy: ddtree, budget: 16, prompts: 2, prompt_len: 7, max_new_tokens: 10,
            drafter: synthetic, quality: 0.7, batch: 2, dtype: bfloat16, batch_invariant: true}
"""


def test_scenario_field_runs_the_invariant_target(tmp_path):
    """`batch_invariant: true` reaches the target (records say so) and a bf16 case is lossless exactly."""
    path = tmp_path / "inv.yaml"
    path.write_text(SCENARIO)
    out = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False)
    recs = load_records(tmp_path / "run")
    assert out.exit_code == 0, [(r.case, r.reason) for r in recs]
    assert recs and all(r.extra["batch_invariant"] is True and r.lossless == "yes" for r in recs)
