"""Measuring what the cost model reads: target forward time of batch x rows chain-tree rows at a context,
the distinct routed experts per MoE layer from the router, and a live step's time outside its verify, for a
preset (or the trained pair) on one device. One record per cell (costfit.Measurement), all eager (no CUDA
graph); reports/h200/costmodel_measure.py runs the H200 grid."""
from __future__ import annotations

import numpy as np
import torch

from kdbench import pair, timing
from kdbench.backends.chain_device import chain_anc
from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.stages import Policy
from kdbench.model import moe
from kdbench.model.drafter import BlockDrafter

from .costfit import Measurement


class ExpertCounter:
    """Wraps moe.route while active: distinct experts of every routing call (one per MoE layer)."""

    def __init__(self):
        self.counts: list[int] = []
        self.orig = moe.route

    def __enter__(self):
        def counting(x, *a, **kw):
            idx, w = self.orig(x, *a, **kw)
            self.counts.append(int(torch.unique(idx).numel()))
            return idx, w
        moe.route = counting
        return self

    def __exit__(self, *exc):
        moe.route = self.orig


def measure_cell(model, batch: int, rows: int, ctx: int, *, attn: str, device: str, repeat: int, seed: int
                 ) -> Measurement:
    """Median forward seconds (CUDA events, back to back, no L2 flush: steady decoding) and the experts."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    V = model.cfg.vocab_size
    cache = model.new_cache(batch, ctx + rows + 64)
    cache.kv.normal_(0.0, 0.5, generator=torch.Generator(device=model.device).manual_seed(seed))  # no NaN rows
    past = torch.full((batch,), ctx, dtype=torch.int32, device=model.device)
    tokens = torch.randint(0, V, (batch, rows), generator=g).to(model.device)
    positions = (ctx + torch.arange(rows))[None].expand(batch, rows).to(model.device)
    anc = chain_anc(rows, batch, model.device) if rows > 1 else None
    kv_limit = ctx + rows

    def fwd():
        return model.forward(tokens, positions, cache, past, anc, kv_limit=kv_limit, attn=attn, tap_layers=())

    with ExpertCounter() as counter:
        fwd()
    t = timing.measure(fwd, warmup=2, repeat=repeat, device=device, flush_l2=False, shield=False)
    experts = float(np.mean(counter.counts)) if counter.counts else float("nan")
    return Measurement(model.cfg.name, batch, rows, ctx, t.median_s, experts, f"measured {attn} attention")


def load_target(name: str, device: str):
    """The measured target: the trained pair's shipped weights for kdbench-pair (its trained router decides
    the experts), else a random target of the preset; bf16 on cuda."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name == pair.PRESET:
        return pair.load_target(device, dtype)
    return target_from_preset(name, seed=1, device=device, dtype=dtype)


def drafter_of(model):
    """The drafter a live step runs: the trained one for the pair, else a random block drafter."""
    return pair.load_drafter(model) if model.cfg.name == pair.PRESET else BlockDrafter.random(model, seed=2)


def measure_outside_verify(model, batch: int, budget: int, *, backend: str, prompt_len: int = 128,
                           steps: int = 12, seed: int = 0) -> Measurement:
    """Median over a live DDTree generate()'s steps of the step time outside its verify forward (draft, build,
    accept, compact, commit; CUDA events per stage). The first two steps are dropped (warm-up)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, model.cfg.vocab_size, prompt_len).tolist() for _ in range(batch)]
    res = generate(model, drafter_of(model), prompts, steps + 3, Policy("ddtree", budget), backend=backend)
    out = [sum(v for k, v in s.stage_ns.items() if k != "verify") * 1e-9 for s in res.steps[2:]]
    return Measurement(model.cfg.name, batch, budget + 1, prompt_len + steps, float(np.median(out)),
                       source=f"measured live step, {backend} backend", stage="outside_verify")


def run_grid(models, batches, rows, ctx: int, *, device: str, attn: str, repeat: int, log=print,
             step_budget: int = 0) -> list[Measurement]:
    """Every (model, batch, rows) cell; a cell that fails (out of memory) is logged and skipped.
    step_budget > 0: also each batch's outside-verify time of a live DDTree step at that budget."""
    out = []
    for name in models:
        model = load_target(name, device)
        for b in batches:
            for r in rows:
                try:
                    m = measure_cell(model, b, r, ctx, attn=attn, device=device, repeat=repeat, seed=b * 1000 + r)
                except torch.OutOfMemoryError as exc:
                    log(f"{name} batch {b} rows {r}: out of memory ({str(exc)[:80]})")
                    torch.cuda.empty_cache()
                    continue
                log(f"{name} batch {b:3d} rows {r:4d}: {m.seconds * 1e3:8.3f} ms, {m.experts:6.1f} experts")
                out.append(m)
            if step_budget:
                m = measure_outside_verify(model, b, step_budget, backend=attn)
                log(f"{name} batch {b:3d} step outside verify (B {step_budget}): {m.seconds * 1e3:8.3f} ms")
                out.append(m)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out
