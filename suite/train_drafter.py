"""Train the pair's DFlash-style block drafter (shared/notes/dflash.md §3) on the target's own outputs:
prompts from the corpus continued by the trained target (greedy, some sampled), the target's tapped residual
streams as context features, random anchors, one non-causal pass over every [x_p, MASK x L] block, and the
same-position cross entropy weighted exp(-(k-1)/gamma). The target (embed, lm_head included) stays frozen.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kdbench.engine.engine import generate
from kdbench.engine.stages import Policy
from kdbench.model.drafter import BlockDrafter, DrafterConfig, init_drafter_weights
from kdbench.model.mla import rms_norm, rope_interleaved
from kdbench.model.moe import swiglu
from kdbench.model.transformer import Transformer
from kdbench.train_target import fit_steps, lr_at, sample_windows


@dataclass(frozen=True)
class DrafterTrainConfig:
    seed: int = 0
    steps: int = 3000
    batch: int = 32
    anchors: int = 32             # blocks per sequence per step
    prompt_len: int = 64          # corpus tokens before the target's continuation
    gen_len: int = 192            # continuation tokens the target generates per sequence
    n_seqs: int = 3072            # sequences generated once, before training
    sampled_frac: float = 0.25    # share of them sampled at temperature 1 (the rest greedy)
    gen_batch: int = 512
    gamma: float = 7.0            # loss decay over depth, B = 16 (SpecForge's default)
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50        # fixed in steps, so a time-capped run's first steps equal a fixed-step run's
    clip: float = 1.0
    max_seconds: float = 0.0      # as TargetTrainConfig.max_seconds
    log_every: int = 10

    def as_dict(self) -> dict:
        return asdict(self)


def make_sequences(model: Transformer, stream: np.ndarray, tc: DrafterTrainConfig, log=print) -> torch.Tensor:
    """[n_seqs, prompt_len + gen_len] int64: corpus prompts + the target's AR continuations (engine generate)."""
    rng = np.random.default_rng(tc.seed + 1)
    prompts = sample_windows(stream, tc.n_seqs, tc.prompt_len, rng)
    n_sampled = int(round(tc.sampled_frac * tc.n_seqs))
    out = []
    for i in range(0, tc.n_seqs, tc.gen_batch):
        chunk = [list(map(int, p)) for p in prompts[i:i + tc.gen_batch]]
        temp = 1.0 if i >= tc.n_seqs - n_sampled else 0.0
        res = generate(model, None, chunk, tc.gen_len, Policy(kind="ar"), temp, tc.seed + i, "torch")
        out.extend(p + t for p, t in zip(chunk, res.tokens))
        log(f"drafter data: {len(out)}/{tc.n_seqs} sequences (T={temp})")
    return torch.tensor(out, dtype=torch.int64, device=model.device)


def target_taps(model: Transformer, tokens: torch.Tensor, tap_layers) -> torch.Tensor:
    """[B, S, n_taps * d] residual streams after the tap layers, teacher-forced over tokens [B, S]."""
    B, S = tokens.shape
    zero = torch.zeros(B, dtype=torch.int32, device=tokens.device)
    pos = torch.arange(S, device=tokens.device)[None].expand(B, S)
    with torch.no_grad():
        return model.forward(tokens, pos, model.new_cache(B, S), zero, logit_rows=zero,
                             tap_layers=tuple(tap_layers), attn="torch").taps


