"""Records of a sharded run, from the per-rank result files: one per phase (step time = the slowest rank per
repeat; communication = the timed collectives; compute = the rest; per layer), one per microbenchmark point."""
from __future__ import annotations

import math
import statistics

from kdbench import timing
from kdbench.results import Record


def _verdict(check: dict | None, tol, digests: list[str]) -> tuple[str, str]:
    """(status, reason): every rank must hold the same output; against one process: bit-equal when the case's
    tolerance is 0, else rel_l2 <= tolerance.rel_l2 and max_abs <= tolerance.atol (when set)."""
    if len(set(digests)) > 1:
        return "fail", f"ranks disagree on the output (digests {digests})"
    if check is None:
        return "info", ""
    if check["n_nan"]:
        return "fail", f"{check['n_nan']} NaN in the sharded output"
    # A NaN compares False with every tolerance, so it would pass; measure.compare makes rel_l2 NaN or inf
    # for an all-zero reference (a check on zeros cannot fail) and max_abs NaN for a non-finite one.
    bad = [f"{k} {check[k]}" for k in ("rel_l2", "max_abs") if not math.isfinite(check[k])]
    if bad:
        return "fail", f"{', '.join(bad)}: the one-process reference is all zero or not finite; nothing was checked"
    if tol.rtol == 0 and tol.atol == 0 and tol.rel_l2 is None:
        return ("pass", "") if check["bit_equal"] else ("fail", f"not bit-equal: max_abs {check['max_abs']:.3g}")
    if tol.rel_l2 is not None and check["rel_l2"] > tol.rel_l2:
        return "fail", f"rel_l2 {check['rel_l2']:.3g} > {tol.rel_l2:.3g}"
    if tol.atol > 0 and check["max_abs"] > tol.atol:
        return "fail", f"max_abs {check['max_abs']:.3g} > atol {tol.atol:.3g}"
    return "pass", ""


def layer_breakdown(ph: dict) -> list[dict]:
    """Median over repeats per layer: total, communication (its collectives), compute = total - communication."""
    per_layer: dict[int, list[float]] = {}
    for (layer, op, _), secs in zip(ph["calls"], ph["call_s"]):
        per_layer.setdefault(layer, [0.0] * len(secs))
        per_layer[layer] = [a + b for a, b in zip(per_layer[layer], secs)]
    out = []
    for key, total in ph["layer_s"].items():
        comm = per_layer.get(int(key), [0.0] * len(total))
        out.append({"layer": int(key), "total_s": statistics.median(total), "comm_s": statistics.median(comm),
                    "compute_s": statistics.median([t - c for t, c in zip(total, comm)])})
    return out


def phase_rows(case, ctx, backend: str, ranks: list[dict], common: dict) -> list[Record]:
    out = []
    for phase, ph in ranks[0]["phases"].items():
        digests = [r["phases"][phase].get("digest", "") for r in ranks]
        status, reason = _verdict(ph.get("check"), case.tolerance, digests)
        chk = ph.get("check") or {}
        rec = ctx.record(case, backend, link=case.shape.link, status=status, reason=reason,
                         max_abs=chk.get("max_abs", math.nan), rel_l2=chk.get("rel_l2", math.nan),
                         n_nan=chk.get("n_nan", 0),
                         extra=dict(common, bit_equal=chk.get("bit_equal"), host_syncs=ph.get("host_syncs", "")))
        rec.phase = phase
        if "step_s" in ph:
            steps = [max(s) for s in zip(*(r["phases"][phase]["step_s"] for r in ranks))]
            t = timing.summarize(steps)
            rec.time_median_s, rec.time_p20_s, rec.time_p80_s = t.median_s, t.p20_s, t.p80_s
            rec.samples_s, rec.n_samples = steps, len(steps)
            layers = layer_breakdown(ph)
            comm = sum(x["comm_s"] for x in layers)
            rec.extra.update(rows=ph["rows"], layers=layers, comm_s=comm, compute_s=t.median_s - comm,
                             calls=ph["calls"], comm_bytes=sum(c[2] for c in ph["calls"]))
        out.append(rec)
    _breakeven(out)
    return out


def _breakeven(recs: list[Record]) -> None:
    """On the verify row: t_verify / t_decode = the tau (tokens per verify, bonus included) at which tree
    speculation breaks even on this link, drafter cost aside; a lower value on a slower link means speculation
    gains more there. Also the communication share of both steps."""
    by = {r.phase: r for r in recs}
    ver, dec = by.get("verify"), by.get("decode")
    if ver is None or dec is None or math.isnan(ver.time_median_s) or math.isnan(dec.time_median_s):
        return
    ver.extra.update(breakeven_tau=ver.time_median_s / dec.time_median_s,
                     comm_share_verify=ver.extra["comm_s"] / ver.time_median_s,
                     comm_share_decode=dec.extra["comm_s"] / dec.time_median_s)


def comm_rows(case, ctx, rank0: dict, common: dict) -> list[Record]:
    """One row per (op, size): time, algbw and busbw (GB/s) by nccl-tests' definitions (comm_bench)."""
    out = []
    for b in rank0.get("comm_bench", []):
        prefix = "comm" if b["source"] == "sweep" else "comm-step"
        t = timing.summarize(b["samples_s"])
        rec = ctx.record(case, "nccl" if ctx.device == "cuda" else "gloo", dtype=b["dtype"], link=case.shape.link, status="info", bytes_moved=float(b["bytes"]),
                         time_median_s=t.median_s, time_p20_s=t.p20_s, time_p80_s=t.p80_s,
                         samples_s=b["samples_s"], n_samples=len(b["samples_s"]),
                         extra=dict(common, op=b["op"], source=b["source"], world=b["world"],
                                    algbw_GBps=b["algbw_Bps"] / 1e9, busbw_GBps=b["busbw_Bps"] / 1e9))
        rec.phase = f"{prefix}:{b['op']}:{b['bytes']}"
        out.append(rec)
    return out
