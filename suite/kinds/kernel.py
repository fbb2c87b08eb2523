"""kernel kind: correctness trials against the numpy reference (fresh inputs and seed per trial, outputs
poisoned), then every backend timed in interleaved rounds of alternating order (ABBA), the outputs of the
timed calls checked again after timing, and the roofline figures. numpy_ref is run here, never by a family.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from kdbench import check as checks
from kdbench import families, timing
from kdbench.backends import registry
from kdbench.config import derive_seed
from kdbench.errors import clip
from kdbench.families import common
from kdbench.results import Record
from kdbench.telemetry import Sampler

REFERENCE = "numpy_ref"
POISON_CAP = 8 << 30    # bytes of NaN the allocator is filled with before the timed calls, at most


@dataclass
class Trials:
    """What the correctness trials leave: per-backend checks and errors, the last trial's inputs and truths."""
    checks: dict[str, list] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    inputs: dict | None = None
    wants: dict[str, dict] = field(default_factory=dict)   # backend -> the truth it is checked against


def run(case, ctx) -> Iterator[Record]:
    fam = families.get(case.family)
    avail = {b: _available(fam, b, case, ctx.device) for b in case.backends}
    live = [b for b in case.backends if avail[b][0]]
    if not live:   # nothing can run here: no inputs, no reference (a GPU-sized case costs nothing on a CPU)
        yield from (ctx.record(case, b, status="skipped", reason=avail[b][1]) for b in case.backends)
        return
    trials = _trials(fam, case, ctx, live)
    timed = _time_all(fam, case, ctx, [b for b in live if b not in trials.errors], trials)
    for b in case.backends:
        if not avail[b][0]:
            yield ctx.record(case, b, status="skipped", reason=avail[b][1])
        elif b in trials.errors:
            yield _failure(case, ctx, b, trials.errors[b])
        elif isinstance(timed[b], str):
            yield _failure(case, ctx, b, timed[b])
        else:
            yield _measured(fam, case, ctx, b, trials, timed[b])
    _release(ctx.device)


def _release(device: str) -> None:
    """Return the cached blocks the case's backends and kept outputs used, so the next case starts clean."""
    if device == "cuda":
        torch.cuda.empty_cache()


def _trials(fam, case, ctx, live: list[str]) -> Trials:
    out = Trials(checks={b: [] for b in live})
    for trial in range(case.trials):
        inputs = fam.make_inputs(case, derive_seed(case.seed, "trial", trial))
        want = fam.reference(inputs, case)
        out.inputs = inputs
        for b in live:
            if b == REFERENCE:
                continue
            try:
                out.wants[b] = fam.reference_for(b, inputs, case) or want
                out.checks[b].append(fam.check(fam.run(b, inputs, case, ctx.device), out.wants[b], case.tolerance))
            except Exception as exc:  # one backend's failure must not hide the others' results
                out.errors[b] = _describe(exc)
    return out


def _device(backend: str, ctx) -> str:
    return "cpu" if backend == REFERENCE else ctx.device


def _time_all(fam, case, ctx, backends: list[str], trials: Trials) -> dict:
    """backend -> TimingResult (with the timed calls' outputs), or the reason it could not be timed."""
    contenders, out = {}, {}
    for b in backends:
        try:
            fn = (lambda: fam.reference(trials.inputs, case)) if b == REFERENCE else \
                fam.timed(b, trials.inputs, case, ctx.device)
            contenders[b] = timing.Contender(fn, _device(b, ctx))
        except Exception as exc:
            out[b] = _describe(exc)
    common.poison_allocator(ctx.device, min(POISON_CAP, int(case.timing.repeat * _bytes(fam, case, trials))))
    with Sampler() as sampler:   # one sampler over the interleaved rounds: every row gets its summary
        results = timing.rounds(contenders, warmup=case.timing.warmup, repeat=case.timing.repeat,
                                flush_l2=case.timing.flush_l2, keep_outputs=True)
    telemetry = sampler.summary()
    for b, res in results.items():
        out[b] = _describe(res) if isinstance(res, Exception) else (res, telemetry)
    return out


def _bytes(fam, case, trials: Trials) -> float:
    value = fam.bytes_moved(case, trials.inputs) if trials.inputs is not None else 0.0
    return value if math.isfinite(value) else 0.0


