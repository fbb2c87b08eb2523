"""Batching and state: batched AR equals unbatched AR and the numpy reference; after compaction the KV cache
equals an AR run's (and the reference's) over the same tokens; padded trees; the drafter context invariant."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kdbench.engine.engine import generate
from kdbench.engine.stages import Policy
from kdbench.model.drafter import BlockDrafter
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer
from kdbench.references import model as ref


SEED, MAX_NEW = 3, 12


@pytest.fixture(scope="module")
def world():
    cfg = get_preset("tiny-groups")  # group-limited routing and q_lora_rank 0 through the whole engine
    model = Transformer.from_reference(cfg, SEED)
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(0, cfg.vocab_size - 1, n).tolist() for n in (4, 1, 9, 6)]
    ar = generate(model, None, prompts, MAX_NEW, Policy("ar"), keep_state=True)
    return dict(cfg=cfg, model=model, prompts=prompts, ar=ar)


def test_batched_ar_equals_unbatched_and_reference(world):
    cfg, w_np = world["cfg"], ref.init_weights(world["cfg"], SEED)
    for i, p in enumerate(world["prompts"]):
        single = generate(world["model"], None, [p], MAX_NEW, Policy("ar"))
        assert single.tokens[0] == world["ar"].tokens[i], f"prompt {i}: batched AR differs from unbatched"
    for i in (0, 1):  # the numpy reference's own greedy loop
        out, cache = ref.prefill(w_np, cfg, world["prompts"][i])
        toks = [int(np.argmax(out.logits[-1]))]
        while len(toks) < 6:
            toks.append(int(np.argmax(ref.decode(w_np, cfg, toks[-1], cache).logits[-1])))
        assert world["ar"].tokens[i][:6] == toks, f"prompt {i}: engine AR differs from the numpy reference"


def _cache_rows(state, b: int, n: int) -> np.ndarray:
    return state.cache.kv[:, b, :n].numpy()


@pytest.mark.parametrize("policy", [Policy("ddtree", 8), Policy("chain", 15), Policy("ddtree", 64)])
def test_compacted_cache_equals_ar_cache(world, policy):
    oracle = [p + t for p, t in zip(world["prompts"], world["ar"].tokens)]
    drafter = SyntheticDrafter(oracle, world["cfg"].vocab_size, quality=0.7, rank_probs=(0.6, 0.4), seed=1)
    res = generate(world["model"], drafter, world["prompts"], MAX_NEW, policy, keep_state=True)
    assert res.tokens == world["ar"].tokens
    st, st_ar = res.state, world["ar"].state
    assert max(t for s in res.steps for t in s.tau) > 2, "several rows compacted in one step"
    for b, p in enumerate(world["prompts"]):
        n = min(int(st.cache.lengths[b]), int(st_ar.cache.lengths[b]))
        assert n >= len(p) + MAX_NEW - 1
        got, want = _cache_rows(st, b, n), _cache_rows(st_ar, b, n)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-9, f"prompt {b}: compacted cache differs from AR's by {err:.2e} (rel)"
    b = 2  # and the reference's cache over prompt + committed tokens
    n = int(st.cache.lengths[b])
    seq = world["prompts"][b] + res.state.gen[b, :n - len(world["prompts"][b])].tolist()
    _, r_cache = ref.prefill(ref.init_weights(world["cfg"], SEED), world["cfg"], seq)
    want = np.stack([np.concatenate([c, k], -1) for c, k in zip(r_cache.c_kv, r_cache.k_pe)])
    assert np.abs(_cache_rows(st, b, n) - want).max() / np.abs(want).max() < 1e-9


class _NarrowDrafter:
    """Two tokens of positive probability per depth, depth 2: at most 2 + 4 = 6 tree nodes, so a budget of 8
    leaves padding rows in every tree. The two candidates are the AR token and its successor."""
    name, tap_layers = "narrow", ()

    def __init__(self, oracle, vocab):
        self.inner = SyntheticDrafter(oracle, vocab, depth=2, quality=0.9, seed=0)
        self.depth = 2

    def reset(self, batch, max_len):
        self.inner.reset(batch, max_len)

    def begin(self, taps, lengths):
        pass

    def commit(self, taps, count):
        pass

    def draft(self, bonus, start, kv_limit):
        x = self.inner.draft(bonus, start, kv_limit)
        keep = torch.topk(x, 2, dim=-1).indices
        return torch.full_like(x, float("-inf")).scatter_(-1, keep, x.gather(-1, keep))


def test_padded_trees_are_lossless(world):
    oracle = [p + t for p, t in zip(world["prompts"], world["ar"].tokens)]
    res = generate(world["model"], _NarrowDrafter(oracle, world["cfg"].vocab_size), world["prompts"], MAX_NEW,
                   Policy("ddtree", 8))
    assert res.tokens == world["ar"].tokens
    assert all(size == 7 for s in res.steps for size in s.tree_size), "6 nodes + root, 2 padding rows"


def test_drafter_context_tracks_committed_length(world):
    drafter = BlockDrafter.random(world["model"], seed=0, block_size=5)
    res = generate(world["model"], drafter, world["prompts"], MAX_NEW, Policy("ddtree", 16), keep_state=True)
    assert res.tokens == world["ar"].tokens
    assert torch.equal(drafter.ctx_len, res.state.cache.lengths), "draft context = committed positions"


# ------------------------------------------------------------------------------------------- GPU (H200)

def _mla512_target():
    """Tiny elsewhere, the kernel's latent shape (512 + 64) in attention; bf16 on the GPU."""
    cfg = dataclasses.replace(get_preset("tiny"), name="tiny-mla512", hidden=256, n_heads=8, q_lora_rank=64,
                              kv_lora_rank=512, qk_nope_dim=32, qk_rope_dim=64, v_head_dim=32, vocab_size=1024,
                              intermediate=512, moe_intermediate=64)
    return Transformer.random(cfg, 0, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the cuda stage backend")
def test_cuda_step_is_sync_free_and_lossless_up_to_bf16_ties(monkeypatch):
    """Every speculative step on the cuda backend runs under sync_debug_mode("error") (no host read), and its
    greedy tokens equal AR's except where bf16 AR and tree logits near-tie (different kernels and M)."""
    from kdbench.backends import cuda_build
    from kdbench.engine import engine
    if cuda_build.unavailable_reason():
        pytest.skip(f"kdbench_cuda unavailable: {cuda_build.unavailable_reason()}")
    model = _mla512_target()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1023, n).tolist() for n in (5, 17, 2, 40)]
    ar = generate(model, None, prompts, 24, Policy("ar"), backend="cuda")
    drafter = SyntheticDrafter([p + t for p, t in zip(prompts, ar.tokens)], 1024, quality=0.7,
                               rank_probs=(0.6, 0.3, 0.1), device="cuda")
    spec_step = engine._spec_step

    def strict(*args):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return spec_step(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setattr(engine, "_spec_step", strict)
    res = generate(model, drafter, prompts, 24, Policy("ddtree", 32), backend="cuda")
    assert res.mean_tau > 1.5
    for i, (got, want) in enumerate(zip(res.tokens, ar.tokens)):
        pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if pos is None:
            continue
        seq = torch.tensor([prompts[i] + want[:pos]], device="cuda")
        T = seq.shape[1]
        logits = model.forward(seq, torch.arange(T, device="cuda")[None], model.new_cache(1, T),
                               torch.zeros(1, dtype=torch.int32, device="cuda")).logits[0, -1]
        gap = float((logits[want[pos]] - logits[got[pos]]).abs())
        assert gap < 0.25, f"prompt {i} diverges at {pos} ({got[pos]} vs AR {want[pos]}) with a logit gap {gap:.3f}"
