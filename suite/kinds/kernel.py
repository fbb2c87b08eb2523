"""kernel kind: correctness trials against the numpy reference (fresh inputs and seed per trial, outputs
poisoned, a re-check after timing), then timing per backend with the roofline figures."""
from __future__ import annotations

import math
from collections.abc import Iterator

from kdbench import check as checks
from kdbench import families, timing
from kdbench.config import derive_seed
from kdbench.results import Record


def run(case, ctx) -> Iterator[Record]:
    fam = families.get(case.family)
    avail = {b: _available(fam, b, case, ctx.device) for b in case.backends}
    live = [b for b in case.backends if avail[b][0]]
    results: dict[str, list] = {b: [] for b in live}
    errors: dict[str, str] = {}
    inputs = want = None
    for trial in range(case.trials):
        inputs = fam.make_inputs(case, derive_seed(case.seed, "trial", trial))
        want = fam.reference(inputs, case)
        for b in live:
            if b in errors:
                continue
            try:
                results[b].append(fam.check(fam.run(b, inputs, case, ctx.device), want, case.tolerance))
            except Exception as exc:  # one backend's failure must not hide the others' results
                errors[b] = _describe(exc)
    for b in case.backends:
        if not avail[b][0]:
            yield _record(case, ctx, b, status="skipped", reason=avail[b][1])
        elif b in errors:
            yield _failure(case, ctx, b, errors[b])
        else:
            try:
                yield _measured(fam, case, ctx, b, inputs, want, results[b])
            except Exception as exc:
                yield _failure(case, ctx, b, _describe(exc))
            _release(ctx.device)


def _failure(case, ctx, backend: str, reason: str) -> Record:
    """Out of memory at a shape is a skip with that reason (a baseline that does not fit); else an error."""
    status = "skipped" if reason.startswith("out of memory") else "error"
    return _record(case, ctx, backend, status=status, reason=reason[:500])


def _release(device: str) -> None:
    """Return cached blocks after each backend so one baseline's peak does not starve the next."""
    if device == "cuda":
        import torch
        torch.cuda.empty_cache()


def _available(fam, backend: str, case, device: str) -> tuple[bool, str]:
    ok, reason = families.backend_available(backend, device)
    if ok and hasattr(fam, "unsupported"):
        reason = fam.unsupported(backend, case) or ""
        ok = not reason
    return ok, reason


def _describe(exc: Exception) -> str:
    """A baseline that does not fit in device memory at a shape is skipped with that reason, not an error."""
    if type(exc).__name__ == "OutOfMemoryError":
        return f"out of memory at this shape: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {exc}"


def _measured(fam, case, ctx, backend: str, inputs: dict, want: dict, trial_checks: list) -> Record:
    from kdbench.telemetry import Sampler
    device = "cpu" if backend == "numpy_ref" else ctx.device
    fn = fam.timed(backend, inputs, case, ctx.device)
    with Sampler() as sampler:
        t = timing.measure(fn, warmup=case.timing.warmup, repeat=case.timing.repeat, device=device,
                           flush_l2=case.timing.flush_l2)
    if backend != "numpy_ref":   # re-validate after the timed loop: state drift or caching cannot pass
        trial_checks.append(fam.check(fam.run(backend, inputs, case, ctx.device), want, case.tolerance))
    res = checks.merge(trial_checks) if trial_checks else None
    status = "info" if backend == "numpy_ref" else ("pass" if res.passed else "fail")
    rec = _record(case, ctx, backend, status=status)
    if res is not None:
        rec.trials, rec.n_nan, rec.max_abs, rec.max_rel = len(trial_checks), res.n_nan, res.max_abs, res.max_rel
        rec.rel_l2, rec.pct_outside, rec.worst = res.rel_l2, res.pct_outside, res.worst
        if not res.passed:
            rec.reason = f"outside tolerance: {res.worst}"[:500]
    _fill_timing(rec, t, fam, case, inputs, device, ctx)
    _fill_telemetry(rec, sampler.summary())
    return rec


def _fill_timing(rec: Record, t, fam, case, inputs, device: str, ctx) -> None:
    rec.time_median_s, rec.time_p20_s, rec.time_p80_s = t.median_s, t.p20_s, t.p80_s
    rec.n_samples, rec.samples_s = len(t.samples_s), list(t.samples_s)
    rec.bytes_moved, rec.flops = fam.bytes_moved(case, inputs), fam.flops(case, inputs)
    key = f"ceilings:{device}"
    if key not in ctx.cache:
        ctx.cache[key] = timing.ceilings(device)
    ceil = ctx.cache[key]
    rec.floor_s = max(rec.bytes_moved / ceil.copy_bytes_per_s, rec.flops / ceil.bf16_flops_per_s)
    rec.pct_of_floor_rate = 100.0 * rec.floor_s / t.median_s if t.median_s > 0 else math.nan
    rec.extra.update({"ceilings": {"copy_bytes_per_s": ceil.copy_bytes_per_s,
                                   "matmul_flops_per_s": ceil.bf16_flops_per_s, "source": ceil.source},
                      "timed_on": device, "l2_flush": bool(case.timing.flush_l2 and device == "cuda")})


def _fill_telemetry(rec: Record, summary: dict) -> None:
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"):
        setattr(rec, key, summary.get(key, math.nan))
    rec.throttle = summary.get("throttle", "") or ""
    if summary.get("reason"):
        rec.extra["telemetry"] = summary["reason"]


def _record(case, ctx, backend: str, status: str, reason: str = "") -> Record:
    return ctx.record(case, backend, status=status, reason=reason)
