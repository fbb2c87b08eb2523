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


def roofline(points: list[dict], ceilings: dict | None) -> str | None:
    """points: {label, intensity (FLOP/byte), rate (FLOP/s)}; ceilings: {copy_bytes_per_s, matmul_flops_per_s}.
    The roof is min(matmul rate, intensity x copy bandwidth) on log-log axes."""
    pts = [p for p in points if _ok(p["intensity"]) and _ok(p["rate"])]
    if not pts:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    xs = [p["intensity"] for p in pts]
    lo, hi = min(xs) / 4, max(xs) * 4
    if ceilings and _ok(ceilings.get("copy_bytes_per_s")) and _ok(ceilings.get("matmul_flops_per_s")):
        bw, peak = ceilings["copy_bytes_per_s"], ceilings["matmul_flops_per_s"]
        ridge = peak / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
        ax.plot(grid, [min(peak, x * bw) for x in grid], color="black", lw=1.5,
                label=f"roof: {_si(bw)}B/s copy, {_si(peak)}FLOP/s matmul")
    for label in sorted({p["label"] for p in pts}):
        sel = [p for p in pts if p["label"] == label]
        ax.scatter([p["intensity"] for p in sel], [p["rate"] for p in sel], s=22, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return _data_uri(fig)


def lines(series: dict[str, list[tuple]], xlabel: str, ylabel: str, *, logy: bool = False) -> str | None:
    """One line per series of (x, y) or (x, y, y_lo, y_hi) points; the band is drawn when given."""
    series = {k: sorted(p for p in v if p[1] is not None and math.isfinite(p[1])) for k, v in series.items()}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for label, pts in sorted(series.items()):
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, marker="o", ms=4, label=label)
        if all(len(p) == 4 and math.isfinite(p[2]) and math.isfinite(p[3]) for p in pts):
            ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return _data_uri(fig)


def stacked_stages(rows: list[tuple[str, dict[str, float]]]) -> str | None:
    """Horizontal stacked bars: one bar per row label, one segment per stage (seconds -> ms)."""
    rows = [(label, st) for label, st in rows if st]
    if not rows:
        return None
    stages = list(dict.fromkeys(k for _, st in rows for k in st))
    fig = _figure(height=max(2.0, 0.35 * len(rows) + 1.2))
    ax = fig.add_subplot()
    left = [0.0] * len(rows)
    for stage in stages:
        widths = [1e3 * float(st.get(stage, 0.0) or 0.0) for _, st in rows]
        ax.barh(range(len(rows)), widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("step time (ms), stacked by stage")
    ax.legend(fontsize=7, ncols=min(4, len(stages)))
    return _data_uri(fig)


def histogram(series: dict[str, dict[int, float]], xlabel: str) -> str | None:
    """Grouped bars of a discrete distribution per series (e.g. accept length -> fraction of steps)."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (label, hist) in enumerate(sorted(series.items())):
        xs = sorted(hist)
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], [hist[x] for x in xs], width=width,
               label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of steps")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    return _data_uri(fig)
