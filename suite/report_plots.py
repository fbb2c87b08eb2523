"""The run report's plot inputs, from saved Records: latency small multiples per sweep, the roofline, and the
generation plots (tau vs budget, acceptance by depth, accept-length histogram, stage times). plots.py draws.
"""
from __future__ import annotations

import json
from typing import Any

from kdbench import plots
from kdbench import report_tables as tables
from kdbench.report_tables import missing as _missing, ratio as _ratio, shape_of as _shape
from kdbench.results import Record


# ------------------------------------------------------------------------------------------ latency plots

def _varying(shapes: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(numeric keys that vary, most distinct values first; all keys that vary)."""
    keys = sorted({k for s in shapes for k in s})
    distinct = {k: len({json.dumps(s.get(k), sort_keys=True) for s in shapes}) for k in keys}
    varying = sorted((k for k in keys if distinct[k] > 1), key=lambda k: (-distinct[k], k))
    numeric = [k for k in varying if all(isinstance(s.get(k), (int, float)) and not isinstance(s.get(k), bool)
                                         for s in shapes)]
    return numeric, varying


def _by_value(text: str) -> tuple:
    """Sort key of a JSON-encoded shape value: numbers by value (8 before 16), then anything else as text."""
    value = json.loads(text)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if numeric else (1, 0, text)


def _anchor(shapes: list[dict[str, Any]], x: str, others: list[str]) -> tuple:
    """The values of the other varying keys at which a line along x is drawn: the setting with the most
    distinct x values, then the most rows, then the one nearest the middle of each key's sorted values."""
    values = {k: sorted({json.dumps(s.get(k), sort_keys=True) for s in shapes}, key=_by_value) for k in others}
    found: dict[tuple, list] = {}
    for s in shapes:
        found.setdefault(tuple(json.dumps(s.get(k), sort_keys=True) for k in others), []).append(s[x])

    def score(item):
        anchor, xs = item
        off_centre = sum(abs(values[k].index(v) - (len(values[k]) - 1) / 2) for k, v in zip(others, anchor))
        return (len(set(xs)), len(xs), -off_centre)
    return max(found.items(), key=score)[0]


def _latency_panel(recs: list[Record], shapes: list[dict], x: str, others: list[str], scale: float) -> dict:
    anchor = _anchor(shapes, x, others)
    series: dict[str, list[tuple]] = {}
    for rec, s in zip(recs, shapes):
        if tuple(json.dumps(s.get(k), sort_keys=True) for k in others) == anchor:
            series.setdefault(rec.backend or rec.kind, []).append(
                (s[x], rec.time_median_s / scale, rec.time_p20_s / scale, rec.time_p80_s / scale))
    fixed = ", ".join(f"{k}={json.loads(v)}" for k, v in zip(others, anchor))
    return {"title": fixed and f"at {fixed}", "xlabel": x, "series": series}


def _latency_plot(group: str, recs: list[Record]) -> dict | None:
    """Small multiples for one sweep (rows of one case name before '['): one panel per numeric shape key
    that varies (at most 3), the other varying keys held at one setting, one line per backend."""
    shapes = [_shape(r) for r in recs]
    numeric, varying = _varying(shapes)
    if not numeric:
        return None
    scale, unit = (1e-6, "µs") if tables.median(r.time_median_s for r in recs) < 1e-3 else (1e-3, "ms")
    panels = [_latency_panel(recs, shapes, x, [k for k in varying if k != x], scale) for x in numeric[:3]]
    uri = plots.panels(panels, f"median time ({unit}), band p20-p80", logy=True)
    constant = ", ".join(f"{k}={v}" for k, v in sorted(shapes[0].items()) if k not in varying)
    return uri and {"title": f"Latency vs {', '.join(numeric[:3])} ({group})", "uri": uri, "wide": len(panels) > 1,
                    "caption": f"median per case with its p20-p80 band, one line per backend; each panel varies "
                               f"one key with the others at the setting named above it"
                               f"{'; fixed: ' + constant if constant else ''}"}


def latency_plots(recs: list[Record]) -> list[dict]:
    """One latency figure per sweep that compares backends (or, when none does, per sweep of one backend)."""
    timed = [r for r in recs if not _missing(r.time_median_s) and r.time_median_s > 0]
    sweeps: dict[tuple, list[Record]] = {}
    for r in timed:
        sweeps.setdefault((r.scenario, r.case.split("[", 1)[0], r.dtype), []).append(r)
    compared = {k: g for k, g in sweeps.items() if len({r.backend for r in g}) > 1}
    plot_list = [_latency_plot(name, g) for (_, name, _), g in (compared or sweeps).items()]
    return [p for p in plot_list if p]


def roofline_plot(recs: list[Record], family: str) -> dict | None:
    """Each row against the roof of the device it was timed on: host-timed rows (the numpy reference on a GPU
    run) are labelled '(CPU)' and draw the CPU roof beside the GPU's, never under it."""
    wheres = [tables.where_timed(r) for r in recs]
    main = max(sorted(set(wheres)), key=lambda w: (wheres.count(w), w != "CPU")) if wheres else ""   # GPU on ties
    roofs: dict[str, dict] = {}
    points = []
    for r, where in zip(recs, wheres):
        if isinstance(r.extra.get("ceilings"), dict):
            roofs.setdefault(where, r.extra["ceilings"])
        points.append({"label": r.backend if where == main else f"{r.backend} ({where})",
                       "intensity": _ratio(r.flops, r.bytes_moved), "rate": _ratio(r.flops, r.time_median_s)})
    roofs = dict(sorted(roofs.items(), key=lambda kv: kv[0] != main))   # the main device's roof first
    uri = plots.roofline(points, roofs)
    shown = sum(1 for p in points if p["intensity"] > 0 and p["rate"] > 0)
    note = f"{len(points) - shown} timed rows without flops or bytes are not drawn" if shown < len(points) else ""
    return uri and {"title": f"Roofline: {family}", "uri": uri, "wide": False,
                    "caption": "achieved FLOP/s = flops / median time against intensity = flops / bytes_moved; "
                               "each roof is min(matmul rate, intensity x copy bandwidth) measured on the device "
                               f"the rows were timed on ({', '.join(roofs) or 'none recorded'})"
                               f"{'. ' + note if note else ''}"}


# ------------------------------------------------------------------------------------------ generation plots

def _tau_plot(recs: list[Record]) -> dict | None:
    """tau against budget, one line per (policy, backend, dtype) and per setting of the keys that vary inside
    it; drawn only when some line has two budgets."""
    lines: dict[str, list[tuple]] = {}
    groups = tables.grouped([r for r in recs if not _missing(r.tau) and "budget" in _shape(r)],
                             lambda r: (tables.policy_label(r).split("(")[0], r.backend, r.dtype))
    for (policy, backend, dtype), g in groups.items():
        shapes = [_shape(r) for r in g]
        split = [k for k in _varying(shapes)[1] if k not in ("budget", "policy")]
        for r, s in zip(g, shapes):
            label = " ".join([f"{policy} ({backend}, {dtype})"] + [f"{k}={s.get(k)}" for k in split])
            lines.setdefault(label, []).append((s["budget"], r.tau))
    if max((len(v) for v in lines.values()), default=0) < 2:
        return None
    uri = plots.lines(lines, "tree budget (nodes)", "tau (tokens per step, bonus included)")
    return uri and {"title": "tau vs budget per policy", "uri": uri, "wide": False,
                    "caption": "tau = committed tokens / verify steps, counting the bonus token"}


def _labeller(recs: list[Record]):
    """Row labels for the generation plots: 'case (backend)', plus the policy when one case holds several
    (an e2e case times its AR baseline under the same case name)."""
    pairs = [(r.case, r.backend) for r in recs]
    with_policy = len(set(pairs)) < len(pairs)
    return lambda r: (f"{r.case}: {tables.policy_label(r)} ({r.backend})" if with_policy
                      else f"{r.case} ({r.backend})")


def generation_plots(recs: list[Record]) -> list[dict]:
    out, label = [_tau_plot(recs)], _labeller(recs)
    drafted = [r for r in recs if r.extra.get("per_depth_accept")][:8]
    uri = plots.lines({label(r): [(d + 1, float(a)) for d, a in enumerate(r.extra["per_depth_accept"])]
                       for r in drafted}, "draft depth d", "a_d: fraction of steps reaching depth d", logx=False)
    out.append(uri and {"title": "acceptance by depth", "uri": uri, "wide": False,
                        "caption": "unconditional per-depth acceptance (tau = 1 + sum of a_d); first 8 rows"})
    accepted = [r for r in recs if not _missing(r.tau)][:8]
    uri = plots.histogram({label(r): tables.hist_fractions(r) for r in accepted},
                          "accept length per step (bonus included)")
    out.append(uri and {"title": "accept-length histogram", "uri": uri, "wide": False,
                        "caption": "fraction of verify steps committing each number of tokens (first 8 rows)"})
    uri = plots.stacked_stages([(label(r), r.extra.get("stage_s") or {}) for r in recs])
    out.append(uri and {"title": "step time by stage", "uri": uri, "wide": False,
                        "caption": "mean time per step in each stage (Record.extra['stage_s']); AR rows are one "
                                   "token per step"})
    return [p for p in out if p]
