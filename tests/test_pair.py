"""The shipped trained pair (plans/0007): tokenizer and weights load on CPU and reproduce the committed float32
reference logits; bad or missing files are one-line errors naming the file; training is deterministic for a
seed at a tiny size; the drafter's training form equals its inference form."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kdbench import kdtr, pair, tokenizer
from kdbench.errors import UserError
from kdbench.model.drafter import BlockDrafter, DrafterConfig
from kdbench.model.transformer import Transformer
from kdbench.references.model_config import get_preset
from kdbench.train_drafter import DrafterTrainConfig, block_logits, train_drafter
from kdbench.train_target import TargetTrainConfig, train_target

ROOT = Path(__file__).parents[1]
REF = ROOT / "tests" / "data" / "pair_reference.kdtr"


def _reference_module():
    spec = importlib.util.spec_from_file_location("pair_reference", ROOT / "reports" / "h200" / "pair" / "pair_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_pair_reproduces_the_reference_logits():
    want = kdtr.load(REF, mmap=False)
    got = _reference_module().reference()
    assert np.array_equal(got["prompts"], want["prompts"])
    for key in ("target_logits", "drafter_logits"):
        assert got[key].shape == want[key].shape
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4, err_msg=key)
        assert np.array_equal(got[key].argmax(-1), want[key].argmax(-1))
    assert want["target_logits"].std() > 1.0      # a trained model, not a flat or zero output


def test_shipped_pair_sizes_and_tokenizer():
    sizes = sum((pair.DATA / f).stat().st_size for f in (pair.TARGET_FILE, pair.DRAFTER_FILE))
    assert sizes <= 32 * 2**20
    tok = tokenizer.load()
    assert tok.get_vocab_size() == get_preset(pair.PRESET).vocab_size == tokenizer.VOCAB
    assert tok.token_to_id(tokenizer.MASK) == tokenizer.VOCAB - 1 == pair.drafter_config().mask_id
    text = "def f(x):\n    return {'a': [1, 2.5]}  # ünïcode\n"
    ids = tokenizer.encode(tok, text)
    assert tokenizer.decode(tok, ids) == text and tokenizer.VOCAB - 1 not in ids


def _copy(tmp_path) -> Path:
    for f in (pair.TARGET_FILE, pair.DRAFTER_FILE, pair.META_FILE):
        shutil.copy(pair.DATA / f, tmp_path / f)
    return tmp_path


@pytest.mark.parametrize("which", [pair.TARGET_FILE, pair.DRAFTER_FILE, pair.META_FILE])
def test_missing_file_names_it(tmp_path, which):
    root = _copy(tmp_path)
    (root / which).unlink()
    with pytest.raises(UserError, match=which.replace(".", r"\.") + ".*missing"):
        pair.load_drafter(pair.load_target(root=root), root=root)


@pytest.mark.parametrize("which", [pair.TARGET_FILE, pair.DRAFTER_FILE])
def test_corrupt_weight_file_names_it(tmp_path, which):
    root = _copy(tmp_path)
    data = bytearray((root / which).read_bytes())
    data[len(data) // 2] ^= 0xFF                  # one flipped byte in the tensor data: the CRC must catch it
    (root / which).write_bytes(bytes(data))
    with pytest.raises(UserError, match=which.replace(".", r"\.")):
        pair.load_drafter(pair.load_target(root=root), root=root)


def test_misshapen_weights_name_the_file(tmp_path):
    root = _copy(tmp_path)
    w = kdtr.load(root / pair.TARGET_FILE, mmap=False)
    w.pop("layers.0.wo")
    kdtr.save(root / pair.TARGET_FILE, w)
    with pytest.raises(UserError, match=r"pair_target\.kdtr.*layers\.0\.wo"):
        pair.load_target(root=root)


def _tiny_pair_run(seed):
    cfg = get_preset("tiny")
    stream = np.random.default_rng(5).integers(0, cfg.vocab_size - 1, 4000).astype(np.int32)
    tw, tcurve = train_target(cfg, stream, TargetTrainConfig(seed=seed, steps=3, batch=2, seq_len=24), log=lambda m: None)
    target = Transformer(cfg, pair.bf16_round(tw))
    dc = DrafterConfig.for_target(cfg, tap_layers=(0, 1), block_size=5)
    seqs = torch.from_numpy(np.random.default_rng(seed).integers(0, cfg.vocab_size - 1, (4, 20)))
    dtc = DrafterTrainConfig(seed=seed, steps=3, batch=2, anchors=3, prompt_len=6)
    dw, dcurve = train_drafter(target, dc, seqs, dtc, log=lambda m: None)
    return tw, dw, tcurve, dcurve


def test_training_is_deterministic_for_a_seed():
    a, b, c = _tiny_pair_run(1), _tiny_pair_run(1), _tiny_pair_run(2)
    for part in (0, 1):
        assert a[part].keys() == b[part].keys()
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part])
        assert any(not torch.equal(a[part][k], c[part][k]) for k in a[part] if not k.endswith("norm"))
    for curve in (2, 3):
        assert [r["loss"] for r in a[curve]] == [r["loss"] for r in b[curve]]
    assert a[2][-1]["loss"] < a[2][0]["loss"] + 1.0   # finite, not diverging


def test_router_bias_moves_toward_balance():
    cfg = get_preset("tiny")
    stream = np.random.default_rng(3).integers(0, cfg.vocab_size - 1, 4000).astype(np.int32)
    tw, _ = train_target(cfg, stream, TargetTrainConfig(seed=0, steps=2, batch=2, seq_len=16), log=lambda m: None)
    from kdbench.model.weights import init_weights
    w0 = init_weights(cfg, 0, "cpu", torch.float32)
    for layer in range(cfg.n_dense_layers, cfg.n_layers):
        step = (tw[f"layers.{layer}.gate_bias"] - w0[f"layers.{layer}.gate_bias"]).abs()
        assert torch.all(step <= 2 * 1e-3 + 1e-7) and step.max() > 0   # +-speed per step, no gradient


@pytest.mark.parametrize("anchor", [3, 9])
def test_drafter_training_form_equals_inference(anchor):
    cfg = get_preset("tiny")
    target = Transformer.random(cfg, 4, dtype=torch.float64)
    dr = BlockDrafter.random(target, 6, block_size=5)
    S = 16
    tokens = torch.from_numpy(np.random.default_rng(anchor).integers(0, cfg.vocab_size - 1, (1, S)))
    feats = target.forward(tokens, torch.arange(S)[None], target.new_cache(1, S), torch.zeros(1, dtype=torch.int32),
                           tap_layers=dr.tap_layers).taps
    got = block_logits(dr, feats, tokens, torch.tensor([[anchor, 1]]))[0, 0]       # two blocks, compare the first
    dr.reset(1, S + 8)
    dr.begin(feats[:, :anchor], torch.tensor([anchor]))
    want = dr.draft(tokens[:, anchor], torch.tensor([anchor]), S + 8)[0]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
