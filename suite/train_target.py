"""Train the pair's MLA+MoE target with the engine's own Transformer.forward (prefill form): next-token cross
entropy, AdamW + cosine, and DeepSeek-V3's aux-loss-free router bias update (bias += speed * sign(mean load
- load) per expert after each step; the bias gets no gradient). Deterministic from the seed on CPU.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kdbench.model.transformer import Transformer
from kdbench.model.weights import init_weights
from kdbench.references.model_config import ModelConfig


@dataclass(frozen=True)
class TargetTrainConfig:
    seed: int = 0
    steps: int = 3000
    batch: int = 32
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50        # fixed in steps, so a time-capped run's first steps equal a fixed-step run's
    weight_decay: float = 0.1     # matrices only (not norms, embed, router bias)
    clip: float = 1.0
    bias_speed: float = 1e-3      # DeepSeek-V3's gamma for the router bias
    max_seconds: float = 0.0      # > 0: after 10 steps, cut `steps` to fit this wall time (recorded)
    log_every: int = 10

    def as_dict(self) -> dict:
        return asdict(self)


def lr_at(step: int, steps: int, lr: float, warmup_steps: int, min_lr_frac: float) -> float:
    """Linear warmup over min(warmup_steps, steps // 4) steps, then cosine down to min_lr_frac * lr."""
    warm = max(1, min(warmup_steps, steps // 4))
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return lr * (min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def fit_steps(step: int, steps: int, max_seconds: float, elapsed: float, marks: dict, log=print) -> int:
    """A time-capped run measures steps 5..15 (past the warm-up of kernels and allocator) and, at step 15,
    cuts the step count to what fits max_seconds at that speed; the steps done go in the meta."""
    if not max_seconds or step not in (5, 15):
        return steps
    marks[step] = elapsed
    if step == 5:
        return steps
    per = (marks[15] - marks[5]) / 10
    fit = max(16, min(steps, 15 + int((max_seconds - elapsed) / per)))
    if fit < steps:
        log(f"{fit} steps fit in {max_seconds:.0f} s at {per * 1e3:.1f} ms/step (asked {steps})")
    return fit


def sample_windows(stream: np.ndarray, batch: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """[batch, length] windows of the token stream at uniform random offsets."""
    starts = rng.integers(0, len(stream) - length, size=batch)
    return np.stack([stream[s:s + length] for s in starts]).astype(np.int64)


def lm_loss(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of tokens [B, S+1] through one causal prefill (naive attention)."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    B, S = x.shape
    cache = model.new_cache(B, S)
    zero = torch.zeros(B, dtype=torch.int32, device=x.device)
    pos = torch.arange(S, device=x.device)[None].expand(B, S)
    out = model.forward(x, pos, cache, zero, attn="torch")
    return F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten())


def update_router_bias(model: Transformer, speed: float) -> list[float]:
    """bias_e += speed * sign(mean load - load_e) per MoE layer, from the step's route log; returns each
    layer's max load / mean load (1.0 = balanced)."""
    E, imbalance = model.cfg.n_routed_experts, []
    with torch.no_grad():
        for layer, idx in model.route_log or []:
            load = torch.bincount(idx.flatten(), minlength=E).float()
            bias = model.w[f"layers.{layer}.gate_bias"]
            bias += speed * torch.sign(load.mean() - load).to(bias.dtype)
            imbalance.append(float(load.max() / load.mean().clamp(min=1e-9)))
    model.route_log = []
    return imbalance


def _optimizer(weights: dict[str, torch.Tensor], tc: TargetTrainConfig) -> torch.optim.Optimizer:
    decay = [t for k, t in weights.items() if t.requires_grad and t.dim() >= 2 and k not in ("embed",)]
    other = [t for k, t in weights.items() if t.requires_grad and (t.dim() < 2 or k == "embed")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95))


def train_target(cfg: ModelConfig, stream: np.ndarray, tc: TargetTrainConfig, device="cpu", log=print
                 ) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """-> (float32 weights, loss curve rows {step, loss, lr, imbalance, seconds})."""
    torch.manual_seed(tc.seed)
    weights = init_weights(cfg, tc.seed, device, torch.float32)
    for k, t in weights.items():
        t.requires_grad_(not k.endswith("gate_bias"))
    model = Transformer(cfg, weights, moe_dispatch="loop")
    opt = _optimizer(weights, tc)
    rng = np.random.default_rng(tc.seed)
    curve, t0 = [], time.perf_counter()
    steps, step, marks = tc.steps, 0, {}
    while step < steps:
        steps = fit_steps(step, steps, tc.max_seconds, time.perf_counter() - t0, marks, log)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, tc.lr, tc.warmup_steps, tc.min_lr_frac)
        batch = torch.from_numpy(sample_windows(stream, tc.batch, tc.seq_len + 1, rng)).to(device)
        model.route_log = []
        loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([t for t in weights.values() if t.requires_grad], tc.clip)
        opt.step()
        imb = update_router_bias(model, tc.bias_speed)
        if step % tc.log_every == 0 or step == steps - 1:
            row = {"step": step, "loss": float(loss.detach()), "lr": opt.param_groups[0]["lr"],
                   "max_load_over_mean": max(imb) if imb else 1.0, "seconds": time.perf_counter() - t0}
            curve.append(row)
            log(f"target step {step} loss {row['loss']:.4f} lr {row['lr']:.2e} load {row['max_load_over_mean']:.2f}")
        step += 1
    model.route_log = None
    return {k: t.detach() for k, t in weights.items()}, curve
