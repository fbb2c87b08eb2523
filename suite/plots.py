"""matplotlib charts for the HTML report, each returned as a `data:image/png;base64,...` URI (Agg canvas,
no pyplot state). Inputs are prepared lists from report.py; a chart with nothing to draw returns None.
"""
from __future__ import annotations

import base64
import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter

from kdbench import timing

DPI = 90


def _figure(width: float = 6.4, height: float = 3.6) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _si(x: float) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g} "


def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def roofline(points: list[dict], roofs: dict[str, dict]) -> str | None:
    """points: {label, intensity (FLOP/byte), rate (FLOP/s)}; roofs: {device label: {copy_bytes_per_s,
    matmul_flops_per_s}}, one roof per device the rows were timed on (the first solid, others dashed), each
    min(matmul rate, intensity x copy bandwidth) on log-log axes."""
    pts = [p for p in points if _ok(p["intensity"]) and _ok(p["rate"])]
    if not pts:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    xs = [p["intensity"] for p in pts]
    lo, hi = min(xs) / 4, max(xs) * 4
    usable = {k: c for k, c in roofs.items() if _ok(c.get("copy_bytes_per_s")) and _ok(c.get("matmul_flops_per_s"))}
    for c in usable.values():
        ridge = c["matmul_flops_per_s"] / c["copy_bytes_per_s"]
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
    grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
    for i, (where, c) in enumerate(usable.items()):
        bw, peak = c["copy_bytes_per_s"], c["matmul_flops_per_s"]
        ax.plot(grid, [timing.attainable_flops_per_s(x, bw, peak) for x in grid], color="black" if i == 0 else "grey", lw=1.5,
                ls="-" if i == 0 else "--", label=f"{where} roof: {_si(bw)}B/s copy, {_si(peak)}FLOP/s matmul")
    for label in sorted({p["label"] for p in pts}):
        sel = [p for p in pts if p["label"] == label]
        ax.scatter([p["intensity"] for p in sel], [p["rate"] for p in sel], s=22, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.legend(fontsize=7, loc="upper left")   # above the roof nothing is drawn
    ax.grid(True, which="both", alpha=0.3)
    return _data_uri(fig)


def _clean(series: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    series = {k: sorted(p for p in v if p[1] is not None and math.isfinite(p[1])) for k, v in series.items()}
    return {k: v for k, v in series.items() if v}


def _x_axis(ax, xs: list[float], label: str, logx: bool | None) -> None:
    """logx None: log when the values span a factor of 8 or more (shape sweeps: 1K..32K); ticks at the
    values drawn when there are few, skipping any too close to the previous one to be read."""
    distinct = sorted(set(xs))
    if logx is None:
        logx = distinct[0] > 0 and distinct[-1] / distinct[0] >= 8
    pos = [math.log(x) for x in distinct] if logx else distinct
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if len(distinct) <= 8:
        width, kept = (pos[-1] - pos[0]) or 1.0, [0]
        for i in range(1, len(pos)):
            if pos[i] - pos[kept[-1]] >= 0.06 * width:
                kept.append(i)
        ax.set_xticks([distinct[i] for i in kept], [f"{distinct[i]:g}" for i in kept])
    ax.set_xlabel(label)


def _legend_room(labels, n_panels: int) -> float:
    """Inches added to a figure's width for a legend outside the axes (none when it fits inside)."""
    labels = list(labels)
    if n_panels == 1 and len(labels) <= 6:
        return 0.0
    return 1.0 + 0.055 * max(len(k) for k in labels)


def _legend(fig: Figure, ax, n_labels: int, n_panels: int) -> None:
    """Inside the axes for a few lines on one panel; otherwise outside on the right, so the axes keep
    their size (a long legend inside collapsed them: 'constrained_layout not applied')."""
    if n_panels == 1 and n_labels <= 6:
        ax.legend(fontsize=7)
    else:
        handles, labels = ax.get_legend_handles_labels() if n_panels == 1 else _all_handles(fig)
        fig.legend(handles, labels, loc="outside right upper", fontsize=7)


def _all_handles(fig: Figure) -> tuple[list, list]:
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    return list(seen.values()), list(seen)


def panels(panel_list: list[dict], ylabel: str, *, logy: bool = False, logx: bool | None = None) -> str | None:
    """Side-by-side line charts sharing the y axis; panel = {title, xlabel, series: {label: [(x, y) or
    (x, y, y_lo, y_hi)]}}; one colour per label across panels; the p20-p80 band is drawn when given."""
    panel_list = [dict(p, series=_clean(p["series"])) for p in panel_list]
    panel_list = [p for p in panel_list if p["series"]]
    if not panel_list:
        return None
    labels = sorted({k for p in panel_list for k in p["series"]})
    colour = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    dash = {label: ("-", "--", ":")[i // 10 % 3] for i, label in enumerate(labels)}   # past 10 colours
    width = 6.4 if len(panel_list) == 1 else 3.6 * len(panel_list) + 0.8
    fig = _figure(width=width + _legend_room(labels, len(panel_list)), height=3.6)
    axes = fig.subplots(1, len(panel_list), sharey=True, squeeze=False)[0]
    for ax, p in zip(axes, panel_list):
        for label, pts in sorted(p["series"].items()):
            xs, ys = [q[0] for q in pts], [q[1] for q in pts]
            ax.plot(xs, ys, marker="o", ms=4, label=label, color=colour[label], ls=dash[label])
            if all(len(q) == 4 and math.isfinite(q[2]) and math.isfinite(q[3]) for q in pts):
                ax.fill_between(xs, [q[2] for q in pts], [q[3] for q in pts], alpha=0.2, color=colour[label])
        _x_axis(ax, [q[0] for pts in p["series"].values() for q in pts], p["xlabel"], logx)
        ax.set_title(p.get("title", ""), fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    if logy:
        axes[0].set_yscale("log")
    axes[0].set_ylabel(ylabel)
    _legend(fig, axes[0], len(labels), len(panel_list))
    return _data_uri(fig)


def lines(series: dict[str, list[tuple]], xlabel: str, ylabel: str, *, logy: bool = False,
          logx: bool | None = None) -> str | None:
    """One line per series of (x, y) or (x, y, y_lo, y_hi) points; the band is drawn when given."""
    return panels([{"title": "", "xlabel": xlabel, "series": series}], ylabel, logy=logy, logx=logx)


def stacked_stages(rows: list[tuple[str, dict[str, float]]]) -> str | None:
    """Horizontal stacked bars: one bar per row label, one segment per stage (seconds -> ms)."""
    rows = [(label, st) for label, st in rows if st]
    if not rows:
        return None
    stages = list(dict.fromkeys(k for _, st in rows for k in st))
    fig = _figure(height=max(2.4, 0.3 * len(rows) + 1.6))
    ax = fig.add_subplot()
    left = [0.0] * len(rows)
    for stage in stages:
        widths = [1e3 * float(st.get(stage, 0.0) or 0.0) for _, st in rows]
        ax.barh(range(len(rows)), widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("step time (ms), stacked by stage")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(fontsize=7, ncols=min(6, len(stages)), loc="outside lower center")
    return _data_uri(fig)


def histogram(series: dict[str, dict[int, float]], xlabel: str) -> str | None:
    """Grouped bars of a discrete distribution per series (e.g. accept length -> fraction of steps)."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig = _figure(width=6.4 + _legend_room(series, 1))
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (label, hist) in enumerate(sorted(series.items())):
        xs = sorted(hist)
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], [hist[x] for x in xs], width=width,
               label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of steps")
    _legend(fig, ax, len(series), 1)
    ax.grid(True, axis="y", alpha=0.3)
    return _data_uri(fig)
