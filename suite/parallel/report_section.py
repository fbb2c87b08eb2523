"""The report's topology section, from saved rows only: busbw vs message size per link, the sharded step's
compute vs communication per link, the phase table, and the MODELED 8-GPU comparison (costmodel.py) with its
assumptions, plus modeled vs measured for every measured real-width phase (the model's check)."""
from __future__ import annotations

import json

from kdbench import plots
from kdbench import report_tables as tables
from kdbench.references.model_config import get_preset

from . import costmodel

PHASE_T = {"decode": lambda s: 1, "verify": lambda s: s["budget"] + 1, "prefill": lambda s: s["prompt_len"]}


def _busbw_plot(comm) -> dict | None:
    series: dict[str, list] = {}
    for r in comm:
        if r.extra.get("source") != "sweep":
            continue
        n = r.extra.get("world", 1)
        y = r.extra["busbw_GBps"] if n > 1 else r.extra["algbw_GBps"]
        key = f"{r.extra['op']} [{r.link}, {n} rank{'s' if n > 1 else ''}]" + ("" if n > 1 else " algbw")
        series.setdefault(key, []).append((r.bytes_moved, y))
    uri = plots.lines({k: sorted(v) for k, v in series.items()}, "message size (bytes)", "GB/s", logy=True,
                      logx=True)
    return uri and {"title": "bus bandwidth vs message size per link", "uri": uri, "wide": True,
                    "caption": "nccl-tests definitions: algbw = size / time, busbw = algbw x 2(n-1)/n (all-reduce) "
                               "or (n-1)/n (all-gather, reduce-scatter, all-to-all); at one rank busbw is 0 by "
                               "definition, so algbw (the local copy) is drawn"}


def _stacked_plot(phases) -> dict | None:
    rows = [(f"{r.case} {r.phase} [{r.link}, {r.extra.get('world')}x]",
             {"compute": r.extra["compute_s"], "communication": r.extra["comm_s"]})
            for r in phases if "comm_s" in r.extra]
    uri = plots.stacked_stages(rows)
    return uri and {"title": "sharded step time per link: compute vs communication", "uri": uri, "wide": False,
                    "caption": "median forward of the slowest rank; communication = the timed collectives "
                               "(Record.extra['layers'] per layer); compute = the rest"}


def _calibration(phases) -> tuple[float, str] | None:
    """(efficiency, source) from a measured one-rank bf16 verify of a K2 slice on the GPU, if the run has one."""
    for r in phases:
        s = json.loads(r.shape)
        if (r.phase == "verify" and s["model"].startswith("kimi-k2-slice") and r.dtype == "bfloat16"
                and r.extra.get("world") == 1 and r.time_median_s == r.time_median_s):
            eff = costmodel.calibrated_efficiency(r.time_median_s, get_preset(s["model"]), costmodel.H200,
                                                  batch=s["batch"], T=s["budget"] + 1, ctx=s["prompt_len"] + 1)
            return eff, f"{r.case} verify ({r.time_median_s * 1e3:.2f} ms measured)"
    return None


def modeled_table(phases=()) -> dict:
    cal = _calibration(phases)
    runs = [(None, f"efficiency {costmodel.H200.efficiency} (assumed)")]
    if cal:
        runs.append((cal[0], f"efficiency {cal[0]:.2f} calibrated from {cal[1]}"))
    rows = []
    for eff, label in runs:
        for r in costmodel.compare_8gpu(efficiency=eff):
            rows.append([f"{r['system']}; {label}", f"{r['weights_GB_per_gpu']:.0f} GB",
                         f"{r['ar']['total_s'] * 1e3:.2f} ms", f"{r['comm_share_ar']:.0%}",
                         f"{r['verify']['total_s'] * 1e3:.2f} ms", f"{r['comm_share_verify']:.0%}",
                         f"{r['ar_tok_s']:.0f}", f"{r['ddtree_tok_s']:.0f}", f"{r['speedup']:.2f}x"])
    inp = costmodel.compare_8gpu()[0]["inputs"]
    return {"title": "MODELED, not measured: full-size Kimi K2 with DDTree on 8 GPUs",
            "headers": ["system", "weights / GPU", "AR step", "comm share", "verify step", "comm share",
                        "AR tok/s", "DDTree tok/s", "speedup"], "rows": rows,
            "caption": (f"batch {inp['batch']}, tree budget {inp['budget']}, context {inp['ctx']}, tau {inp['tau']} "
                        f"(input), drafter {inp['draft_s'] * 1e3:.1f} ms per step (input). Assumptions: "
                        + " ".join(f"({i}) {a}" for i, a in enumerate(costmodel.ASSUMPTIONS, 1)))}


def validation_table(phases) -> dict | None:
    rows = []
    for r in phases:
        s = json.loads(r.shape)
        if not s["model"].startswith("kimi-k2-slice") or r.dtype != "bfloat16" or "comm_s" not in r.extra:
            continue
        cfg, T = get_preset(s["model"]), PHASE_T[r.phase](s)
        ctx = {"prefill": 0, "decode": s["prompt_len"], "verify": s["prompt_len"] + 1}[r.phase]
        m = costmodel.step_s(cfg, costmodel.H200, costmodel.NVLINK_H200_8, r.extra["world"], batch=s["batch"], T=T,
                             ctx=ctx, w=costmodel.MEASURED_WEIGHTS)   # the run's bf16 experts, as the calibration
        rows.append([f"{r.case} {r.phase}", f"{r.time_median_s * 1e3:.2f} ms", f"{m['total_s'] * 1e3:.2f} ms",
                     f"{r.time_median_s / m['total_s']:.2f}"])
    return rows and {"title": "cost model check: measured vs modeled (same shape, H200 inputs)",
                     "headers": ["phase", "measured", "modeled", "measured / modeled"], "rows": rows,
                     "caption": "modeled = costmodel.step_s with the H200 inputs (efficiency 0.5 of the floor) and the "
                                "run's bf16 expert weights; a "
                                "ratio far from 1 says the efficiency input is off for this kernel set"}


def topology_section(recs) -> dict:
    comm = [r for r in recs if r.phase.startswith("comm")]
    phases = [r for r in recs if not r.phase.startswith("comm")]
    rows = [tables.row(r) for r in phases]
    plot_list = [p for p in (_busbw_plot(comm), _stacked_plot(phases)) if p]
    extra_tables = [t for t in (validation_table(phases), modeled_table(phases)) if t]
    return {"type": "generic", "title": "topology", **tables.layout(tables.GENERIC_COLUMNS, rows), "rows": rows,
            "plots": plot_list, "tables": extra_tables, "legend": tables.legend(phases + comm)}
