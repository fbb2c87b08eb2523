"""e2e kind: per-step latency by stage (draft, build, verify, accept, compact, commit), tokens/s, speedup
over AR on the same backend, TTFT / TPOT, the predicted speedup tau * t_AR / t_step beside the measured one,
energy per committed token, tau's 95 % interval over prompts and the speedup's over batches (intervals.py). Both
arms run as CUDA graphs where both can be captured, else both eagerly (graph_mode in every row); forward_floor adds
the forwards' per-stage floors. Formulas: plans/0005-measurement.md,
plans/0003-engine.md."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from kdbench import timing
from kdbench.engine import graph
from kdbench.engine.engine import generate
from kdbench.engine.floor import forward_floor
from kdbench.engine.graph_run import generate_graphed
from kdbench.engine.stages import Policy
from kdbench.intervals import ratio_interval, scaled
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
    policy = gen.policy_of(s)
    ar, spec, eager, mode, why, make = _arms(case, ctx, model, all_prompts, policy, backend)
    ar_rec = _timed_record(case, ctx, backend, ar[0], "ar", ar[1], mode)
    ar_rec.tau = 1.0                                    # AR commits one token per request per step
    rec = _timed_record(case, ctx, backend, spec[0], policy.label, spec[1], mode)
    stats = gen.step_stats(spec[0], s.draft_len)
    rec.tau = stats.tau
    rec.speedup_vs_ar = rec.tokens_per_s / ar_rec.tokens_per_s
    rec.predicted_speedup = stats.tau * ar_rec.time_median_s / rec.time_median_s
    rec.extra.update({"per_depth_accept": stats.per_depth, "accept_len_hist": stats.hist,
                      "drafter": make(0, 1).name, "tau_convention": "tau counts the bonus token",
                      "ar_tokens_per_s": ar_rec.tokens_per_s, "ar_step_median_s": ar_rec.time_median_s,
                      "predicted_over_measured": rec.predicted_speedup / rec.speedup_vs_ar,
                      "ar_graph_mode": mode, **slot_efficiency(spec[0], s.max_new_tokens)})
    rec.extra.update({**gen.tau_uncertainty(spec[0]), **speedup_uncertainty(spec[0], s.max_new_tokens,
                                                                           rec.speedup_vs_ar)})
    for r in (ar_rec, rec):
        r.extra.update({"graph_reason": why} if why else {})
    if mode == "graph":
        _eager_beside(ar_rec, rec, case, ctx, backend, eager, policy.label)
    if s.temperature == 0:
        rerun = gen.batch_rerun(model, make, all_prompts, s, policy, backend, case.seed)
        _check_lossless(rec, model, all_prompts, ar[0], spec[0], rerun)
        if mode == "graph":
            rec.extra["eager_lossless"] = gen.losslessness(model, all_prompts, eager[0][0], eager[1][0], rerun)[0]
    gen.note_attention(ar_rec, ar[0])
    gen.note_attention(rec, spec[0])
    if s.forward_floor:
        ar_rec.extra.update(_cached(ctx, ("ar", "e2e-floor", gen.ar_key(case, backend)), lambda: _floor(
            model, s.batch, 1, s.prompt_len, ar[0][0].attention)))
        rec.extra.update(_floor(model, s.batch, policy.nodes(s.draft_len) + 1, s.prompt_len, spec[0][0].attention))
    yield ar_rec
    yield rec


def _arms(case, ctx, model, all_prompts, policy: Policy, backend: str):
    """Both arms eagerly (warm-up, the eager stage breakdown, the synthetic oracle), then both as CUDA graphs
    where both can be captured. The AR arm runs once per run for all cases of its shape (a budget sweep shares
    it). Returns (ar, spec, eager, mode, why, make): ar / spec (results, telemetry) in `mode`, eager = the
    eager pair, why = the reason for eager mode, make = the drafter factory."""
    s, ar_policy = case.shape, Policy(kind="ar")
    key = gen.ar_key(case, backend)
    ar = _cached(ctx, ("ar", "e2e-eager", key), lambda: _warm_and_run(model, None, all_prompts, s, ar_policy,
                                                                         backend, case.seed))
    make = gen.drafter_factory(case, ctx, model, all_prompts, ar[0])
    spec = _warm_and_run(model, make, all_prompts, s, policy, backend, case.seed)
    mode, why = arms_mode(model, policy, backend)
    eager = (ar, spec)
    if mode == "graph":
        try:   # GraphUnavailable is a RuntimeError
            ar = _cached(ctx, ("ar", "e2e-graph", key), lambda: _arm(model, None, all_prompts, s, ar_policy,
                                                                     backend, case.seed, "graph"))
            spec = _arm(model, make, all_prompts, s, policy, backend, case.seed, "graph")
        except (RuntimeError, ValueError) as exc:
            mode, why, (ar, spec) = "eager", f"graph capture failed: {_first_line(exc)}", eager
    return ar, spec, eager, mode, why, make


def _cached(ctx, key: tuple, make):
    if key not in ctx.cache:
        ctx.cache[key] = make()
    return ctx.cache[key]


def _warm_and_run(model, make, all_prompts, s, policy: Policy, backend: str, seed: int):
    _warm(model, make(0, min(s.batch, len(all_prompts))) if make else None, all_prompts, s, policy, backend)
    return _arm(model, make, all_prompts, s, policy, backend, seed, "eager")


def arms_mode(model, policy: Policy, backend: str) -> tuple[str, str]:
    """("graph", "") when both the AR step and the speculative step can be captured here, else ("eager", why):
    both arms always run in the same mode, so a speedup never compares a graph with an eager step."""
    for p in (Policy(kind="ar"), policy):
        why = graph.capture_reason(model, p, backend)
        if why:
            return "eager", f"{p.label}: {why}"
    return "graph", ""


def _arm(model, make, all_prompts, s, policy: Policy, backend: str, seed: int, mode: str):
    """(results per batch, telemetry summary) of one arm in one mode (make None: AR)."""
    with Sampler() as tel:
        res = gen.run_batched(model, make, all_prompts, s, policy, backend, seed,
                              run=None if mode == "eager" else generate_graphed)
    return res, tel.summary()


def _eager_beside(ar_rec: Record, rec: Record, case, ctx, backend: str, eager, label: str) -> None:
    """Graph-mode rows keep the eager run's figures beside them, and its stage breakdown (the stages of a graph
    are one launch and are not timed apart)."""
    e_ar = _timed_record(case, ctx, backend, eager[0][0], "ar", eager[0][1], "eager")
    e_spec = _timed_record(case, ctx, backend, eager[1][0], label, eager[1][1], "eager")
    for r, e in ((ar_rec, e_ar), (rec, e_spec)):
        r.extra.update({"eager_tokens_per_s": e.tokens_per_s, "eager_step_median_s": e.time_median_s,
                        "graph_step_s": r.extra["stage_s"].get("step"), "stage_s": e.extra["stage_s"],
                        "stage_s_mode": "eager (a graph's stages are one launch)"})
    rec.extra["eager_speedup_vs_ar"] = e_spec.tokens_per_s / e_ar.tokens_per_s


def _check_lossless(rec: Record, model, all_prompts, ar, spec, rerun) -> None:
    rec.lossless, bug = gen.losslessness(model, all_prompts, ar, spec, rerun)
    if rec.lossless != "yes":
        rec.status = "fail" if bug else "info"
        rec.reason = f"greedy speculative output differs from AR: {rec.lossless}"


def _floor(model, batch: int, rows: int, past: int, attention: str) -> dict:
    """{"forward": the forward's per-stage time and floor (engine/floor.py)}: graphed on a GPU (eager with
    graph_reason if the capture fails), eager on the CPU. A failure of the timing itself gives
    {"forward_error": why} instead, and the e2e row stands."""
    why = ""
    if str(model.device).startswith("cuda"):
        try:
            return {"forward": forward_floor(model, batch, rows, past, "graph", attn=attention)}
        except (RuntimeError, ValueError) as exc:
            why = f"graph capture failed: {_first_line(exc)}"
    try:
        out = forward_floor(model, batch, rows, past, "eager", attn=attention)
    except (RuntimeError, ValueError) as exc:   # torch.OutOfMemoryError is a RuntimeError
        return {"forward_error": f"forward floor ({rows} rows) failed: {_first_line(exc)}"}
    return {"forward": {**out, "graph_reason": why} if why else out}


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _warm(model, drafter, all_prompts, s, policy, backend) -> None:
    n = min(WARMUP_TOKENS, s.max_new_tokens)
    generate(model, drafter, all_prompts[:s.batch], n, policy, s.temperature, 0, backend)


def delivered_tokens(results, max_new_tokens: int) -> int:
    """Decode tokens delivered: max_new_tokens per request, the first from prefill; tokens a last step commits
    past max_new_tokens are discarded, so they do not count (their time does)."""
    return sum(len(r.tokens) for r in results) * (max_new_tokens - 1)


def speedup_uncertainty(results, max_new_tokens: int, speedup: float) -> dict:
    """The speedup's 95 % interval over batches: a batch runs until its slowest request is done, so the batch is the
    unit whose step count varies (at batch 1, the prompt). Delivered tokens per batch step, y_b / x_b with y_b =
    requests x (max_new_tokens - 1) and x_b its steps, as a ratio interval (intervals.py), scales the measured
    speedup at the measured step times."""
    iv = ratio_interval([delivered_tokens([r], max_new_tokens) for r in results], [len(r.steps) for r in results])
    return {"speedup_ci95": scaled(speedup, iv), "speedup_batches": iv.n}


def slot_efficiency(results, max_new_tokens: int) -> dict[str, float]:
    """Why a batched run delivers less than tau per request-step: a step runs every request slot of the batch
    (a graph has a fixed batch), finished ones included (live_slot_fraction = live request-steps / all
    request-steps), and tokens a last step commits past max_new_tokens are discarded (delivered_over_committed).
    slot_efficiency = their product; measured speedup ~ predicted x slot_efficiency (plans/0007)."""
    live = sum(1 for r in results for st in r.steps for t in st.tau if t > 0)
    slots = sum(len(st.tau) for r in results for st in r.steps)
    committed = sum(t for r in results for st in r.steps for t in st.tau)
    delivered = delivered_tokens(results, max_new_tokens)
    if not slots or not committed:
        return {}
    frac, kept = live / slots, delivered / committed
    return {"live_slot_fraction": frac, "delivered_over_committed": kept, "slot_efficiency": frac * kept}


def _timed_record(case, ctx, backend: str, results, label: str, tel: dict, mode: str) -> Record:
    """Step times are the sums of the stage times of each step (CUDA events on the GPU; graph mode: one
    "step" time per replay). mode: the graph mode of the run ("eager" | "graph"), recorded."""
    rec = gen.base_record(case, ctx, backend)
    rec.policy = label
    steps = [st for r in results for st in r.steps]
    step_s = [sum(st.stage_ns.values()) * 1e-9 for st in steps]
    t = timing.summarize(step_s)
    rec.time_median_s, rec.time_p20_s, rec.time_p80_s = t.median_s, t.p20_s, t.p80_s
    rec.samples_s, rec.n_samples = step_s, len(step_s)
    decode_tokens = delivered_tokens(results, case.shape.max_new_tokens)
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
    rec.extra["graph_mode"] = mode
    rec.energy_j_per_token = tel.get("energy_j", math.nan) / decode_tokens if decode_tokens else math.nan
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"):
        setattr(rec, key, tel.get(key, math.nan))
    rec.throttle = tel.get("throttle", "") or ""
    rec.status = "info"
    return rec
