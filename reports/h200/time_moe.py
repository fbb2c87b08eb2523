"""The MoE layer of kimi-k2-slice-2 (hidden 7168, 384 experts, top-8, expert width 2048, one shared expert) at
decode and verify sizes: AR batch 1 / 8 / 32 rows and verify batch 8 x T 65 = 520 rows, per dispatch (moe_triton
ours, moe_flashinfer and moe_liger peers, moe_grouped, moe_loop) and, where capturable, replayed as a CUDA graph.
Times the whole layer (route + routed experts + shared expert; for the Triton experts also with the shared expert
apart, the A/B of its fusion) and the routed experts alone; floor = bytes of the
touched experts (+ shared expert and gate for the layer) / measured copy bandwidth. Every output is checked
against a float64 evaluation on the device of the same idx / weights (relative L2), before and after timing.
Usage (GPU machine, repo root): python3 reports/h200/time_moe.py OUT_DIR [--quick]; a CPU dry run of the code
paths: ... OUT_DIR --quick --device cpu --preset tiny (float32; the Triton rows are skipped there)."""
from __future__ import annotations

import argparse
import json
import time

import torch

from kdbench import timing
from kdbench.backends import registry
from kdbench.model import moe as tmoe
from kdbench.references.model import GATE_BIAS_STD, weight_shapes
from kdbench.references.model_config import get_preset

PRESET, ROWS = "kimi-k2-slice-2", (("ar-b1", 1), ("ar-b8", 8), ("ar-b32", 32), ("verify-b8-t65", 520))
DISPATCH = ("triton", "flashinfer", "liger", "grouped", "loop")
# Captured as graphs too: every dispatch whose registry entry does not sync with the host (loop and liger do), but
# flashinfer (never tried in a graph).
GRAPHABLE = tuple(d for d in DISPATCH if not registry.get("moe_" + d).host_sync and d != "flashinfer")
REL_L2 = 1e-2                            # bf16 weights and activations against float64 on the same values