def _failure(case, ctx, backend: str, reason: str) -> Record:
    """Out of memory at a shape is a skip with that reason (a baseline that does not fit); else an error."""
    status = "skipped" if reason.startswith("out of memory") else "error"
    return ctx.record(case, backend, status=status, reason=clip(reason))


def _available(fam, backend: str, case, device: str) -> tuple[bool, str]:
    ok, reason = registry.available(backend, device)
    if ok:
        reason = fam.unsupported(backend, case) or ""
        ok = not reason
    return ok, reason


def _describe(exc: Exception) -> str:
    """A baseline that does not fit in device memory at a shape is skipped with that reason, not an error."""
    if type(exc).__name__ == "OutOfMemoryError":
        return f"out of memory at this shape: {clip(str(exc).splitlines()[0], 200)}"
    return f"{type(exc).__name__}: {exc}"


def _after_timing(fam, case, backend: str, trials: Trials, t, ctx_device: str) -> list:
    """The outputs of the first and last timed calls against the truth: a kernel that is fast because a
    repeated call skipped work (or read a stale result) fails here. Every timed call's outputs were held
    alive, so none could land in a block an earlier call had filled."""
    picks = [t.outputs[0], t.outputs[-1]] if len(t.outputs) > 1 else list(t.outputs)
    want = trials.wants[backend]
    got = [fam.outputs(backend, o, trials.inputs, case) for o in picks]
    if any(g is None for g in got):   # in-place work a second call cannot repeat (kv_compact): a fresh run
        got = [fam.run(backend, trials.inputs, case, ctx_device)]
    return [fam.check(g, want, case.tolerance) for g in got]


def _measured(fam, case, ctx, backend: str, trials: Trials, timed) -> Record:
    t, telemetry = timed
    checked = list(trials.checks.get(backend, []))
    try:
        if backend != REFERENCE:
            checked += _after_timing(fam, case, backend, trials, t, ctx.device)
    except Exception as exc:
        return _failure(case, ctx, backend, f"re-check after timing: {_describe(exc)}")
    res = checks.merge(checked) if checked else None
    status = "info" if backend == REFERENCE else ("pass" if res.passed else "fail")
    rec = ctx.record(case, backend, status=status)
    if res is not None:
        rec.trials, rec.n_nan, rec.max_abs, rec.max_rel = len(checked), res.n_nan, res.max_abs, res.max_rel
        rec.rel_l2, rec.pct_outside, rec.worst = res.rel_l2, res.pct_outside, res.worst
        if not res.passed:
            rec.reason = clip(f"outside tolerance: {res.worst}")
    _fill_timing(rec, t, fam, case, trials.inputs, _device(backend, ctx), ctx)
    _fill_telemetry(rec, telemetry)
    rec.extra["timing_order"] = "interleaved rounds, alternating order (ABBA)"
    return rec


def _fill_timing(rec: Record, t, fam, case, inputs, device: str, ctx) -> None:
    rec.time_median_s, rec.time_p20_s, rec.time_p80_s = t.median_s, t.p20_s, t.p80_s
    rec.n_samples, rec.samples_s = len(t.samples_s), list(t.samples_s)
    rec.bytes_moved, rec.flops = fam.bytes_moved(case, inputs), fam.flops(case, inputs)
    key = f"ceilings:{device}"
    if key not in ctx.cache:
        ctx.cache[key] = timing.ceilings(device)
    ceil = ctx.cache[key]
    rec.floor_s = timing.floor_seconds(rec.bytes_moved, rec.flops, ceil)
    rec.pct_of_floor_rate = timing.pct_of_floor_rate(rec.floor_s, t.median_s)
    rec.extra.update({"ceilings": {"copy_bytes_per_s": ceil.copy_bytes_per_s,
                                   "matmul_flops_per_s": ceil.bf16_flops_per_s, "source": ceil.source},
                      "timed_on": device, "l2_flush": bool(case.timing.flush_l2 and device == "cuda")})


def _fill_telemetry(rec: Record, summary: dict) -> None:
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"):
        setattr(rec, key, summary.get(key, math.nan))
    rec.throttle = summary.get("throttle", "") or ""
    if summary.get("reason"):
        rec.extra["telemetry"] = summary["reason"]
