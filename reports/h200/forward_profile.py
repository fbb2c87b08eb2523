"""Where the target's forward spends its time: kimi-k2-slice-2 (bf16), AR at batch 1 and 8 (one new row) and verify
at batch 1 and 8 x 65 rows (s12), over 1024 committed keys (the e2e floor cases' shape, engine/floor.py's inputs),
eager under torch.profiler: every CUDA kernel with its count and total device time, sorted, and their sum beside the
CUDA-graph replay of the same forward (CUDA events, median of 20 after 3). The floor's attention stage is the one
furthest from its floor (plans/0003): this names what runs there.
Also a same-process A/B of some of its ops, old form against the shipped one, each a CUDA graph of OP_INNER calls
(per-call time) in alternating order (ABBA, 2 rounds): the router gate (float32 weight copy + float32 GEMM vs
moe.gate_logits) at 1 / 8 / 520 rows, the RMS norm (eager formula vs mla.rms_norm) at the model's norm widths, the
Triton RoPE's forms (s11's float64 cos / sin and one program for all heads, other heads per program) vs the shipped
one (reduced float32 cos / sin, 4 heads a program, s13); and whole forwards (AR batch 1 and 8, verify batch 1 and
8 x 65) with each of two switches on and off, graphs captured per setting, ABBA over 2 rounds: mla.FUSED_SMALL_OPS
(the one-launch norm and RoPE against their eager formulas) and mla.FUSED_ABSORB (s12: the absorbed products
written in the kernel's layouts against the einsums and the concatenation). Writes OUT/forward_profile.json.
Usage (GPU machine, repo root): python3 reports/h200/forward_profile.py OUT_DIR [--kernels]
  --kernels: the kernel listings only (the four forwards, and verify batch 8 x 65 with FUSED_ABSORB off)."""
from __future__ import annotations

import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from kdbench import timing
from kdbench.engine.engine import target_from_preset
from kdbench.engine.floor import _inputs
from kdbench.model import fused_triton, mla
from kdbench.model import moe as tmoe


def graph_ms(fn, reps: int = 20, inner: int = 1) -> float:
    """Median per-call milliseconds of a graph of `inner` calls of fn (timing.graph_replays_s): inner > 1 amortizes
    the graph's launch (~15-25 us, the whole of a one-op graph's reading: s11 and s12 call A)."""
    return 1e3 * statistics.median(timing.graph_replays_s(fn, reps, inner))


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


OP_INNER = 20   # calls per graph in ops_ab (s12; s11's one-call graphs read ~15-25 us of launch for every op)


def eager_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def abba(a, b, time_of) -> dict:
    """{a: samples, b: samples} of time_of(key) in the orders a b, b a, b a, a b (ABBA over 2 rounds)."""
    t = {a: [], b: []}
    for order in ((a, b), (b, a), (b, a), (a, b)):
        for k in order:
            t[k].append(time_of(k))
    return t


def switched(switch: str, on: bool, fn):
    """fn() with mla.<switch> set to on, then back on (every switch's shipped setting)."""
    setattr(mla, switch, on)
    try:
        return fn()
    finally:
        setattr(mla, switch, True)


def ops_ab(model) -> list[dict]:
    """Old vs shipped form of the gate, the norm and the RoPE (rope_cases), per call in graphs of OP_INNER calls,
    ABBA over 2 rounds -> medians per form."""
    w, cfg, g = model.w, model.cfg, torch.Generator(device="cuda").manual_seed(5)
    gate = w[next(k for k in w if k.endswith(".gate"))]
    cases = []
    for n in (1, 8, 520):
        x = torch.randn(n, cfg.hidden, generator=g, device="cuda").bfloat16()
        cases.append((f"gate rows {n}", lambda x=x: x.float() @ gate.float().T, lambda x=x: tmoe.gate_logits(x, gate)))
    for n in (1, 8, 520):
        for d, name in ((cfg.hidden, "norm"), (cfg.q_lora_rank, "q_norm"), (cfg.kv_lora_rank, "kv_norm")):
            x = torch.randn(n, d, generator=g, device="cuda").bfloat16()
            wn = w[next(k for k in w if k.endswith(name))]
            cases.append((f"{name} rows {n} d {d}", lambda x=x, wn=wn: eager_norm(x, wn, cfg.rms_eps),
                          lambda x=x, wn=wn: mla.rms_norm(x, wn, cfg.rms_eps)))
    cases += rope_cases(model, g)
    out = []
    for name, old, new in cases:
        t = abba("old", "new", lambda k, old=old, new=new: graph_ms(old if k == "old" else new, inner=OP_INNER))
        rec = {"op": name, "old_us": 1e3 * statistics.median(t["old"]), "new_us": 1e3 * statistics.median(t["new"])}
        out.append(rec)
        print(f"  {name:60s} old {rec['old_us']:7.1f} us  new {rec['new_us']:7.1f} us", flush=True)
    return out


