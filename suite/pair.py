"""The shipped trained pair (plans/0007): the kdbench-pair MLA+MoE target and its DFlash-style block drafter,
stored as bf16 KDTR files in kdbench/data with a JSON meta (configs, training settings, curves summary).
Loading needs no training step; a missing or bad file is a UserError naming it.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import torch

from kdbench import kdtr
from kdbench.errors import UserError
from kdbench.model import weights as wio
from kdbench.model.drafter import BlockDrafter, DrafterConfig, drafter_shapes
from kdbench.model.transformer import Transformer
from kdbench.references.model_config import get_preset

DATA = Path(__file__).parent / "data"
PRESET = "kdbench-pair"
TARGET_FILE, DRAFTER_FILE, META_FILE = "pair_target.kdtr", "pair_drafter.kdtr", "pair_meta.json"


# The pair's drafter shape: 2 dense layers, 4 x 64 heads with 2 KV heads, taps of target layers 1-3 (the cost
# model charges the same shape: costmodel.default_drafter).
DRAFTER_SHAPE = dict(tap_layers=(1, 2, 3), n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, intermediate=512)


def drafter_config() -> DrafterConfig:
    """The pair's drafter: DRAFTER_SHAPE with B = 16."""
    return DrafterConfig.for_target(get_preset(PRESET), **DRAFTER_SHAPE, block_size=16)


def read_meta(root: Path = DATA) -> dict:
    path = Path(root) / META_FILE
    if not path.exists():
        raise UserError(f"{path}: trained-pair meta file missing (train it: kdbench train, plans/0007)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def _load(path: Path, device, dtype) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise UserError(f"{path}: trained-pair weight file missing (train it: kdbench train, plans/0007)")
    try:
        return wio.load(path, device, dtype)
    except kdtr.KdtrError as exc:
        raise UserError(f"{path}: bad weight file ({exc})") from None


def load_target(device="cpu", dtype=torch.float32, root: Path = DATA, **kw) -> Transformer:
    """The trained target; dtype float32 on CPU reproduces tests/data/pair_reference.json."""
    path = Path(root) / TARGET_FILE
    w = _load(path, device, dtype)
    try:
        return Transformer(get_preset(PRESET), w, **kw)
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None


def load_drafter(target: Transformer, root: Path = DATA) -> BlockDrafter:
    """The trained block drafter on the target's device and dtype (embed / lm_head shared with it)."""
    path = Path(root) / DRAFTER_FILE
    raw = read_meta(root)["drafter_config"]
    dc = DrafterConfig(**{**raw, "tap_layers": tuple(raw["tap_layers"])})
    w = _load(path, target.device, target.dtype)
    want = drafter_shapes(dc)
    bad = sorted(set(want) ^ set(w)) or [k for k in want if tuple(w[k].shape) != want[k]]
    if bad:
        raise UserError(f"{path}: drafter tensors do not match the meta's config (first: {bad[0]})")
    return BlockDrafter(dc, target, w, name=f"trained(L={dc.depth},layers={dc.n_layers})")


def save(root: Path, target_w: dict, drafter_w: dict, dc: DrafterConfig, meta: dict) -> None:
    """Write the bf16 pair + meta (drafter config included) under root."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bf16 = lambda w: {k: (v if k.endswith("gate_bias") else v.to(torch.bfloat16)) for k, v in w.items()}
    wio.save(root / TARGET_FILE, bf16(target_w))
    wio.save(root / DRAFTER_FILE, bf16(drafter_w))
    dcd = {f.name: getattr(dc, f.name) for f in fields(dc)}
    dcd["tap_layers"] = list(dc.tap_layers)
    (root / META_FILE).write_text(json.dumps({**meta, "drafter_config": dcd}, indent=1) + "\n")


def bf16_round(w: dict) -> dict:
    """The values the shipped files hold (bf16; the router bias stays float32), as float32."""
    return {k: (v if k.endswith("gate_bias") else v.to(torch.bfloat16).float()) for k, v in w.items()}

