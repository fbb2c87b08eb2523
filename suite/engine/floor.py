"""The target's forward (AR decode: T = 1; tree verify: T rows) timed whole and per stage (attention, dense MLP,
MoE, lm_head, others), as a CUDA graph or eagerly, beside its floor per stage: max(bytes / measured copy
bandwidth, FLOPs / measured bf16 matmul rate) (kdbench.timing.ceilings). Formulas: plans/0003-engine.md,
"Forward floors"."""
from __future__ import annotations

from collections.abc import Callable

import torch

from kdbench.backends.chain_device import chain_anc
from kdbench.model.moe import route
from kdbench.timing import ceilings, floor_seconds, measure, pct_of_floor_rate

from .graph import GraphUnavailable

STAGES = ("attention", "dense_mlp", "moe", "lm_head", "others")
MODES = ("graph", "eager")
REPS = 20                      # timed replays (or eager calls) per piece, after 2 untimed
_FFN = (".mlp.", ".gate", ".experts.", ".shared.", ".ffn_norm")   # a layer's weights that are not attention


def forward_floor(model, batch: int, rows: int, past: int, mode: str = "graph", *, attn: str | None = None,
                  seed: int = 0, reps: int = REPS) -> dict:
    """Time one forward of `rows` new rows per request over `past` committed keys (rows 1: AR decode; rows > 1:
    a chain-shaped tree, whose verify cost equals a branching tree's, plans/0004) and each of its blocks, in
    `mode` ("graph": every piece and the whole forward captured and replayed; "eager"). Random tokens and a
    random cache (never zeros). Returns seconds, floors and % of floor, whole and per stage; others = whole -
    sum of the blocks (embedding, residual adds, launch gaps). Raises ValueError for a bad mode and
    GraphUnavailable for graph mode without a CUDA model. attn: the attention backend (None: "cuda" where the
    kernel can run, a bf16 model on a GPU with the 512 + 64 latent, else "torch"; a batch-invariant model always
    runs its own)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "graph" and torch.device(model.device).type != "cuda":
        raise GraphUnavailable(f"graph mode needs the model on a CUDA device, got {model.device}")
    if min(batch, rows, past) < 1:
        raise ValueError(f"batch, rows and past must be >= 1, got {batch}, {rows}, {past}")
    dev = str(model.device)
    args = _inputs(model, batch, rows, past, seed)
    attn = attn or default_attention(model)
    with torch.no_grad():
        fc = model.forward_context(*args, attn=attn)
        pieces = _pieces(model, fc, args[0])
        whole = _seconds(lambda: model.forward(*args, attn=attn, tap_layers=()).logits, mode, dev, reps)
        timed = [(stage, _seconds(fn, mode, dev, reps), _cost(model, stage, layer, x, batch, rows, past))
                 for stage, layer, fn, x in pieces]
    return _summary(model, timed, whole, mode, dict(batch=batch, rows=rows, past=past, attention=fc.attn), dev)


def default_attention(model) -> str:
    cuda_ok = (model.cfg.kv_lora_rank, model.cfg.qk_rope_dim) == (512, 64) and model.dtype == torch.bfloat16
    return "cuda" if torch.device(model.device).type == "cuda" and cuda_ok else "torch"


def _inputs(model, batch: int, rows: int, past: int, seed: int):
    """(tokens, positions, cache, past_lens, anc): a random latent cache of past + rows rows per request."""
    dev, cfg = model.device, model.cfg
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(batch, past + rows)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen, device=dev, dtype=torch.float32) * 0.5)
    cache.lengths.fill_(past)
    tokens = torch.randint(0, cfg.vocab_size, (batch, rows), generator=gen, device=dev)
    t = torch.arange(rows, device=dev)
    positions = (past + t).expand(batch, rows).contiguous()
    anc = chain_anc(rows, batch, dev) if rows > 1 else None
    return tokens, positions, cache, cache.lengths, anc


def _pieces(model, fc, tokens) -> list[tuple[str, int, Callable, torch.Tensor]]:
    """(stage, layer, fn, its input): the blocks of one forward in order, each input the previous output."""
    out, h = [], model.w["embed"][tokens]
    for i in range(model.cfg.n_layers):
        x = h.clone()
        out.append(("attention", i, lambda x=x, i=i: model.attention_block(i, x, fc), x))
        h = model.attention_block(i, h, fc)
        x = h.clone()
        out.append(("moe" if model.cfg.is_moe_layer(i) else "dense_mlp", i, lambda x=x, i=i: model.ffn_block(i, x), x))
        h = model.ffn_block(i, h)
    out.append(("lm_head", -1, lambda x=h: model.head(x), h))
    return out


def _seconds(fn: Callable, mode: str, dev: str, reps: int) -> float:
    """Median seconds of fn (graph: of the replay of its capture). CUDA events, warm caches (steady decode)."""
    call = _graph_of(fn) if mode == "graph" else fn
    return measure(call, warmup=2, repeat=reps, device=dev, flush_l2=False, shield=False).median_s


def _graph_of(fn: Callable) -> Callable:
    """Capture fn on a side stream after two eager calls there (lazy init must not happen while capturing)."""
    stream, current = torch.cuda.Stream(), torch.cuda.current_stream()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    current.wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    return g.replay


def _nbytes(model, names) -> int:
    return sum(model.w[n].numel() * model.w[n].element_size() for n in names)


def _matrix_params(model, names) -> int:
    return sum(model.w[n].numel() for n in names if model.w[n].dim() >= 2)


def _cost(model, stage: str, layer: int, x: torch.Tensor, batch: int, rows: int, past: int) -> dict:
    """Bytes the block must move at least (weights once, the KV prefix once, activations in and out) and its
    FLOPs (2 per multiply-add). MoE: the routed experts these rows touch (their routing, computed here)."""
    cfg, w, es = model.cfg, model.w, model.dtype.itemsize
    R, d = batch * rows, cfg.hidden
    act = 2 * R * d * es
    if stage == "lm_head":
        logit = 4 if es == 2 else es   # half models: the GEMM writes float32 logits once (plans/0017)
        return dict(bytes=_nbytes(model, ("norm", "lm_head")) + R * d * es + R * cfg.vocab_size * logit,
                    flops=2 * R * cfg.vocab_size * d)
    p = f"layers.{layer}."
    mine = [n for n in w if n.startswith(p)]
    if stage == "attention":
        names = [n for n in mine if not any(f in n[len(p) - 1:] for f in _FFN)]
        keys = past + rows
        kv = batch * keys * cfg.kv_dim * es + batch * rows * cfg.kv_dim * es    # prefix read once, rows written
        core = 2 * R * cfg.n_heads * keys * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim)   # scores + values
        return dict(bytes=_nbytes(model, names) + kv + act, flops=2 * R * _matrix_params(model, names) + core)
    if stage == "dense_mlp":
        names = [n for n in mine if ".mlp." in n or n.endswith("ffn_norm")]
        return dict(bytes=_nbytes(model, names) + act, flops=2 * R * _matrix_params(model, names))
    xn = model.ops.rms_norm(x, w[p + "ffn_norm"], cfg.rms_eps).reshape(R, d)
    idx, _ = route(xn, w[p + "gate"], w[p + "gate_bias"], cfg, model.batch_invariant)
    touched = int(torch.unique(idx).numel())
    per_expert = sum(w[p + f"experts.{m}"][0].numel() * es for m in ("w1", "w2", "w3"))
    dense = [n for n in mine if ".shared." in n or n.endswith(("gate", "gate_bias", "ffn_norm"))]
    expert_flops = 2 * R * cfg.n_experts_per_tok * per_expert // es
    return dict(bytes=_nbytes(model, dense) + touched * per_expert + act,
                flops=2 * R * _matrix_params(model, dense) + expert_flops, experts=touched)


def _summary(model, timed, whole: float, mode: str, shape: dict, dev: str) -> dict:
    c = ceilings(dev)
    stages = {s: dict(time_s=0.0, bytes=0, flops=0) for s in STAGES}
    experts = []
    for stage, t, cost in timed:
        stages[stage]["time_s"] += t
        stages[stage]["bytes"] += cost["bytes"]
        stages[stage]["flops"] += cost["flops"]
        if "experts" in cost:
            experts.append(cost["experts"])
    B, T = shape["batch"], shape["rows"]
    stages["others"].update(time_s=whole - sum(t for _, t, _ in timed), bytes=2 * B * T * model.cfg.hidden * model.dtype.itemsize)
    for v in stages.values():
        v["mem_floor_s"] = v["bytes"] / c.copy_bytes_per_s
        v["floor_s"] = floor_seconds(v["bytes"], v["flops"], c)
        v["pct_of_floor"] = pct_of_floor_rate(v["floor_s"], v["time_s"])
    floor = sum(v["floor_s"] for v in stages.values())
    mem = sum(v["mem_floor_s"] for v in stages.values())
    return dict(mode=mode, **shape, time_s=whole, floor_s=floor, mem_floor_s=mem, pct_of_floor=100.0 * floor / whole,
                pct_of_mem_floor=100.0 * mem / whole, stages=stages, experts_touched=experts,
                copy_bytes_per_s=c.copy_bytes_per_s, bf16_flops_per_s=c.bf16_flops_per_s, ceilings=c.source)
