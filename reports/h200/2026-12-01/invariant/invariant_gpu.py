"""H200 check of the batch-invariant mode on kimi-k2-slice-2 (bf16): the whole-forward invariance check
(suite/model/invariant_check.py) and the cost, default vs invariant, per op and per forward at AR batch 8
(M = 8) and verify batch 8 x 65 rows (M = 520). Writes OUT/invariant_gpu.json. Usage: python3 THIS OUT_DIR."""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from kdbench.engine.engine import target_from_preset
from kdbench.model import invariant as inv
from kdbench.model import moe as tmoe
from kdbench.model.invariant_check import check_forward
from kdbench.model.mla import attention_absorbed, visible_mask
from kdbench.model.transformer import Transformer


def cuda_ms(fn, warmup=2, repeat=10) -> float:
    """Median ms of fn() over `repeat` runs, CUDA events, after `warmup` runs (no L2 flush: steady decoding)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def op_costs(inv_model: Transformer, base: Transformer) -> dict:
    w, cfg, dev = inv_model.w, inv_model.cfg, "cuda"
    g = torch.Generator(device=dev).manual_seed(3)
    out = {}
    for M in (8, 520):
        x = torch.randn(M, cfg.hidden, device=dev, generator=g).bfloat16()
        q = torch.randn(M, cfg.q_lora_rank, device=dev, generator=g).bfloat16()
        row = {"lm_head": (lambda: x @ w["lm_head"].T, lambda: inv.linear(x, w["lm_head"])),
               "wq_b": (lambda: q @ w["layers.0.wq_b"].T, lambda: inv.linear(q, w["layers.0.wq_b"])),
               "rms_norm": (lambda: base.ops.rms_norm(x, w["norm"], cfg.rms_eps),
                            lambda: inv.rms_norm(x, w["norm"], cfg.rms_eps)),
               "moe_layer": (lambda: tmoe.moe_forward(w, cfg, 1, x),
                             lambda: tmoe.moe_forward(w, cfg, 1, x, "auto", True))}
        B, T = (8, 1) if M == 8 else (8, 65)
        row["attention"] = _attention_pair(cfg, B, T, g)
        out[M] = {k: {"default_ms": cuda_ms(a), "invariant_ms": cuda_ms(b)} for k, (a, b) in row.items()}
    return out


def _attention_pair(cfg, B, T, g):
    """Absorbed attention of one layer at a 192-row context: the torch eager form vs the invariant kernel."""
    dev, H, dc, dr, S = "cuda", cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_dim, 192 + T
    kv = torch.randn(B, S, dc + dr, device=dev, generator=g).bfloat16()
    ql = torch.randn(B, T, H, dc, device=dev, generator=g).bfloat16()
    qp = torch.randn(B, T, H, dr, device=dev, generator=g).bfloat16()
    past = torch.full((B,), 192, dtype=torch.int32, device=dev)
    bits = (1 << torch.arange(T, device=dev)).cumsum(0) if T <= 62 else None
    anc = (torch.ones(B, 1, 1, dtype=torch.int64, device=dev) if T == 1 else
           _chain_anc(B, T, dev) if bits is None else bits.view(1, T, 1).expand(B, T, 1).contiguous())
    vis = visible_mask(past, T, S, anc)
    return (lambda: attention_absorbed(ql, qp, kv, vis, cfg.softmax_scale, dc),
            lambda: inv.attention(ql, qp, kv, past, anc, cfg.softmax_scale))


def _chain_anc(B, T, dev):
    W = (T + 63) // 64
    anc = torch.zeros(B, T, W, dtype=torch.int64)
    for t in range(T):
        for j in range(t + 1):
            anc[:, t, j // 64] |= (1 << (j % 64)) if j % 64 < 63 else -(1 << 63)
    return anc.to(dev)


def forward_costs(model: Transformer) -> dict:
    """AR step forward (B 8, T 1) and verify forward (B 8, T 65, random chains) at 192 committed rows."""
    dev, cfg = "cuda", model.cfg
    res = {}
    for B, T in ((8, 1), (8, 65)):
        cache = model.new_cache(B, 192 + T + 1)
        cache.kv.normal_()
        lens = torch.full((B,), 192, dtype=torch.int32, device=dev)
        tok = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
        pos = lens.long()[:, None] + torch.arange(T, device=dev)
        anc = None if T == 1 else _chain_anc(B, T, dev)
        res[f"forward_B{B}_T{T}"] = cuda_ms(lambda: model.forward(tok, pos, cache, lens, anc, kv_limit=192 + T + 1))
    return res


def main(out_dir: str) -> None:
    t0 = time.time()
    model = target_from_preset("kimi-k2-slice-2", 29, device="cuda", dtype=torch.bfloat16, batch_invariant=True)
    base = Transformer(model.cfg, model.w)          # the same weights, default kernels
    report = {"init_s": time.time() - t0}
    with torch.no_grad():
        report["forward_invariance_failures"] = check_forward(model, ar_batches=(7, 64, 520),
                                                             verify_shapes=((1, 65), (8, 65), (64, 65)))
        report["default_forward_failures"] = check_forward(base, ar_batches=(64,), verify_shapes=((8, 65),))
        print("forward invariance failures:", report["forward_invariance_failures"], flush=True)
        print("default mode (expected to differ):", report["default_forward_failures"], flush=True)
        report["ops_ms"] = op_costs(model, base)
        report["forward_ms"] = {"invariant": forward_costs(model), "default": forward_costs(base)}
    report["total_s"] = time.time() - t0
    print(json.dumps(report, indent=1))
    with open(f"{out_dir}/invariant_gpu.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
