"""Calibrating and checking the cost model (plans/0008-cost-model.md): measured forward times -> efficiencies
(weighted linear least squares on the floors), predicted vs measured per cell, and the measured expert
curve. Measurements are JSONL records (reports/h200/costmodel_measure.py writes them), the shipped H200 cells
(data/cost_fit_h200.json, with their provenance: what the replay kind models with) or the older built-in
table of device/h200_facts.md."""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from kdbench.errors import UserError
from kdbench.references.model_config import get_preset

from .costmodel import (ACCEPT_S, COMPACT_S, H200, SERVING, Efficiency, ExpertCurve, Hardware, build_time, default_drafter,
                        drafter_floors, floors, forward_time, work_time)

# the eager cuda step outside the verify forward (draft + build + accept + compact), block drafter, slice-2,
# batch 8, DDTree B = 64, prompts of 128 + 64 new tokens (plans/0003-engine.md, 2026-11-30 call E): 2.6 ms
DRAFT_MEASURED = dict(model="kimi-k2-slice-2", batch=8, budget=64, ctx=160, outside_verify_s=2.6e-3)
KDBENCH_ATTN_EFF = 0.50   # the kdbench tree-verify kernel: 38-57 % of its floor rate (device/h200_facts.md)


@dataclass(frozen=True)
class Measurement:
    """One measured target forward: median seconds of `batch` x `rows` rows at context `ctx`; experts =
    distinct routed experts per MoE layer (from the router, mean over MoE layers). stage "outside_verify": the
    median time of a live speculative step outside its verify forward (draft + build + accept + compact +
    commit) at `batch` and budget rows - 1. mode: how the engine ran it ("eager": no CUDA graph)."""
    model: str
    batch: int
    rows: int
    ctx: int
    seconds: float
    experts: float = float("nan")
    source: str = ""
    stage: str = "forward"
    mode: str = "eager"


def forwards(ms) -> list[Measurement]:
    """The target-forward cells (the ones the efficiencies are fitted to)."""
    return [m for m in ms if m.stage == "forward"]


def outside_verify(ms, model: str) -> list[Measurement]:
    return [m for m in ms if m.stage == "outside_verify" and m.model == model]


def _facts() -> tuple[Measurement, ...]:
    """device/h200_facts.md, 'Target forward cost vs tree rows', kimi-k2-slice-2, eager, past 1024, chains."""
    rows = (1, 9, 17, 33, 65, 129, 257)
    cells = {1: ((5.88, 8), (7.20, 50), (8.70, 82), (9.36, 111), (10.1, 140), (10.5, 159), (10.3, 170)),
             8: ((5.77, 46), (8.62, 138), (9.19, 163), (10.1, 181), (12.1, 207), (16.6, 221), (26.6, 234)),
             32: ((7.09, 100), (11.4, 192), (12.1, 199), (17.5, 235), (26.8, 237), (47.1, 251), (85.6, 260))}
    return tuple(Measurement("kimi-k2-slice-2", b, r, 1024, ms * 1e-3, e, "h200_facts 2026-12-01")
                 for b, vals in cells.items() for r, (ms, e) in zip(rows, vals))


H200_FACTS = _facts()


def load(path) -> list[Measurement]:
    """JSONL: one Measurement per line (extra keys ignored); a bad line is a ValueError naming it."""
    out = []
    keys = set(Measurement.__dataclass_fields__)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            try:
                out.append(Measurement(**{k: v for k, v in obj.items() if k in keys}))
            except TypeError as exc:
                raise ValueError(f"{path}: line {n}: {exc}") from None
    return out


def dump(path, ms) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for m in ms:
            f.write(json.dumps(asdict(m)) + "\n")


def expert_curve(ms, model: str | None = None) -> ExpertCurve:
    """The measured experts at each (batch, rows) of `model` (or all) as an interpolation table; cells measured
    more than once (e.g. at two contexts) are averaged, not left to whichever the table keeps last."""
    seen: dict[tuple[int, int], list[float]] = {}
    for m in forwards(ms):
        if (model is None or m.model == model) and np.isfinite(m.experts):
            seen.setdefault((m.batch, m.rows), []).append(m.experts)
    pts = tuple(sorted((b, r, float(np.mean(e))) for (b, r), e in seen.items()))
    return ExpertCurve(pts, f"router, measured ({len(pts)} points)") if pts else ExpertCurve()


