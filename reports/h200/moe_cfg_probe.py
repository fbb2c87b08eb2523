"""The Triton MoE layer of kimi-k2-slice-2 at decode sizes, for choosing its tile widths (plans/0015): (1) where a
batch-1 layer's time goes (torch.profiler over eager calls: CUDA time per kernel name, the route and plan's small
kernels against the two expert kernels); (2) the layer as a CUDA-graph replay with the shared expert fused (moe_forward,
dispatch triton) and apart (time_moe.layer_shared_apart) for up / down tile widths BN in 32 / 64 / 128 at rows 1, 8
and 520; every output checked against the float64 layer before and after timing (rel L2 < 1e-2).
Usage (GPU machine, repo root): python3 reports/h200/moe_cfg_probe.py OUT_DIR [ROWS ...] [--no-profile]
(ROWS default 1 8 520)"""
from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, "reports/h200")
import time_moe  # noqa: E402  (layer_weights, experts64, graphed, layer_shared_apart)

from kdbench import timing  # noqa: E402
from kdbench.model import moe as tmoe  # noqa: E402
from kdbench.model import moe_triton  # noqa: E402
from kdbench.references.model_config import get_preset  # noqa: E402

WIDTHS, ROWS = (32, 64, 128), (1, 8, 520)


def profile_b1(w, cfg, layer, x) -> str:
    """torch.profiler's kernel table (CUDA time per kernel name) over 10 eager calls of the fused layer at one row."""
    for _ in range(3):
        tmoe.moe_forward(w, cfg, layer, x, "triton")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            tmoe.moe_forward(w, cfg, layer, x, "triton")
        torch.cuda.synchronize()
    avg = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            return avg.table(sort_by=key, row_limit=60, max_name_column_width=90)
        except (AttributeError, KeyError, ValueError):
            continue
    return avg.table(row_limit=60)


def main(out: str, rows: tuple[int, ...], profile: bool) -> None:
    cfg = get_preset("kimi-k2-slice-2")
    layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    w, p = time_moe.layer_weights(cfg, layer, 15, "cuda", torch.bfloat16), f"layers.{layer}."
    ex = tuple(w[p + f"experts.{m}"] for m in ("w1", "w2", "w3"))
    sh = tuple(w[p + f"shared.{m}"] for m in ("w1", "w2", "w3"))
    shipped = moe_triton.CFG_BY_SLOTS
    op, res = tmoe.experts_op("triton", torch.empty(1, device="cuda", dtype=torch.bfloat16), ex[0]), {"rows": []}
    x1 = torch.randn(1, cfg.hidden, device="cuda").bfloat16()
    if profile:
        res["profile_b1"] = profile_b1(w, cfg, layer, x1)
        print(res["profile_b1"], flush=True)
    for n in rows:
        x = torch.randn(n, cfg.hidden, generator=torch.Generator(device="cuda").manual_seed(100 + n),
                        device="cuda").bfloat16()
        idx, wts = tmoe.route(x, w[p + "gate"], w[p + "gate_bias"], cfg)
        want = time_moe.experts64(x, idx, wts, *ex) + tmoe.swiglu(x.double(), *(m.double() for m in sh))
        try:
            sweep(res, w, cfg, layer, x, want, op, ex, shipped, n)
        finally:
            moe_triton.CFG_BY_SLOTS = shipped
    with open(f"{out}/moe_cfg_probe.json", "w") as fh:
        json.dump(res, fh, indent=1)


def sweep(res, w, cfg, layer, x, want, op, ex, shipped, n) -> None:
    """Every (up BN, down BN) pair at n rows, fused and apart, each a graph replay timed and checked; the caller
    restores the shipped table."""
    # the shipped BM of the apart launch (n x k slots); the fused one (n x (k + 1)) falls in the same class at the
    # probed rows 1 / 8 / 520 / 2080, and the single-row table below gives both that BM
    bm = next(b for limit, b, *_ in shipped if n * cfg.n_experts_per_tok <= limit)
    for ubn in WIDTHS:
        for dbn in WIDTHS:
            moe_triton.CFG_BY_SLOTS = ((1 << 62, bm, ubn, dbn),)
            for form, fn in (("fused", lambda: tmoe.moe_forward(w, cfg, layer, x, "triton")),
                             ("apart", lambda: time_moe.layer_shared_apart(w, cfg, layer, x, op, ex))):
                call = time_moe.graphed(fn, "cuda")
                before = time_moe.rel_l2(call(), want)
                t = timing.measure(call, warmup=2, repeat=7, device="cuda", flush_l2=True)
                after = time_moe.rel_l2(call(), want)
                ok = before < 1e-2 and after < 1e-2
                res["rows"].append({"rows": n, "up_bn": ubn, "down_bn": dbn, "form": form, "ok": ok,
                                    "median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s,
                                    "samples_s": t.samples_s, "rel_l2": [before, after]})
                print(f"rows {n:4d} up BN {ubn:3d} down BN {dbn:3d} {form}: {t.median_s * 1e3:.4f} ms "
                      f"[{t.p20_s * 1e3:.4f}, {t.p80_s * 1e3:.4f}] rel_l2 {before:.1e}/{after:.1e} "
                      f"{'pass' if ok else 'FAIL'}", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[2:] if a != "--no-profile"]
    main(sys.argv[1], tuple(int(a) for a in args) or ROWS, "--no-profile" not in sys.argv)
