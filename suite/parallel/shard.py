"""Which slice of every weight a rank holds. MLA: heads [r*H/n, (r+1)*H/n) (wq_b / wq rows, wkv_b rows, wo
columns); the latent projection wkv_a, the norms, embed and lm_head are replicated (the latent cache is shared
by all heads, so every rank writes the same rows). Dense MLP: Megatron column/row split of w1, w3 / w2.
MoE "tp": every routed and shared expert split along its intermediate width; "ep": the routed experts split
into contiguous ranges of E/n, the gate and the shared expert replicated. Plan: plans/0011-multi-gpu.md.
"""
from __future__ import annotations

import dataclasses

import torch

from kdbench.references.model_config import ModelConfig

PARALLEL_MODES = ("tp", "ep")


def check_divisible(cfg: ModelConfig, world: int, parallel: str) -> str:
    """'' when cfg splits over `world` ranks in this mode, else the reason (a skip, not a crash)."""
    if parallel not in PARALLEL_MODES:
        return f"parallel must be one of {PARALLEL_MODES}, got {parallel!r}"
    need = {"n_heads": cfg.n_heads, "intermediate": cfg.intermediate}
    if parallel == "tp":
        need["moe_intermediate"] = cfg.moe_intermediate
    else:
        need["n_routed_experts"] = cfg.n_routed_experts
    bad = [f"{k} {v}" for k, v in need.items() if v % world]
    return f"{cfg.name}: {', '.join(bad)} not divisible by {world} ranks" if bad else ""


def _split(t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Contiguous block `rank` of `world` along `dim`, a copy (a dim-0 block would be a view that keeps the full
    tensor alive), so the full tensor can be freed; one rank keeps the tensor itself (no second copy)."""
    if world == 1:
        return t
    return t.chunk(world, dim=dim)[rank].clone(memory_format=torch.contiguous_format)


def _heads(t: torch.Tensor, n_heads: int, rank: int, world: int) -> torch.Tensor:
    """Rows grouped per head ([H * per, ...]): the rank's heads' rows."""
    per = t.shape[0] // n_heads
    return _split(t.view(n_heads, per, *t.shape[1:]), 0, rank, world).view(-1, *t.shape[1:])


def local_config(cfg: ModelConfig, world: int, parallel: str) -> ModelConfig:
    """The config one rank's weights look like: H/n heads, intermediate/n; tp also moe_intermediate/n."""
    kw = {"n_heads": cfg.n_heads // world, "intermediate": cfg.intermediate // world}
    if parallel == "tp":
        kw["moe_intermediate"] = cfg.moe_intermediate // world
    return dataclasses.replace(cfg, **kw)


def shard_weights(cfg: ModelConfig, w, rank: int, world: int, parallel: str) -> dict[str, torch.Tensor]:
    """The rank's tensors under the same names, from a dict or an iterable of (name, full tensor) such as
    weights.iter_weights (see the module docstring for the split of each)."""
    items = w.items() if isinstance(w, dict) else w
    return {name: shard_tensor(cfg, name, t, rank, world, parallel) for name, t in items}


def shard_tensor(cfg: ModelConfig, name: str, t: torch.Tensor, rank: int, world: int, parallel: str) -> torch.Tensor:
    """The rank's slice of the full tensor `name` (replicated tensors are returned as they are)."""
    key = name.rsplit(".", 1)[-1] if not name.startswith("layers.") else name.split(".", 2)[2]
    if key in ("wq_b", "wq", "wkv_b"):
        return _heads(t, cfg.n_heads, rank, world)
    if key == "wo":
        return _split(t, 1, rank, world)                       # [d, H*dv] columns of the rank's heads
    if key in ("mlp.w1", "mlp.w3") or (parallel == "tp" and key in ("shared.w1", "shared.w3")):
        return _split(t, 0, rank, world)                       # [m/n, d]
    if key == "mlp.w2" or (parallel == "tp" and key == "shared.w2"):
        return _split(t, 1, rank, world)                       # [d, m/n]
    if key in ("experts.w1", "experts.w3"):                    # [E, mi, d]
        return _split(t, 1 if parallel == "tp" else 0, rank, world)
    if key == "experts.w2":                                    # [E, d, mi]
        return _split(t, 2 if parallel == "tp" else 0, rank, world)
    return t