def block_logits(dr: BlockDrafter, feats: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """The training form of BlockDrafter.draft: feats [B, S, n_taps*d], tokens [B, S], anchors [B, N] ->
    logits [B, N, L, V]. Block j = [tokens[p_j], MASK x L] at positions p_j..p_j+L sees context rows < p_j
    and its own rows (non-causal), never another block."""
    dc, w = dr.dc, dr.w
    B, S, _ = feats.shape
    N, T = anchors.shape[1], dc.block_size
    dev = tokens.device
    c = rms_norm(feats.to(dr.dtype) @ w["fc"].T, w["hidden_norm"], dc.rms_eps)     # [B, S, d]
    ctx_pos = torch.arange(S, device=dev)[None].expand(B, S)
    blk = torch.full((B, N, T), dc.mask_id, dtype=torch.int64, device=dev)
    blk[..., 0] = tokens.gather(1, anchors)
    pos = (anchors[..., None] + torch.arange(T, device=dev)).flatten(1)             # [B, N*T]
    ctx_vis = (torch.arange(S, device=dev)[None, None] < anchors[..., None]).repeat_interleave(T, 1)  # [B, N*T, S]
    bid = torch.arange(N, device=dev).repeat_interleave(T)
    visible = torch.cat((ctx_vis, (bid[:, None] == bid[None]).expand(B, -1, -1)), dim=2)  # [B, N*T, S + N*T]
    x = dr.embed[blk.flatten(1)]                                                    # [B, N*T, d]
    group = dc.n_heads // dc.n_kv_heads
    for i in range(dc.n_layers):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "attn_norm"], dc.rms_eps)
        q = (h @ w[p + "wq"].T).unflatten(-1, (dc.n_heads, dc.head_dim))
        q = rope_interleaved(rms_norm(q, w[p + "q_norm"], dc.rms_eps), pos, dr.freqs)
        kc, vc = dr._kv(i, c, ctx_pos)
        kb, vb = dr._kv(i, h, pos)
        k = torch.cat((kc, kb), 1).repeat_interleave(group, dim=2)
        v = torch.cat((vc, vb), 1).repeat_interleave(group, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=visible[:, None], scale=dc.head_dim ** -0.5)
        x = x + o.transpose(1, 2).flatten(2) @ w[p + "wo"].T
        x = x + swiglu(rms_norm(x, w[p + "ffn_norm"], dc.rms_eps), w[p + "mlp.w1"], w[p + "mlp.w2"], w[p + "mlp.w3"])
    logits = rms_norm(x, w["norm"], dc.rms_eps) @ dr.lm_head.T
    return logits.view(B, N, T, -1)[:, :, 1:]


def drafter_loss(dr, feats, tokens, anchors, first_label: int, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted CE, argmax accuracy at depth 1). Row k of block j is labelled tokens[p_j + k] (same position),
    weighted exp(-(k-1)/gamma); labels before first_label (the prompt) or past the sequence get weight 0."""
    S, L = tokens.shape[1], dr.dc.depth
    logits = block_logits(dr, feats, tokens, anchors).float()                      # [B, N, L, V]
    lab_pos = anchors[..., None] + torch.arange(1, L + 1, device=tokens.device)    # [B, N, L]
    ok = (lab_pos < S) & (lab_pos >= first_label)
    labels = tokens.gather(1, lab_pos.clamp(max=S - 1).flatten(1)).view_as(lab_pos)
    decay = torch.exp(-torch.arange(L, device=tokens.device, dtype=torch.float32) / gamma)
    wgt = ok.float() * decay
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(wgt)
    acc1 = ((logits[..., 0, :].argmax(-1) == labels[..., 0]).float() * ok[..., 0]).sum() / ok[..., 0].sum().clamp(min=1)
    return (ce * wgt).sum() / wgt.sum().clamp(min=1e-9), acc1


def train_drafter(target: Transformer, dc: DrafterConfig, seqs: torch.Tensor, tc: DrafterTrainConfig, log=print
                  ) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """-> (float32 drafter weights, loss curve rows {step, loss, acc1, lr, seconds})."""
    torch.manual_seed(tc.seed)
    w = init_drafter_weights(dc, tc.seed, target.device, torch.float32)
    for t in w.values():
        t.requires_grad_(True)
    dr = BlockDrafter(dc, target, w)
    opt = torch.optim.AdamW(list(w.values()), lr=tc.lr, weight_decay=0.0)
    rng = np.random.default_rng(tc.seed + 2)
    S, curve, t0 = seqs.shape[1], [], time.perf_counter()
    steps, step, marks = tc.steps, 0, {}
    while step < steps:
        steps = fit_steps(step, steps, tc.max_seconds, time.perf_counter() - t0, marks, log)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, tc.lr, tc.warmup_steps, tc.min_lr_frac)
        rows = torch.from_numpy(rng.integers(0, len(seqs), size=tc.batch)).to(seqs.device)
        tokens = seqs[rows]
        anchors = np.sort(rng.integers(tc.prompt_len - 1, S - 1, size=(tc.batch, tc.anchors)), axis=1)
        feats = target_taps(target, tokens, dc.tap_layers)
        loss, acc1 = drafter_loss(dr, feats, tokens, torch.from_numpy(anchors).to(seqs.device), tc.prompt_len, tc.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), tc.clip)
        opt.step()
        if step % tc.log_every == 0 or step == steps - 1:
            row = {"step": step, "loss": float(loss.detach()), "acc1": float(acc1), "lr": opt.param_groups[0]["lr"],
                   "seconds": time.perf_counter() - t0}
            curve.append(row)
            log(f"drafter step {step} loss {row['loss']:.4f} acc1 {row['acc1']:.3f}")
        step += 1
    return {k: t.detach() for k, t in w.items()}, curve
