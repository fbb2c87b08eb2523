"""Where the target's AR decode forward spends its time: kimi-k2-slice-2 (bf16), batch 1 and 8, one new row over
1024 committed keys (the e2e floor cases' shape, engine/floor.py's inputs), eager under torch.profiler: every CUDA
kernel with its count and total device time, sorted, and their sum beside the CUDA-graph replay of the same
forward (CUDA events, median of 20 after 3). The floor's attention stage is at ~23 % of its floor at batch 1
(plans/0003): this names what runs there. Writes OUT/forward_profile.json.
Usage (GPU machine, repo root): python3 reports/h200/forward_profile.py OUT_DIR"""
from __future__ import annotations

import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from kdbench.engine.engine import target_from_preset
from kdbench.engine.floor import _inputs


def graph_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def kernels(fn) -> list[dict]:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(ev.name, {"kernel": ev.name[:160], "count": 0, "us": 0.0})
        r["count"] += 1
        r["us"] += ev.device_time
    return sorted(rows.values(), key=lambda r: -r["us"])


def main(out_dir: str) -> None:
    model = target_from_preset("kimi-k2-slice-2", 29, device="cuda", dtype=torch.bfloat16)
    report = {}
    with torch.no_grad():
        for batch in (1, 8):
            tokens, positions, cache, lens, anc = _inputs(model, batch, 1, 1024, 0)
            fn = lambda: model.forward(tokens, positions, cache, lens, anc, attn="cuda", tap_layers=())  # noqa: E731
            ks = kernels(fn)
            rec = {"graph_ms": graph_ms(fn), "kernel_sum_us": sum(k["us"] for k in ks), "kernels": ks}
            report[f"ar_b{batch}"] = rec
            print(f"AR batch {batch}: graph {rec['graph_ms'] * 1e3:.1f} us, kernels sum {rec['kernel_sum_us']:.1f} us",
                  flush=True)
            for k in ks[:30]:
                print(f"  {k['us']:8.1f} us  x{k['count']:3d}  {k['kernel'][:120]}", flush=True)
    with open(f"{out_dir}/forward_profile.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
