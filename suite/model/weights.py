"""Target-model weights as torch tensors: seeded random init on any device (torch.Generator), numpy
conversion (to run the float64 reference on the same values), and KDTR checkpoint save/load.
Names and shapes are the contract of references/model.py (weight_shapes).
"""
from __future__ import annotations

import numpy as np
import torch

from kdbench import kdtr
from kdbench.references.model import GATE_BIAS_STD, NORM_NOISE, weight_shapes
from kdbench.references.model_config import ModelConfig

HALF = (torch.float16, torch.bfloat16)


def tensor_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The router bias stays float32 in a half-precision model (selection compares fp32 scores)."""
    return torch.float32 if name.endswith("gate_bias") and dtype in HALF else dtype


def init_weights(cfg: ModelConfig, seed: int, device="cpu", dtype: torch.dtype = torch.float32
                 ) -> dict[str, torch.Tensor]:
    """Random weights drawn on `device` from torch.Generator(seed), with the reference's distributions
    (matrices N(0, 1/fan_in), embed N(0, 1), norms 1 + 0.05 N(0, 1), gate_bias N(0, 0.1^2)).

    Same distributions as references.model.init_weights, not the same values (numpy and torch streams
    differ); use from_numpy(references.model.init_weights(...)) when values must match the reference.
    """
    return dict(iter_weights(cfg, seed, device, dtype))


def iter_weights(cfg: ModelConfig, seed: int, device="cpu", dtype: torch.dtype = torch.float32):
    """init_weights one (name, tensor) at a time, same order and values: a caller that keeps only a slice of
    each (a sharded rank) never holds the whole model."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in weight_shapes(cfg).items():
        t = torch.empty(shape, dtype=tensor_dtype(name, dtype), device=device)
        if name == "embed":
            t.normal_(0.0, 1.0, generator=gen)
        elif name.endswith("norm"):
            t.normal_(1.0, NORM_NOISE, generator=gen)
        elif name.endswith("gate_bias"):
            t.normal_(0.0, GATE_BIAS_STD, generator=gen)
        else:
            t.normal_(0.0, shape[-1] ** -0.5, generator=gen)
        yield name, t


def from_numpy(weights: dict[str, np.ndarray], device="cpu", dtype: torch.dtype = torch.float64
               ) -> dict[str, torch.Tensor]:
    """numpy arrays (e.g. the float64 reference weights) -> torch tensors of `dtype` on `device`."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device=device, dtype=tensor_dtype(k, dtype))
            for k, v in weights.items()}


def to_numpy(weights: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """torch tensors -> float64 numpy arrays (exact for every float dtype up to float64)."""
    return {k: v.detach().to("cpu", torch.float64).numpy() for k, v in weights.items()}


def save(path, weights: dict[str, torch.Tensor]) -> None:
    """KDTR checkpoint; bf16 tensors are stored as raw bf16 bits (tag "bf16"), others natively."""
    arrays, tags = {}, {}
    for k, v in weights.items():
        v = v.detach().cpu().contiguous()
        if v.dtype == torch.bfloat16:
            arrays[k], tags[k] = v.view(torch.int16).numpy().view(np.uint16), "bf16"
        else:
            arrays[k] = v.numpy()
    kdtr.save(path, arrays, tags)


def load(path, device="cpu", dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """KDTR checkpoint -> tensors on `device`; dtype None keeps the stored dtypes (bf16 bits -> bfloat16)."""
    arrays, tags = kdtr.load_with_dtypes(path, mmap=False)
    out = {}
    for k, a in arrays.items():
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if tags[k] == "bf16" else torch.from_numpy(a)
        out[k] = t.to(device=device, dtype=tensor_dtype(k, dtype) if dtype is not None else t.dtype)
    return out


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """ValueError naming the first missing, unexpected or misshapen tensor."""
    shapes = weight_shapes(cfg)
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ValueError(f"{cfg.name}: weights missing {missing[:5]}, unexpected {extra[:5]}")
    for k, shape in shapes.items():
        if tuple(weights[k].shape) != shape:
            raise ValueError(f"{cfg.name}: weight {k} has shape {tuple(weights[k].shape)}, expected {shape}")
