"""Whole-forward batch-invariance check of a target: one request's logits and written latent KV rows, decoded by
AR alone, are bitwise equal when it is decoded among B random requests (M = B rows) and when its tokens sit at
scattered slots of a random tree verified among B requests (M = B * T rows). Used by the tests (tiny, CPU) and
the H200 script (kimi-k2-slice-2, bf16)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Probe:
    """The target request: c0 committed rows of random latents, then `depth` tokens decoded one at a time."""
    c0: int = 37
    depth: int = 4
    c_max: int = 60       # other requests' committed lengths are drawn from 1..c_max
    seed: int = 0


def _request(model, probe: Probe):
    g = torch.Generator().manual_seed(probe.seed)
    kv = torch.randn(model.cfg.n_layers, probe.c0, model.cfg.kv_dim, generator=g)
    tokens = torch.randint(0, model.cfg.vocab_size, (probe.depth,), generator=g)
    return kv.to(model.device, model.dtype), tokens.to(model.device)


def _batch_cache(model, B: int, rows: int, probe: Probe, b0: int, gen: torch.Generator):
    """A cache of B requests with random latents and lengths; request b0 holds the probe's prefix."""
    cache = model.new_cache(B, probe.c_max + rows + 1)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(cache.kv.dtype))
    cache.lengths.copy_(torch.randint(1, probe.c_max + 1, (B,), generator=gen, dtype=torch.int32))
    kv0, _ = _request(model, probe)
    cache.kv[:, b0, :probe.c0] = kv0
    cache.lengths[b0] = probe.c0
    return cache


def ar_decode(model, B: int, probe: Probe, b0: int, gen: torch.Generator):
    """Decode the probe's tokens one step at a time as request b0 of B -> (logits [depth, V], kv rows
    [layers, depth, kv_dim]) of request b0."""
    cache = _batch_cache(model, B, probe.depth, probe, b0, gen)
    _, toks = _request(model, probe)
    logits = []
    for i in range(probe.depth):
        tok = torch.randint(0, model.cfg.vocab_size, (B, 1), generator=gen).to(model.device)
        tok[b0, 0] = toks[i]
        lens = cache.lengths.clone()
        out = model.forward(tok, lens.to(torch.int64)[:, None], cache, lens)
        logits.append(out.logits[b0, 0])
        cache.lengths += 1
    return torch.stack(logits), cache.kv[:, b0, probe.c0:probe.c0 + probe.depth].clone()


def verify(model, B: int, T: int, probe: Probe, b0: int, gen: torch.Generator):
    """Request b0's probe tokens form a chain at random slots of a random tree among B random trees (one
    verify forward of B * T rows) -> (logits at the chain slots [depth, V], kv rows at those slots)."""
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    cache = _batch_cache(model, B, T, probe, b0, gen)
    _, toks = _request(model, probe)
    slots = [0] + sorted(rng.choice(np.arange(1, T), probe.depth - 1, replace=False).tolist())
    W = (T + 63) // 64
    anc = np.zeros((B, T, W), dtype=np.uint64)
    depth = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        par = np.array([-1] + [int(rng.integers(0, j)) for j in range(1, T)])
        if b == b0:
            for a, c in zip(slots, slots[1:]):
                par[c] = a
        for j in range(T):
            depth[b, j] = depth[b, par[j]] + 1 if j else 0
            anc[b, j] = anc[b, par[j]] if j else 0
            anc[b, j, j // 64] |= np.uint64(1) << np.uint64(j % 64)
    tokens = torch.randint(0, model.cfg.vocab_size, (B, T), generator=gen).to(model.device)
    tokens[b0, slots] = toks
    lens = cache.lengths.clone()
    pos = lens.to(torch.int64)[:, None] + torch.from_numpy(depth).to(model.device)
    anc_t = torch.from_numpy(anc.view(np.int64)).to(model.device)
    out = model.forward(tokens, pos, cache, lens, anc_t)
    idx = [probe.c0 + s for s in slots]
    return out.logits[b0, slots], cache.kv[:, b0, idx].clone()


def check_forward(model, ar_batches=(7, 64, 520), verify_shapes=((1, 65), (8, 65), (64, 65)),
                  probe: Probe = Probe()) -> list[str]:
    """Compare every case with AR alone (B = 1); returns the failures (empty: invariant), one line each."""
    gen = torch.Generator().manual_seed(probe.seed + 1)
    want_logits, want_kv = ar_decode(model, 1, probe, 0, gen)
    fails = []
    cases = [("ar", B, 1) for B in ar_batches] + [("verify", B, T) for B, T in verify_shapes]
    for kind, B, T in cases:
        b0 = int(torch.randint(0, B, (1,), generator=gen))
        got = ar_decode(model, B, probe, b0, gen) if kind == "ar" else verify(model, B, T, probe, b0, gen)
        for name, g, w in (("logits", got[0], want_logits), ("kv", got[1], want_kv)):
            if not torch.equal(g, w):
                diff = (g.double() - w.double()).abs().max().item()
                fails.append(f"{kind} B={B} T={T} (M={B * T}, request {b0}): {name} differ from AR alone, "
                             f"max {diff:.3g}")
    return fails