def fit(ms, curve: ExpertCurve, attn_eff: float = KDBENCH_ATTN_EFF, hw: Hardware = H200,
        label: str = "", max_eff: float = 1.0) -> Efficiency:
    """t = max(host, overhead + layer_s * layers + G / e_gemm + M / e_moe + A / attn_eff), least squares on
    relative error. The efficiencies are bounded to <= max_eff (1: no class beats its floor), the times to
    >= 0. host = host_s + host_layer_s * MoE layers; host_layer_s and layer_s are fitted only when the
    measurements span two layer counts. The host terms are scanned (a grid, then a finer one around the
    best); for each the device terms are a bounded linear least squares over the cells the device time binds.
    The drafter's fixed time comes from the outside_verify cells of the fitted model when there are any (else
    DRAFT_MEASURED)."""
    steps = [m for m in ms if m.stage == "outside_verify"]
    ms = forwards(ms)
    fl = [floors(get_preset(m.model), m.batch, m.rows, m.ctx, experts=curve, hw=hw) for m in ms]
    multi = len({f.layers for f in fl}) > 1
    A = np.array([[1.0] + ([float(f.layers)] if multi else []) + [f.gemm_s, f.moe_s] for f in fl])
    t = np.array([m.seconds for m in ms])
    y = t - np.array([f.attn_s / attn_eff for f in fl])
    n_moe = np.array([float(f.moe_layers) for f in fl])
    lo = np.zeros(A.shape[1])
    lo[-2:] = 1.0 / max_eff                                               # inverse efficiencies >= 1 / max_eff
    top = 1.25 * float(t.min())          # a host time above every cell's time fits none of them
    h0s = np.linspace(0.0, top, HOST_GRID if not multi else HOST_GRID // 3)
    h1s = np.linspace(0.0, top / max(n_moe.min(), 1.0), HOST_GRID // 3) if multi else np.zeros(1)
    scan = lambda a, b: min((_fit_at_host((h0, h1), A, y, t, h0 + h1 * n_moe, lo) for h0 in a for h1 in b),  # noqa: E731
                            key=lambda r: r[0])
    _, (h0, h1), x = scan(h0s, h1s)
    d0, d1 = h0s[1] - h0s[0], (h1s[1] - h1s[0] if multi else 0.0)
    fine = HOST_GRID // 4 if not multi else 9
    for _ in range(2 if multi else 1):   # refine around the best: +-1 coarse step, then +-1 of that
        h0s, h1s = (np.linspace(max(h0 - d0, 0.0), h0 + d0, fine),
                    np.linspace(max(h1 - d1, 0.0), h1 + d1, fine) if multi else np.zeros(1))
        _, (h0, h1), x = scan(h0s, h1s)
        d0, d1 = 2 * d0 / (fine - 1), 2 * d1 / (fine - 1)
    if not multi:
        x = np.insert(x, 1, 0.0)
    c0, cl, ig, im = (float(v) for v in x)
    eff = Efficiency(gemm=1.0 / ig, moe=1.0 / im, attn=attn_eff, overhead_s=c0, layer_s=cl,
                     host_s=float(h0), host_layer_s=float(h1), label=label or f"fitted to {len(ms)} forwards")
    models = {m.model for m in ms}
    own = [m for m in steps if m.model in models] if len(models) == 1 else []
    fixed, per_request = draft_overhead(eff, hw, own)
    return replace(eff, draft_overhead_s=fixed, draft_request_s=per_request)


HOST_GRID = 96   # host-time candidates per scan (the loss is piecewise smooth in host; two scans find its minimum)


def _fit_at_host(h, A, y, t, host, lo) -> tuple[float, tuple, np.ndarray]:
    """(loss, h, x) for the host times `host` (per cell; h: the host terms that gave them): x >= lo by least
    squares over the cells whose device time exceeds the host's, re-chosen until stable (a cell under the
    host time is predicted as the host time)."""
    w = 1.0 / t
    bound = np.ones(len(t), dtype=bool)
    x = lo.copy()
    for _ in range(8):
        if bound.sum() >= A.shape[1]:
            Ab, yb = A[bound] * w[bound, None], (y[bound] - A[bound] @ lo) * w[bound]
            x = lo + _nonneg_lstsq(Ab, yb)
        new = A @ x + (t - y) > host
        if (new == bound).all():
            break
        bound = new
    pred = np.maximum(host, A @ x + (t - y))
    return float(np.sum(((pred - t) * w) ** 2)), h, x


def draft_overhead(eff: Efficiency, hw: Hardware = H200, steps=()) -> tuple[float, float]:
    """(fixed s, s per request): a measured outside-verify time less the drafter's modeled work, the build and
    accept + compact, as a + c * batch by least squares (a, c >= 0) over `steps` (outside_verify Measurements
    of one model; c = 0 unless they span two batch sizes), or DRAFT_MEASURED (slice-2, plans/0003) alone."""
    cells = [(m.model, m.batch, m.rows - 1, m.ctx, m.seconds) for m in steps] or [
        (DRAFT_MEASURED["model"], DRAFT_MEASURED["batch"], DRAFT_MEASURED["budget"], DRAFT_MEASURED["ctx"],
         DRAFT_MEASURED["outside_verify_s"])]
    rest, batches = [], []
    for model, batch, budget, ctx, seconds in cells:
        cfg = get_preset(model)
        dc = default_drafter(cfg)
        rest.append(seconds - work_time(drafter_floors(dc, cfg, batch, ctx, hw), eff)
                    - build_time(batch, budget, cfg.vocab_size, dc.depth) - ACCEPT_S - COMPACT_S)
        batches.append(float(batch))
    if len(set(batches)) < 2:
        return max(float(np.mean(rest)), 0.0), 0.0
    A, y = np.array([[1.0, b] for b in batches]), np.array(rest)
    a, c = _nonneg_lstsq(A, y)
    return float(a), float(c)


def _nonneg_lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 (times and inverse efficiencies cannot be negative): drop the most negative
    coefficient's column and refit until none is negative (an active set small enough for 4 unknowns)."""
    active = list(range(A.shape[1]))
    while True:
        x = np.zeros(A.shape[1])
        x[active] = np.linalg.lstsq(A[:, active], y, rcond=None)[0]
        if x.min() >= 0 or len(active) == 1:
            return np.maximum(x, 0.0)
        active.remove(int(np.argmin(x)))


@dataclass(frozen=True)
class Cell:
    m: Measurement
    predicted_s: float
    error: float          # predicted / measured - 1
    experts: float        # the curve's experts at the cell
    bytes: float


def validate(ms, eff: Efficiency, curve: ExpertCurve, hw: Hardware = H200) -> list[Cell]:
    out = []
    for m in forwards(ms):
        f = floors(get_preset(m.model), m.batch, m.rows, m.ctx, experts=curve, hw=hw)
        t = forward_time(f, eff)
        out.append(Cell(m, t, t / m.seconds - 1.0, f.experts, f.bytes))
    return out


def summary(cells) -> dict:
    err = np.abs([c.error for c in cells])
    return {"cells": len(cells), "median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()),
            "within_25pct": int((err <= 0.25).sum())}


def leave_one_out(ms, curve: ExpertCurve, attn_eff: float = KDBENCH_ATTN_EFF) -> list[Cell]:
    """Each cell predicted by a model fitted to the other cells: the honest out-of-sample error."""
    out = []
    ms = forwards(ms)
    for i, m in enumerate(ms):
        eff = fit([x for j, x in enumerate(ms) if j != i], curve, attn_eff)
        out.extend(validate([m], eff, curve))
    return out


def markdown(cells) -> str:
    lines = ["| model | batch | rows | measured ms | predicted ms | error | experts (model) | experts (router) |"
             " GB moved |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in cells:
        m = c.m
        lines.append(f"| {m.model} | {m.batch} | {m.rows} | {m.seconds * 1e3:.2f} | {c.predicted_s * 1e3:.2f} | "
                     f"{c.error * 100:+.1f} % | {c.experts:.0f} | {m.experts:.0f} | {c.bytes / 1e9:.1f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the shipped fit (suite/data)

SHIPPED = Path(__file__).parent / "data" / "cost_fit_h200.json"
SHIPPED_FORMAT = "kdbench-costfit/1"


@dataclass(frozen=True)
class ShippedFit:
    """Measured cells that ship with kdbench and where they come from: the committed measurement file
    (`file`, repo-relative), its date, GPU, engine mode (eager: no CUDA graph) and the commit measured."""
    measurements: tuple[Measurement, ...]
    file: str
    date: str
    gpu: str
    mode: str
    commit: str

    def label(self) -> str:
        return f"{self.file} (measured {self.date} on {self.gpu}, {self.mode}, commit {self.commit})"

    def models(self) -> set[str]:
        return {m.model for m in self.measurements}


def ship(measured_file, out, *, date: str, gpu: str, commit: str, root=".") -> None:
    """Write the shipped fit from a committed measurement file (its path stored relative to root)."""
    ms = load(measured_file)
    modes = sorted({m.mode for m in ms})
    rel = str(Path(measured_file).resolve().relative_to(Path(root).resolve()))
    head = {"format": SHIPPED_FORMAT, "file": rel, "date": date, "gpu": gpu, "mode": "+".join(modes),
            "commit": commit}
    cells = ",\n  ".join(json.dumps(asdict(m)) for m in ms)      # one cell per line: diffs stay readable
    Path(out).write_text(json.dumps(head, indent=1)[:-2] + f',\n "measurements": [\n  {cells}\n ]\n}}\n')


@functools.lru_cache(maxsize=4)
def shipped(path=SHIPPED) -> ShippedFit:
    """The shipped cells; a missing or malformed file is a UserError naming it."""
    try:
        obj = json.loads(Path(path).read_text())
        if obj.get("format") != SHIPPED_FORMAT:
            raise ValueError(f"format {obj.get('format')!r}, expected {SHIPPED_FORMAT!r}")
        ms = tuple(Measurement(**m) for m in obj["measurements"])
        return ShippedFit(ms, obj["file"], obj["date"], obj["gpu"], obj["mode"], obj["commit"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: bad shipped cost fit ({exc})") from None


def fit_model(ms, model: str, label: str = "") -> tuple[Efficiency, ExpertCurve]:
    """(efficiency, router curve) fitted to `model`'s own cells among ms."""
    own = [m for m in ms if m.model == model]
    curve = expert_curve(own)
    return fit(own, curve, label=label), curve


@functools.lru_cache(maxsize=32)
def shipped_setting(model: str, path=SHIPPED) -> tuple[Efficiency, ExpertCurve, str]:
    """(efficiency, expert curve, provenance) for a modeled step of `model`: fitted to the shipped cells of
    that model when it was measured; else the assumed serving-grade efficiencies, with the router curve of
    the deepest measured kimi-k2 slice for kimi-k2 presets (uniform routing for the rest)."""
    fit_ = shipped(path)
    own = [m for m in fit_.measurements if m.model == model]
    if own:
        eff, curve = fit_model(own, model, f"fitted to {len(forwards(own))} forwards of {fit_.label()}")
        return eff, curve, f"fit: {fit_.label()}"
    slices = sorted((m for m in fit_.models() if m.startswith("kimi-k2-slice-")), key=lambda m: get_preset(m).n_layers)
    if model.startswith("kimi-k2") and slices:
        curve = expert_curve([m for m in fit_.measurements if m.model == slices[-1]])
        return SERVING, curve, f"assumed serving-grade efficiencies; router experts of {slices[-1]} from {fit_.label()}"
    return SERVING, ExpertCurve(), "assumed serving-grade efficiencies; uniform-routing experts"
