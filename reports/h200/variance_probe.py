"""Why floor-b8-grouped's greedy DDTree left AR (plans/0003, the red row of s10): how far one request's logits
move when the same tokens are computed among other rows, per MoE dispatch, on kimi-k2-slice-2 (bf16, random
weights, the tree_verify_mla attention as in the e2e cases).

1. Whole forward (suite/model/invariant_check.py): the probe request decoded by AR alone (M = 1) against AR among
   8 requests (M = 8) and verified as a chain inside random trees of 8 x 65 rows (M = 520). The max |logit
   difference| is what rounding alone can move between a greedy AR run and a DDTree run; the verdict
   (suite/kinds/divergence.py) excuses a shift of the two arms' own logit gaps below 0.25.
2. The MoE layer alone: the first 8 of 520 random rows computed in a call of 8 rows and in the call of all 520,
   per dispatch (the same experts are picked: routing is per row) -> max |difference| / rms of the output.
3. The logits' scale: std and the median and smallest top-1 minus top-2 gap of AR alone's logits.
4. At a real prompt of 1024 random tokens (the e2e cases' prompt length), one request: the logits after each of 17
   prefixes by the three paths a verdict can see: AR's (prefill, then one decode row per token, `attn`), the
   verdict's prefill recomputation (generation.next_logits: one causal prefill on the torch attention) and a
   verify of the 16 continuation tokens as a chain (`attn`) -> max |difference| against AR's path, per prefix,
   of the logits and of the MoE selection margin of the predicting row (what a routing flip needs).
Writes OUT/variance_probe.json. Usage (GPU machine, repo root): python3 reports/h200/variance_probe.py OUT_DIR [--cpu-dry-run]."""
from __future__ import annotations

import json
import sys
import time

import torch

from kdbench.engine.engine import target_from_preset
from kdbench.kinds.divergence import model_logs
from kdbench.kinds.generation import next_logits
from kdbench.model import moe as tmoe
from kdbench.model.invariant_check import Probe, ar_decode, check_forward
from kdbench.model.transformer import Transformer

DISPATCHES = ("grouped", "triton")


def moe_layer_shift(model: Transformer, dispatch: str, n_small: int = 8, n_big: int = 520) -> dict:
    """Rows 0..n_small-1 of one random batch, computed in a call of n_small rows and in the call of n_big."""
    cfg, w, dev = model.cfg, model.w, model.device
    layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    g = torch.Generator(device=dev).manual_seed(7)
    x = torch.randn(n_big, cfg.hidden, device=dev, generator=g).to(model.dtype)
    big = tmoe.moe_forward(w, cfg, layer, x, dispatch)[:n_small].double()
    small = tmoe.moe_forward(w, cfg, layer, x[:n_small].clone(), dispatch).double()
    rms = float(big.pow(2).mean().sqrt())
    return {"rows_small": n_small, "rows_big": n_big, "bitwise_equal": bool(torch.equal(big, small)),
            "max_abs_diff": float((big - small).abs().max()), "rms": rms,
            "max_abs_diff_over_rms": float((big - small).abs().max()) / rms}


def logit_scale(model: Transformer) -> dict:
    logits, _ = ar_decode(model, 1, Probe(), 0, torch.Generator().manual_seed(1))
    top2 = logits.float().topk(2, dim=-1).values
    gap = (top2[:, 0] - top2[:, 1]).cpu()
    return {"std": float(logits.float().std()), "top2_gap_median": float(gap.median()),
            "top2_gap_min": float(gap.min()), "positions": int(gap.numel())}


def _logged(model, fn):
    """fn() with model.margin_log collecting -> (fn's result, {layer: selection margin per row [rows]})."""
    with model_logs(model, ("margin_log",)) as logs:
        out = fn()
    return out, {layer: m.double() for layer, m in logs.get("margin_log", [])}


