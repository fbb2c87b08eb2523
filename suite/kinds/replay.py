"""replay kind: tau of one tree policy replayed over a trace (recorded once per run, or read from a .kdtr),
per prompt and per category, the step time and speedup MODELED by the cost model at the case's batch, and
optionally the live check (generate() must give the same tau round by round). plans/0009, plans/0008."""
from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Iterator

import torch

from kdbench import bestbudget as bb
from kdbench import costfit
from kdbench import replay as rp
from kdbench import trace as tr
from kdbench.engine.engine import generate, greedy_oracle
from kdbench.engine.stages import Policy
from kdbench.errors import UserError
from kdbench.kinds import generation as gen
from kdbench.model.drafter import BlockDrafter
from kdbench.model.keyed import KeyedSyntheticDrafter
from kdbench.references.model_config import get_preset
from kdbench.results import Record
from kdbench.shapes import GenerationShape


def ranks(q: float) -> tuple[float, ...]:
    """The synthetic drafters' rank mix: rank k with probability q (1 - q)^k (as the acceptance kind)."""
    return tuple(q * (1 - q) ** k for k in range(gen.SYNTHETIC_RANKS)) if q < 1 else (1.0,)


def make_trace(s, scenario: str, device: str, batch: int = 8, seed: int = 0, ctx_cache: dict | None = None):
    """(trace, drafter_for, model, prompts) for a ReplayShape s; drafter_for / model / prompts are None for a
    trace file or synthetic-only (nothing live to compare with)."""
    if s.trace:
        return tr.load(s.trace), None, None, None
    if s.drafter == "synthetic-only":
        return tr.synthetic(s.prompts, s.rounds, s.k, quality=s.quality, rank_probs=ranks(s.quality), seed=seed,
                            category=s.category), None, None, None
    shape = GenerationShape(model=s.model, prompts=s.prompts, prompt_len=s.prompt_len, category=s.category)
    case = types.SimpleNamespace(shape=shape, scenario=scenario)
    if s.drafter == "pair":
        model, drafter = load_pair(device)
    else:
        model = gen.target(case, types.SimpleNamespace(cache={} if ctx_cache is None else ctx_cache, device=device))
        drafter = BlockDrafter.random(model, seed) if s.drafter == "block" else None
    prompts = gen.prompts(case, model.cfg.vocab_size)
    drafter_for = (lambda first, last: drafter) if drafter is not None else _keyed(s, model, prompts, seed, device)
    trace = tr.record(model, prompts, s.rounds, s.k, drafter_for, batch=batch, categories=gen.prompt_categories(shape),
                      meta={"prompt_set": f"{s.category} x {s.prompts}, len {s.prompt_len}", "seed": seed,
                            "scenario": scenario})
    return trace, drafter_for, model, prompts


def _keyed(s, model, prompts, seed: int, device: str):
    """drafter_for of the keyed synthetic drafter on the target's greedy continuation of the prompts."""
    oracle = greedy_oracle(model, prompts, s.rounds + 17)

    def drafter_for(first, last):
        return KeyedSyntheticDrafter(oracle[first:last], model.cfg.vocab_size, quality=s.quality,
                                     rank_probs=ranks(s.quality), seed=seed, device=device, keys=range(first, last))
    return drafter_for


def load_pair(device: str, dtype: torch.dtype | None = None):
    """The trained pair (kdbench.pair, issue 11) when this tree has it: (target, drafter); dtype default
    bf16 on the GPU, float32 on the CPU."""
    try:
        pair = importlib.import_module("kdbench.pair")
    except ModuleNotFoundError:
        raise UserError("drafter 'pair': the trained pair (kdbench.pair) is not in this tree yet") from None
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    target = pair.load_target(device=device, dtype=dtype)
    return target, pair.load_drafter(target)


def run(case, ctx) -> Iterator[Record]:
    s = case.shape
    key = ("trace", s.trace, s.model, s.drafter, s.quality, s.prompts, s.prompt_len, s.category, s.rounds, s.k)
    if key not in ctx.cache:
        ctx.cache[key] = make_trace(s, case.scenario, ctx.device, ctx_cache=ctx.cache)
    trace, drafter_for, model, prompts = ctx.cache[key]
    cs, fit_source = _cost_setting(s)
    row_cost = s.row_cost if s.row_cost >= 0 else bb.row_cost(cs, s.batch, trace.depth)
    policy = Policy(kind=s.policy, budget=s.budget, max_width=s.max_width if s.policy == "ddtree_width_capped" else 0,
                    branching=tuple(s.branching) if s.policy == "static_kary" else (),
                    row_cost=row_cost if s.policy == "adaptive" else 0.0)
    rec = ctx.record(case, "torch", dtype=trace.meta.get("model_dtype", ""))
    rec.policy = policy.label
    try:
        res = rp.replay(trace, policy)
    except ValueError as exc:
        rec.status, rec.reason = "error", str(exc)
        yield rec
        return
    spec = {k: v for k, v in dataclasses.asdict(policy).items() if k != "budget"}
    pred = bb.sweep(trace, [spec], [policy.budget], [s.batch], cs, cache={policy: res})[0]
    rec.tau = res.mean_tau     # the measured-looking columns tokens_per_s / predicted_speedup stay empty
    rec.extra.update({
        "modeled": True, "note": "modeled_* are MODELED (plans/0008), not measured; tau is replayed",
        "modeled_step_s": pred.step_s, "modeled_verify_s": pred.verify_s,
        "modeled_outside_verify_s": pred.outside_verify_s, "modeled_ar_step_s": pred.ar_step_s,
        "modeled_tokens_per_s": pred.tokens_per_s, "modeled_speedup": pred.speedup,
        "experts_per_layer": pred.experts, "verify_gb": pred.verify_gb, "batch": s.batch, "budget": policy.budget,
        "cost_model": f"{s.cost_model}, ctx {s.ctx}", "cost_fit": fit_source,
        "per_category": res.per_category(), "per_prompt": res.per_prompt(),
        "rounds": sum(len(p.tau) for p in res.prompts), "mean_rows": res.mean_nodes,
        "drafter": trace.meta.get("drafter", ""), "trace_model": trace.meta.get("model", ""),
        "tau_convention": "tau counts the bonus token"})
    rec.status = "info"
    if s.check_live and drafter_for is not None:
        live = generate(model, drafter_for(0, len(prompts)), prompts, trace.rounds + 1, policy)
        same = rp.live_taus(live) == [list(p.tau) for p in res.prompts]
        rec.status = "pass" if same else "fail"
        rec.reason = "" if same else "replayed tau differs from live generate() tau"
    yield rec


def _cost_setting(s) -> tuple[bb.CostSetting, str]:
    """The modeled step's setting and where it comes from: the shipped H200 fit for a measured preset, else
    the assumed serving-grade efficiencies (costfit.shipped_setting)."""
    eff, curve, source = costfit.shipped_setting(s.cost_model)
    return bb.CostSetting(get_preset(s.cost_model), s.ctx, eff, curve), source
