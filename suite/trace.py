"""Acceptance traces (plans/0009-traces-replay.md): per prompt, the target's greedy continuation and the
drafter's top-K log-probs for a round starting at every generated position, stored as one KDTR file.

At T = 0 the committed tokens are the target's greedy continuation whatever the tree policy, and the
drafter's output at a round depends only on the committed context and the bonus token, so one trace
replays every policy and budget exactly (suite/replay.py). Any drafter with the engine's protocol
(reset / begin / draft / commit, tap_layers, depth) can be traced, provided its draft is a function of the
context (KeyedSyntheticDrafter, BlockDrafter; not SyntheticDrafter, whose noise follows its call count).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from kdbench import kdtr
from kdbench.backends.torch_ops import topk_logprobs
from kdbench.engine import engine as eng
from kdbench.engine.stages import Policy
from kdbench.model.keyed import KeyedSyntheticDrafter

FORMAT = "kdbench-trace/1"
HASH_FULL_BYTES = 256 << 20   # weights up to this size are hashed whole; larger ones by a strided sample


@dataclass(frozen=True, eq=False)
class Trace:
    """P prompts, R rounds each, drafter depth L, top-K width K. Round j of prompt p has the bonus token
    continuation[p, j] at committed length len(prompt) + j; its drafts are top_tok[p, j] ([L, K], rank
    order) with full-vocabulary log-probs top_lp[p, j] (float32, exactly what the engine's tree build
    reads). continuation has R + L + 1 tokens: enough for a round at j = R - 1 to accept L drafts and name
    its bonus. Replaying max_new_tokens = R + 1 equals a live generate() of that length."""
    prompts: tuple[tuple[int, ...], ...]
    categories: tuple[str, ...]
    continuation: np.ndarray   # [P, R + L + 1] int64
    top_lp: np.ndarray         # [P, R, L, K] float32
    top_tok: np.ndarray        # [P, R, L, K] int32
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        P, R, L, K = self.top_lp.shape
        if self.top_tok.shape != (P, R, L, K):
            raise ValueError(f"top_tok shape {self.top_tok.shape} != top_lp shape {self.top_lp.shape}")
        if self.continuation.shape != (P, R + L + 1):
            raise ValueError(f"continuation shape {self.continuation.shape}, expected ({P}, {R + L + 1})")
        if len(self.prompts) != P or len(self.categories) != P:
            raise ValueError(f"{len(self.prompts)} prompts and {len(self.categories)} categories for {P} rows")

    @property
    def n_prompts(self) -> int:
        return self.top_lp.shape[0]

    @property
    def rounds(self) -> int:
        return self.top_lp.shape[1]

    @property
    def depth(self) -> int:
        return self.top_lp.shape[2]

    @property
    def k(self) -> int:
        return self.top_lp.shape[3]


# --------------------------------------------------------------------------------------------- record

DrafterFor = Callable[[int, int], object]   # (first, last) -> the drafter for prompts[first:last]


def record(model, prompts: list[list[int]], rounds: int, k: int, drafter_for: DrafterFor, *, batch: int = 8,
           backend: str = "torch", categories: list[str] | None = None, meta: dict | None = None) -> Trace:
    """Decode rounds + L + 1 greedy tokens per prompt with the engine's prefill and AR forward (taps on), and
    before each of the first `rounds` steps run the drafter on the committed context: its top-k log-probs
    (torch_ops.topk_logprobs, the engine's own) are round j's. Prompts go in batches of `batch`."""
    if rounds < 1 or k < 1:
        raise ValueError(f"rounds and k must be >= 1, got {rounds}, {k}")
    parts = []
    for first in range(0, len(prompts), batch):
        chunk = prompts[first:first + batch]
        parts.append(_record_batch(model, chunk, rounds, k, drafter_for(first, first + len(chunk)), backend))
    drafter = drafter_for(0, min(batch, len(prompts)))
    info = {"format": FORMAT, "model": model.cfg.name, "model_dtype": str(model.dtype).replace("torch.", ""),
            "weights_sha256": weights_hash(model.w), "drafter": getattr(drafter, "name", type(drafter).__name__),
            "drafter_weights_sha256": weights_hash(drafter.w) if hasattr(drafter, "w") else "",
            "prompts_sha256": prompts_hash(prompts), "backend": backend, "device": str(model.device),
            "temperature": 0.0, "k": k, "depth": drafter.depth, "rounds": rounds, "vocab_size": model.cfg.vocab_size,
            **(meta or {})}
    cats = tuple(categories) if categories is not None else ("all",) * len(prompts)
    return Trace(tuple(tuple(int(t) for t in p) for p in prompts), cats,
                 np.concatenate([c for c, _, _ in parts]), np.concatenate([lp for _, lp, _ in parts]),
                 np.concatenate([tok for _, _, tok in parts]), info)


def _record_batch(model, prompts, rounds: int, k: int, drafter, backend: str):
    L = drafter.depth
    G = rounds + L + 1
    run, st = eng.prepare(eng.Request(model, drafter, prompts, G, Policy("chain", budget=L), 0.0, 0, backend))
    lps, toks, ones = [], [], torch.ones(len(prompts), dtype=torch.int32, device=model.device)
    for j in range(G - 1):
        lens = st.cache.lengths
        kv_limit = eng.bucketed_kv_limit(run, int(lens.max()) + run.rows)
        if j < rounds:
            lp, tok = topk_logprobs(drafter.draft(st.bonus, lens, kv_limit), k)
            lps.append(lp.cpu().numpy())
            toks.append(tok.to(torch.int32).cpu().numpy())
        out = model.forward(st.bonus[:, None], lens.to(torch.int64)[:, None], st.cache, lens, kv_limit=kv_limit,
                            attn=run.stages.attn, tap_layers=drafter.tap_layers)
        nxt = out.logits[:, 0].argmax(dim=-1)
        if out.taps is not None:
            drafter.commit(out.taps, ones)
        st.advance(nxt[:, None], ones, nxt)
    cont = st.gen[:, :G].cpu().numpy().astype(np.int64)
    return cont, np.stack(lps, axis=1), np.stack(toks, axis=1)


def weights_hash(w: dict[str, torch.Tensor]) -> str:
    """sha256 over names, shapes, dtypes and bytes; above HASH_FULL_BYTES in all, 64 KiB from each of 16
    evenly spaced places per tensor (prefixed 'sampled:', so the two kinds never compare equal)."""
    total = sum(t.numel() * t.element_size() for t in w.values())
    sampled = total > HASH_FULL_BYTES
    h = hashlib.sha256()
    for name in sorted(w):
        t = w[name].detach().contiguous().view(-1)
        h.update(f"{name}:{tuple(w[name].shape)}:{t.dtype};".encode())
        raw = t.view(torch.uint8) if t.numel() else t
        if sampled and raw.numel() > 16 * 65536:
            starts = np.linspace(0, raw.numel() - 65536, 16).astype(np.int64)
            raw = torch.cat([raw[int(s):int(s) + 65536] for s in starts])
        h.update(raw.cpu().numpy().tobytes())
    return ("sampled:" if sampled else "") + h.hexdigest()


def prompts_hash(prompts) -> str:
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompts]).encode()).hexdigest()


def synthetic(n_prompts: int, rounds: int, k: int, *, vocab: int = 4096, depth: int = 15, quality: float = 0.8,
              rank_probs: tuple[float, ...] = (1.0,), seed: int = 0, category: str = "all", device="cpu") -> Trace:
    """A trace of the KeyedSyntheticDrafter over random continuations, without a target: its acceptance
    depends only on where it ranks the continuation's tokens, not on what they are (vocab only sets the
    noise; 4096 keeps it fast). Labelled synthetic in its metadata."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, 8).tolist() for _ in range(n_prompts)]
    cont = rng.integers(0, vocab, (n_prompts, rounds + depth + 1))
    d = KeyedSyntheticDrafter([p + c.tolist() for p, c in zip(prompts, cont)], vocab, depth, quality, rank_probs,
                              seed=seed, device=device)
    d.reset(n_prompts, len(prompts[0]) + cont.shape[1])
    lps, toks = [], []
    for j in range(rounds):
        bonus, start = torch.from_numpy(cont[:, j]).to(device), torch.full((n_prompts,), 8 + j, device=device)
        lp, tok = topk_logprobs(d.draft(bonus, start, 0), k)
        lps.append(lp.cpu().numpy())
        toks.append(tok.to(torch.int32).cpu().numpy())
    meta = {"format": FORMAT, "model": "none (synthetic continuation)", "drafter": d.name, "seed": seed, "k": k,
            "depth": depth, "rounds": rounds, "vocab_size": vocab, "temperature": 0.0}
    return Trace(tuple(tuple(p) for p in prompts), (category,) * n_prompts, cont.astype(np.int64),
                 np.stack(lps, axis=1), np.stack(toks, axis=1), meta)