def three_paths(model: Transformer, attn: str, n: int = 1024, depth: int = 4) -> dict:
    """Max |logit difference| and max |MoE selection margin difference| of the prefill recomputation and of a
    chain verify against AR's own path, for the predictions after prefixes of n .. n + depth tokens (the chain
    covers n + 1 ..). The margin shift is what can route one row to other experts in two forwards."""
    dev, V = model.device, model.cfg.vocab_size
    toks = torch.randint(0, V, (n + depth,), generator=torch.Generator().manual_seed(11)).to(dev)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)

    def prefilled():
        cache = model.new_cache(1, n + depth + 2)
        out, log = _logged(model, lambda: model.forward(
            toks[None, :n], torch.arange(n, device=dev)[None], cache, zero, kv_limit=n,
            logit_rows=torch.full((1,), n - 1, dtype=torch.int32, device=dev), attn="torch"))
        cache.lengths.fill_(n)
        return cache, out.logits[0, 0], {k: v[n - 1] for k, v in log.items()}

    cache, first, m0 = prefilled()
    ar, ar_m = [first], [m0]
    for k in range(depth):                                       # decode rows n .. n + depth - 1
        lens = cache.lengths.clone()
        out, log = _logged(model, lambda: model.forward(toks[None, n + k:n + k + 1], lens.long()[:, None], cache,
                                                        lens, attn=attn))
        ar.append(out.logits[0, 0])
        ar_m.append({k2: v[0] for k2, v in log.items()})
        cache.lengths += 1
    cache, _, _ = prefilled()
    bits = torch.tensor([(1 << (j + 1)) - 1 for j in range(depth)], dtype=torch.int64, device=dev)
    pos = torch.arange(n, n + depth, device=dev)[None]
    out, ch_log = _logged(model, lambda: model.forward(toks[None, n:], pos, cache, cache.lengths.clone(),
                                                       bits.view(1, depth, 1), attn=attn))
    chain = out.logits[0]
    res = {"prefix_lens": list(range(n, n + depth + 1)), "prefill_vs_ar": [], "chain_vs_ar": [None],
           "prefill_margin_shift": [], "chain_margin_shift": [None]}
    for m, a in enumerate(ar):
        out, log = _logged(model, lambda: next_logits(model, toks[:n + m].tolist()))
        res["prefill_vs_ar"].append(float((out.double() - a.double()).abs().max()))
        res["prefill_margin_shift"].append(max((abs(float(v[n + m - 1] - ar_m[m][k])) for k, v in log.items()),
                                               default=None))
        if m:
            res["chain_vs_ar"].append(float((chain[m - 1].double() - a.double()).abs().max()))
            res["chain_margin_shift"].append(max((abs(float(v[m - 1] - ar_m[m][k])) for k, v in ch_log.items()),
                                                 default=None))
    return res


def main(out_dir: str, cpu_dry_run: bool) -> None:
    """cpu_dry_run: the code paths on the tiny preset in float32 (torch attention, grouped and loop dispatch)."""
    t0 = time.time()
    preset, dev, dtype, attn, dispatches = (("tiny", "cpu", torch.float32, "torch", ("grouped", "loop")) if cpu_dry_run
                                            else ("kimi-k2-slice-2", "cuda", torch.bfloat16, "cuda", DISPATCHES))
    base = target_from_preset(preset, 29, device=dev, dtype=dtype)
    report = {"init_s": time.time() - t0, "model": preset, "seed": 29, "dispatch": {}}
    with torch.no_grad():
        for d in dispatches:
            m = Transformer(base.cfg, base.w, attn=attn, moe_dispatch=d)
            rec = {"forward_vs_ar_alone": check_forward(m, ar_batches=(8,), verify_shapes=((8, 65),)),
                   "moe_layer": moe_layer_shift(m, d), "logits": logit_scale(m),
                   "three_paths_1024": three_paths(m, attn, n=64 if cpu_dry_run else 1024, depth=16)}
            report["dispatch"][d] = rec
            print(d, json.dumps(rec, indent=1), flush=True)
    report["total_s"] = time.time() - t0
    with open(f"{out_dir}/variance_probe.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], "--cpu-dry-run" in sys.argv[2:])