def layer_weights(cfg, layer: int, seed: int, dev: str, dtype) -> dict:
    """The MoE layer's tensors only (bf16; the router bias float32), drawn on the device like init_weights."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if not name.startswith(f"layers.{layer}.") or not any(k in name for k in ("experts", "gate", "shared")):
            continue
        bias = name.endswith("gate_bias")
        t = torch.empty(shape, dtype=torch.float32 if bias else dtype, device=dev)
        out[name] = t.normal_(0.0, GATE_BIAS_STD if bias else shape[-1] ** -0.5, generator=gen)
    return out


def experts64(x, idx, wts, w1, w2, w3) -> torch.Tensor:
    """float64 routed sum on the device, expert by expert (the touched ones)."""
    xd, y = x.double(), torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(idx).tolist():
        rows, slots = torch.nonzero(idx == e, as_tuple=True)
        a, u = xd[rows] @ w1[e].double().T, xd[rows] @ w3[e].double().T
        y.index_add_(0, rows, wts[rows, slots, None].double() * ((a * torch.sigmoid(a) * u) @ w2[e].double().T))
    return y


def layer_shared_apart(w, cfg, layer, x, op, ex) -> torch.Tensor:
    """The layer with the shared expert in GEMMs of its own after the routed experts (how moe_forward ran it
    before the Triton launches took it in, plans/0015): the same-process A/B of that fusion."""
    p = f"layers.{layer}."
    idx, wts = tmoe.route(x, w[p + "gate"], w[p + "gate_bias"], cfg, triton_select=True)   # as moe_forward's
    return op(x, idx, wts, *ex) + tmoe.swiglu(x, *(w[p + f"shared.{m}"] for m in ("w1", "w2", "w3")))


def rel_l2(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


def measure(fn, quick: bool, dev: str):
    return timing.measure(fn, warmup=2 if quick else 3, repeat=5 if quick else 15, device=dev, flush_l2=True)


def graphed(fn, dev: str):
    """fn captured once (after a warm call) -> the replay, returning the captured output tensor."""
    if dev != "cuda":
        raise RuntimeError("CUDA graphs need a GPU")
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return lambda: (g.replay(), out)[1]


def main(out_dir: str, quick: bool, dev: str, preset: str) -> None:
    cfg = get_preset(preset)
    layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    w, p = layer_weights(cfg, layer, 15, dev, dtype), f"layers.{layer}."
    ex = (w[p + "experts.w1"], w[p + "experts.w2"], w[p + "experts.w3"])
    ceil = timing.ceilings(dev)
    bw = ceil.copy_bytes_per_s
    e_bytes = 3 * cfg.hidden * cfg.moe_intermediate * ex[0].element_size()       # one expert
    fixed = sum(w[p + n].numel() * w[p + n].element_size() for n in ("gate", "shared.w1", "shared.w2", "shared.w3"))
    recs, say = [], lambda line: print(line, flush=True)    # noqa: E731  (moe_call.sh keeps stdout as the log)
    say(f"{preset} layer {layer}; ceilings: {ceil.source}; copy {bw / 1e9:.0f} GB/s")
    for name, n in ROWS:
        x = torch.randn(n, cfg.hidden, generator=torch.Generator(device=dev).manual_seed(100 + n),
                        device=dev).to(dtype)
        idx, wts = tmoe.route(x, w[p + "gate"], w[p + "gate_bias"], cfg)
        touched = int(torch.unique(idx).numel())
        want_e = experts64(x, idx, wts, *ex)
        want_l = want_e + tmoe.swiglu(x.double(), *(w[p + f"shared.{m}"].double() for m in ("w1", "w2", "w3")))
        floors = {"experts": (touched * e_bytes + 4 * n * cfg.hidden) / bw,
                  "layer": (touched * e_bytes + fixed + 4 * n * cfg.hidden) / bw}
        for d in DISPATCH:
            ok, why = registry.available("moe_" + d, dev)
            if not ok:
                recs.append({"case": name, "rows": n, "dispatch": d, "status": "skipped", "reason": why})
                say(f"{name} {d}: skipped: {why}")
                continue
            op = tmoe.experts_op(d, x, ex[0])
            calls = {"experts": (lambda: op(x, idx, wts, *ex), want_e),
                     "layer": (lambda: tmoe.moe_forward(w, cfg, layer, x, d), want_l)}
            if getattr(op, "fuses_shared", False):
                calls["layer_shared_apart"] = (lambda: layer_shared_apart(w, cfg, layer, x, op, ex), want_l)
            for scope, (fn, want) in calls.items():
                floor = floors[scope.split("_")[0]]
                for mode in ("eager", "graph") if d in GRAPHABLE else ("eager",):
                    rec = {"case": name, "rows": n, "dispatch": d, "scope": scope, "mode": mode,
                           "experts_touched": touched, "bytes": floor * bw, "floor_s": floor}
                    try:
                        call = graphed(fn, dev) if mode == "graph" else fn
                        before = rel_l2(call(), want)
                        t = measure(call, quick, dev)
                        after = rel_l2(call(), want)
                    except Exception as exc:   # noqa: BLE001 - one failing contender is a row, not the end
                        rec.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
                        recs.append(rec)
                        say(f"{name} {d} {scope} {mode}: ERROR {rec['reason']}")
                        continue
                    passed = before < REL_L2 and after < REL_L2
                    rec.update(status="pass" if passed else "fail", rel_l2_before=before, rel_l2_after=after,
                               median_s=t.median_s, p20_s=t.p20_s, p80_s=t.p80_s, samples_s=t.samples_s,
                               pct_of_floor=100 * floor / t.median_s)
                    recs.append(rec)
                    say(f"{name} rows {n} {d:10s} {scope:7s} {mode:5s}: {t.median_s * 1e3:7.3f} ms "
                        f"[{t.p20_s * 1e3:.3f}, {t.p80_s * 1e3:.3f}] floor {floor * 1e3:.3f} ms = "
                        f"{rec['pct_of_floor']:5.1f} %; {touched} experts, {rec['bytes'] / 1e9:.2f} GB; "
                        f"rel_l2 {before:.1e}/{after:.1e} {rec['status']}")
        del want_e, want_l
    with open(f"{out_dir}/moe_timing.json", "w") as fh:
        json.dump({"preset": preset, "ceilings": ceil.__dict__, "time": time.time(), "rows": recs}, fh, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true", help="warm-up 2, 5 samples (else 3 and 15)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PRESET)
    a = ap.parse_args()
    main(a.out, a.quick, a.device, a.preset)