def concat(traces: list[Trace]) -> Trace:
    """Prompts of several traces (same rounds, depth and K) in one; metadata of the first, drafters listed."""
    first = traces[0]
    meta = {**first.meta, "drafter": " + ".join(sorted({t.meta.get("drafter", "") for t in traces}))}
    return Trace(sum((t.prompts for t in traces), ()), sum((t.categories for t in traces), ()),
                 np.concatenate([t.continuation for t in traces]), np.concatenate([t.top_lp for t in traces]),
                 np.concatenate([t.top_tok for t in traces]), meta)


# ------------------------------------------------------------------------------------------- KDTR I/O

def save(path, trace: Trace) -> None:
    """One KDTR file (plans/0009 lists the tensors); metadata and categories ride as UTF-8 JSON bytes."""
    flat = np.array([t for p in trace.prompts for t in p], dtype=np.int64)
    offsets = np.cumsum([0] + [len(p) for p in trace.prompts]).astype(np.int64)
    meta = json.dumps({**trace.meta, "categories": list(trace.categories)}, sort_keys=True).encode()
    kdtr.save(path, {"prompt_tokens": flat, "prompt_offsets": offsets, "continuation": trace.continuation,
                     "top_lp": trace.top_lp.astype(np.float32), "top_tok": trace.top_tok.astype(np.int32),
                     "meta_json": np.frombuffer(meta, dtype=np.uint8)})


