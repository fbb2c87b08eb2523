"""`kdbench train`: the corpus token stream, the target, the drafter on the target's own outputs, then the
bf16 pair + meta + loss curves in one folder (copy the pair files to kdbench/data to ship them)."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from kdbench import corpus, pair, tokenizer
from kdbench.model.transformer import Transformer
from kdbench.references.model_config import get_preset
from kdbench.train_drafter import DrafterTrainConfig, make_sequences, train_drafter
from kdbench.train_target import TargetTrainConfig, train_target

# tiny: seconds on a CPU (tests, a dry run); full: the shipped pair (~4 minutes on one H200)
SIZES = {
    "tiny": (TargetTrainConfig(steps=3, batch=2, seq_len=64, log_every=1),
             DrafterTrainConfig(steps=3, batch=2, anchors=4, prompt_len=16, gen_len=24, n_seqs=4, gen_batch=4,
                                log_every=1)),
    "full": (TargetTrainConfig(), DrafterTrainConfig()),
}


def token_stream(docs, tok) -> np.ndarray:
    """The train split's documents, tokenized, each followed by <|endoftext|> (id 0), in manifest order."""
    texts = [d.text for d in docs if d.split == "train"]
    ids = [e.ids + [0] for e in tok.encode_batch(texts)]
    return np.concatenate([np.asarray(x, dtype=np.int32) for x in ids])


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(out: Path, corpus_path: Path, size: str = "full", seed: int = 0, device: str = "cpu",
        target_seconds: float = 0.0, drafter_seconds: float = 0.0, log=print) -> dict:
    """Train both models; write out/{pair files, loss_target.json, loss_drafter.json}; return the meta."""
    out = Path(out)
    t0 = time.perf_counter()
    docs = corpus.load(corpus_path)
    tok = tokenizer.load()
    stream = token_stream(docs, tok)
    log(f"corpus: {len(docs)} documents, {len(stream)} train tokens ({time.perf_counter() - t0:.1f} s)")
    ttc, dtc = SIZES[size]
    ttc, dtc = replace(ttc, seed=seed, max_seconds=target_seconds), replace(dtc, seed=seed, max_seconds=drafter_seconds)
    cfg = get_preset(pair.PRESET)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True   # float32 master weights, TF32 matmuls: training speed
        torch.backends.cudnn.allow_tf32 = True
    tw, tcurve = train_target(cfg, stream, ttc, device, log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_target.json").write_text(json.dumps(tcurve) + "\n")   # kept if the drafter stage dies
    target = Transformer(cfg, pair.bf16_round(tw))         # what ships, float32 compute
    seqs = make_sequences(target, stream, dtc, log)
    dc = pair.drafter_config()
    dw, dcurve = train_drafter(target, dc, seqs, dtc, log)
    meta = {"preset": pair.PRESET, "size": size, "seed": seed, "device": device,
            "train_tokens": int(len(stream)), "target_train": ttc.as_dict(), "drafter_train": dtc.as_dict(),
            "target_steps_done": tcurve[-1]["step"] + 1, "drafter_steps_done": dcurve[-1]["step"] + 1,
            "target_final_loss": tcurve[-1]["loss"], "drafter_final_loss": dcurve[-1]["loss"],
            "drafter_final_acc1": dcurve[-1]["acc1"], "tokenizer_sha256": _sha(tokenizer.TOKENIZER),
            "corpus_manifest_sha256": _sha(corpus.MANIFEST), "seconds": time.perf_counter() - t0,
            "torch": torch.__version__}
    pair.save(out, tw, dw, dc, meta)
    (out / "loss_drafter.json").write_text(json.dumps(dcurve) + "\n")
    log(f"saved the pair to {out} ({meta['seconds']:.0f} s)")
    return meta


def quick_accept(root: Path, device: str, n: int = 8, prompt_len: int = 128, new: int = 64, log=print) -> list[dict]:
    """tau of chain and ddtree (budgets 16, 64) on the pair in root, n held-out prompts per category, greedy;
    also whether greedy speculative output equals AR (the check a trained pair must pass)."""
    from kdbench.engine.engine import generate
    from kdbench.engine.stages import Policy
    from kdbench.prompts import token_prompts
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = pair.load_target(device, dtype, root=root)
    drafter = pair.load_drafter(target, root=root)
    target.set_taps(drafter.tap_layers)
    rows = []
    for cat in corpus.CATEGORIES:
        ps = token_prompts(cat, n, prompt_len)
        ar = generate(target, None, ps, new, Policy(kind="ar"), backend="torch")
        for pol in (Policy(kind="chain", budget=15), Policy(kind="ddtree", budget=16), Policy(kind="ddtree", budget=64)):
            res = generate(target, drafter, ps, new, pol, backend="torch")
            taus = [t for st in res.steps for t in st.tau if t > 0]
            rows.append({"category": cat, "policy": pol.label, "tau": float(np.mean(taus)),
                         "same_as_ar": res.tokens == ar.tokens})
            log(f"quick accept {cat:10s} {pol.label:12s} tau {rows[-1]['tau']:.2f} same_as_ar {rows[-1]['same_as_ar']}")
    return rows