def rope_cases(model, g) -> list[tuple]:
    """(name, old form, shipped form) of the Triton RoPE at AR batch 1 / 8 and verify 8 x 65: q_pe (64 heads) under
    s11's form and other heads per program, k_pe (one head) under s11's float64 cos / sin."""
    cfg, freqs, pos1, cases = model.cfg, model.freqs, torch.tensor([[1024]], device="cuda"), []
    for n, rows, pos in ((1, 1, pos1), (8, 1, pos1.expand(8, 1)), (8, 65, torch.arange(65, device="cuda").expand(8, 65))):
        for h, name in ((cfg.n_heads, "q_pe"), (0, "k_pe")):
            x = torch.randn((n, rows, h, cfg.qk_rope_dim) if h else (n, rows, cfg.qk_rope_dim), generator=g,
                            device="cuda").bfloat16()
            forms = (("s11: float64 cos / sin, all heads a program", dict(fp64_trig=True, block_heads=64)),
                     ("all heads a program", dict(block_heads=64)), ("16 heads a program", dict(block_heads=16)),
                     ("8 heads a program (s12)", dict(block_heads=8))) if h else (("s11", dict(fp64_trig=True)),)
            for label, kw in forms:
                cases.append((f"rope {name} rows {n}x{rows}: {label} vs shipped",
                              lambda x=x, p=pos, kw=kw: fused_triton.rope(x, p, freqs, **kw),
                              lambda x=x, p=pos: mla.rope_interleaved(x, p, freqs)))
    return cases


def forwards_ab(model, switch: str) -> list[dict]:
    """Whole forwards as graphs with mla.<switch> on vs off (FUSED_SMALL_OPS: the one-launch norm and RoPE;
    FUSED_ABSORB: the kernel path's absorbed products without layout copies), each setting its own graph."""
    out = []
    for batch, rows in ((1, 1), (8, 1), (1, 65), (8, 65)):
        tokens, positions, cache, lens, anc = _inputs(model, batch, rows, 1024, 0)
        fn = lambda: model.forward(tokens, positions, cache, lens, anc, attn="cuda", tap_layers=())  # noqa: E731
        t = abba(False, True, lambda on, fn=fn: switched(switch, on, lambda: graph_ms(fn)))
        rec = {"switch": switch, "batch": batch, "rows": rows, "off_ms": statistics.median(t[False]),
               "on_ms": statistics.median(t[True]), "samples_ms": {"off": t[False], "on": t[True]}}
        out.append(rec)
        print(f"  forward B{batch} rows {rows}, {switch}: off {rec['off_ms'] * 1e3:7.1f} us, on "
              f"{rec['on_ms'] * 1e3:7.1f} us", flush=True)
    return out


FORWARDS = (("ar_b1", 1, 1), ("ar_b8", 8, 1), ("verify_b1x65", 1, 65), ("verify_b8x65", 8, 65))  # name, batch, rows


def forward_kernels(model, batch: int, rows: int) -> dict:
    """The kernels of one eager forward (batch x rows new rows over 1024 keys) and its graph replay time."""
    tokens, positions, cache, lens, anc = _inputs(model, batch, rows, 1024, 0)
    fn = lambda: model.forward(tokens, positions, cache, lens, anc, attn="cuda", tap_layers=())  # noqa: E731
    ks = kernels(fn)
    rec = {"graph_ms": graph_ms(fn), "kernel_sum_us": sum(k["us"] for k in ks), "kernels": ks}
    print(f"batch {batch} x {rows} rows: graph {rec['graph_ms'] * 1e3:.1f} us, kernels sum {rec['kernel_sum_us']:.1f} us",
          flush=True)
    for k in ks[:40]:
        print(f"  {k['us']:8.1f} us  x{k['count']:3d}  {k['kernel'][:120]}", flush=True)
    return rec


def main(out_dir: str, only_kernels: bool = False) -> None:
    model = target_from_preset("kimi-k2-slice-2", 29, device="cuda", dtype=torch.bfloat16)
    report = {}
    with torch.no_grad():
        for name, batch, rows in FORWARDS:
            report[name] = forward_kernels(model, batch, rows)
        # the verify forward's listing with the einsums and the concatenation too
        report["verify_b8x65_absorb_off"] = switched("FUSED_ABSORB", False, lambda: forward_kernels(model, 8, 65))
        if not only_kernels:
            report["ops_ab"] = ops_ab(model)
            report["forwards_ab"] = forwards_ab(model, "FUSED_SMALL_OPS") + forwards_ab(model, "FUSED_ABSORB")
    with open(f"{out_dir}/forward_profile.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], only_kernels="--kernels" in sys.argv[2:])