def load(path) -> Trace:
    """A trace from save(); KdtrError on a malformed file, ValueError naming a missing tensor."""
    t = kdtr.load(path, mmap=False)
    missing = [n for n in ("prompt_tokens", "prompt_offsets", "continuation", "top_lp", "top_tok", "meta_json")
               if n not in t]
    if missing:
        raise ValueError(f"{path}: not a kdbench trace (missing tensors {', '.join(missing)})")
    meta = json.loads(bytes(t["meta_json"]).decode())
    cats = tuple(meta.pop("categories", ()))
    off = t["prompt_offsets"]
    prompts = tuple(tuple(int(x) for x in t["prompt_tokens"][off[i]:off[i + 1]]) for i in range(len(off) - 1))
    return Trace(prompts, cats or ("all",) * len(prompts), t["continuation"].astype(np.int64),
                 t["top_lp"], t["top_tok"], meta)


def from_jsonl(path) -> Trace:
    """The example converter from another engine's per-round top-K lists (plans/0009 §JSONL). Line 1 may be
    {"meta": {...}}; every other line is one prompt: {"prompt": [ids], "category": str (optional),
    "continuation": [ids, R + L + 1 of them], "rounds": [{"tokens": [[K ids] x L], "logprobs": [[K] x L]}
    x R]}, round j's bonus being continuation[j]. Ranks must be sorted by log-prob, descending."""
    rows, meta = [], {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if "meta" in obj and len(rows) == 0 and "prompt" not in obj:
                meta = dict(obj["meta"])
                continue
            for key in ("prompt", "continuation", "rounds"):
                if key not in obj:
                    raise ValueError(f"{path}: line {n}: missing key {key!r}")
            rows.append(obj)
    if not rows:
        raise ValueError(f"{path}: no prompt lines")
    lp = np.array([[r["logprobs"] for r in o["rounds"]] for o in rows], dtype=np.float32)
    tok = np.array([[r["tokens"] for r in o["rounds"]] for o in rows], dtype=np.int32)
    if lp.ndim != 4 or tok.shape != lp.shape:
        raise ValueError(f"{path}: every prompt needs the same rounds R, depth L and width K "
                         f"(got logprobs {lp.shape}, tokens {tok.shape})")
    if np.any(np.diff(lp, axis=-1) > 0):
        raise ValueError(f"{path}: logprobs must be sorted descending within each depth")
    return Trace(tuple(tuple(int(x) for x in o["prompt"]) for o in rows),
                 tuple(str(o.get("category", "all")) for o in rows),
                 np.array([o["continuation"] for o in rows], dtype=np.int64), lp, tok,
                 {"format": FORMAT, "converted_from": str(path), "k": lp.shape[-1], "depth": lp.shape[2],
                  "rounds": lp.shape[1], **meta})
