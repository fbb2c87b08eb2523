"""e2e kind: per-step latency by stage (draft, build, verify, accept, compact, commit), tokens/s, speedup
over AR on the same backend, TTFT / TPOT, the predicted speedup tau * t_AR / t_step beside the measured one,
and energy per committed token. Formulas: plans/0005-measurement.md."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from kdbench import timing
from kdbench.engine import graph
from kdbench.engine.engine import generate
from kdbench.engine.stages import Policy
from kdbench.kinds import generation as gen
from kdbench.results import Record
from kdbench.telemetry import Sampler

WARMUP_TOKENS = 4   # one short generate() per policy before timing: allocator, kernels, JIT


def run(case, ctx) -> Iterator[Record]:
    for backend in case.backends:
        skipped = gen.unavailable(case, ctx, backend)
        yield from [skipped] if skipped is not None else _run_backend(case, ctx, backend)


def _run_backend(case, ctx, backend: str) -> Iterator[Record]:
    s = case.shape
    model = gen.target(case, ctx)
    all_prompts = gen.prompts(case, model.cfg.vocab_size)
    ar_policy, policy = Policy(kind="ar"), gen.policy_of(s)
    _warm(model, None, all_prompts, s, ar_policy, backend)
    with Sampler() as ar_tel:
        ar = gen.run_batched(model, None, all_prompts, s, ar_policy, backend, case.seed)
    make = gen.drafter_factory(case, ctx, model, all_prompts, ar)
    _warm(model, make(0, min(s.batch, len(all_prompts))), all_prompts, s, policy, backend)
    with Sampler() as spec_tel:
        spec = gen.run_batched(model, make, all_prompts, s, policy, backend, case.seed)
    ar_rec = _timed_record(case, ctx, backend, ar, "ar", ar_tel.summary())
    ar_rec.tau = 1.0                                    # AR commits one token per request per step
    rec = _timed_record(case, ctx, backend, spec, policy.label, spec_tel.summary())
    stats = gen.step_stats(spec, s.draft_len)
    rec.tau = stats.tau
    rec.speedup_vs_ar = rec.tokens_per_s / ar_rec.tokens_per_s
    rec.predicted_speedup = stats.tau * ar_rec.time_median_s / rec.time_median_s
    rec.extra.update({"per_depth_accept": stats.per_depth, "accept_len_hist": stats.hist,
                      "drafter": make(0, 1).name, "tau_convention": "tau counts the bonus token",
                      "ar_tokens_per_s": ar_rec.tokens_per_s, "ar_step_median_s": ar_rec.time_median_s,
                      "predicted_over_measured": rec.predicted_speedup / rec.speedup_vs_ar})
    rec.extra.update(_graph_step(model, make(0, min(s.batch, len(all_prompts))), all_prompts[:s.batch], s, policy,
                                 backend, ar_rec.time_median_s, stats.tau))
    if s.temperature == 0:
        rec.lossless, bug = gen.losslessness(model, all_prompts, ar, spec)
        if rec.lossless != "yes":
            rec.status = "fail" if bug else "info"
            rec.reason = f"greedy speculative output differs from AR: {rec.lossless}"
    gen.note_attention(ar_rec, ar)
    gen.note_attention(rec, spec)
    yield ar_rec
    yield rec


GRAPH_STEPS = 16   # replays timed by the graph-mode step measurement


def _graph_step(model, drafter, batch_prompts, s, policy, backend: str, ar_step_s: float, tau: float) -> dict:
    """The speculative step replayed as a CUDA graph (engine/graph.py: ddtree on the cuda backend, greedy or
    with registered generators), beside the eager rows: graph_step_median_s and the predicted speedup with it,
    tau x t_AR(eager) / t_step(graph). AR steps are not captured (the engine has no AR graph), so the measured
    rows stay eager; graph_mode says which mode each number comes from, and why not where it cannot run."""
    out = {"graph_mode": "eager"}
    if backend != "cuda" or policy.kind != "ddtree":
        out["graph_reason"] = "captured steps need ddtree on the cuda backend (the torch tree build is a host heap)"
        return out
    try:
        t = graph.time_step_eager_vs_graph(model, drafter, batch_prompts, policy, GRAPH_STEPS, temperature=s.temperature)
    except (RuntimeError, ValueError) as exc:   # GraphUnavailable is a RuntimeError
        out["graph_reason"] = f"graph capture failed: {str(exc).splitlines()[0][:200]}"
        return out
    g = float(np.median(t["graph_step_s"]))
    return {**out, "graph_step_median_s": g, "graph_eager_step_median_s": float(np.median(t["eager_step_s"])),
            "graph_predicted_speedup": tau * ar_step_s / g, "graph_verify_share": t["verify_share"],
            "graph_note": "spec step as a CUDA graph; AR eager (no AR graph in the engine)"}


def _warm(model, drafter, all_prompts, s, policy, backend) -> None:
    n = min(WARMUP_TOKENS, s.max_new_tokens)
    generate(model, drafter, all_prompts[:s.batch], n, policy, s.temperature, 0, backend)


def _timed_record(case, ctx, backend: str, results, label: str, tel: dict) -> Record:
    """Step times are the sums of the stage times of each step (CUDA events on the GPU)."""
    rec = gen.base_record(case, ctx, backend)
    rec.policy = label
    steps = [st for r in results for st in r.steps]
    step_s = [sum(st.stage_ns.values()) * 1e-9 for st in steps]
    t = timing.summarize(step_s)
    rec.time_median_s, rec.time_p20_s, rec.time_p80_s = t.median_s, t.p20_s, t.p80_s
    rec.samples_s, rec.n_samples = step_s, len(step_s)
    # delivered decode tokens: max_new_tokens per request, the first from prefill; tokens a last step commits
    # past max_new_tokens are discarded, so they do not count (their time does)
    decode_tokens = sum(len(r.tokens) for r in results) * (case.shape.max_new_tokens - 1)
    decode_s = float(np.sum(step_s))
    rec.tokens_per_s = decode_tokens / decode_s if decode_s > 0 else math.nan
    prefill = [r.prefill_ns * 1e-9 for r in results]
    rec.ttft_s = float(np.mean(prefill))
    per_batch_decode = decode_s / max(len(results), 1)
    rec.tpot_s = per_batch_decode / max(case.shape.max_new_tokens - 1, 1)
    stage_tot: dict[str, float] = {}
    for st in steps:
        for k, v in st.stage_ns.items():
            stage_tot[k] = stage_tot.get(k, 0.0) + v * 1e-9
    rec.extra["stage_s"] = {k: v / max(len(steps), 1) for k, v in stage_tot.items()}
    rec.extra["policy"] = label
    rec.extra["graph_mode"] = "eager"      # generate() runs eagerly; _graph_step adds graph-mode step times
    rec.energy_j_per_token = tel.get("energy_j", math.nan) / decode_tokens if decode_tokens else math.nan
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"):
        setattr(rec, key, tel.get(key, math.nan))
    rec.throttle = tel.get("throttle", "") or ""
    rec.status = "info"
    return rec
