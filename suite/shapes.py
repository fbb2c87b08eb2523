"""Per-family and per-kind `shape` dataclasses: what a scenario case may set, with defaults and limits.

Each `validate()` returns None or (key, message); schema.build turns that into a ScenarioError.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

MAX_BUDGET = 1024   # the engine's and the kernels' largest supported tree budget


def _positive(obj, *names) -> tuple[str, str] | None:
    for name in names:
        value = getattr(obj, name)
        if value < 1:
            return name, f"got {value}, expected an integer >= 1"
    return None


def _budget(value: int, key: str = "budget") -> tuple[str, str] | None:
    if not 0 <= value <= MAX_BUDGET:
        return key, f"got {value}, expected a tree budget in 0..{MAX_BUDGET}"
    return None


@dataclass(frozen=True)
class TreeBuildShape:
    batch: int
    budget: int
    vocab: int
    depth: int = 15
    logits: Literal["random", "ties", "peaked"] = "random"
    ragged_budgets: bool = False     # per-request budgets drawn from 1..budget

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "vocab", "depth")


@dataclass(frozen=True)
class TreeVerifyMlaShape:
    batch: int
    heads: int
    nodes: int                       # T = budget + 1 tree rows per request
    past_len: int
    ragged: bool = False             # past lengths drawn from 1..past_len per request
    tree: Literal["random", "chain"] = "random"
    kv_lora: int = 512
    rope: int = 64
    padding: int = 0                 # trailing rows per request with an all-zero mask (o = 0, lse = -inf)

    def validate(self):
        if not 1 <= self.nodes <= MAX_BUDGET + 1:
            return "nodes", f"got {self.nodes}, expected 1..{MAX_BUDGET + 1}"
        if not 0 <= self.padding < self.nodes:
            return "padding", f"got {self.padding}, expected 0..nodes-1 = {self.nodes - 1}"
        return _positive(self, "batch", "heads", "past_len", "kv_lora", "rope")


@dataclass(frozen=True)
class TreeAcceptShape:
    batch: int
    budget: int
    vocab: int
    depth: int = 15
    mode: Literal["greedy", "sampled"] = "greedy"

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "vocab", "depth")


@dataclass(frozen=True)
class KvCompactShape:
    batch: int
    budget: int
    past_len: int
    layers: int = 2
    dim: int = 576
    depth: int = 15

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "past_len", "layers", "dim", "depth")


Policy = Literal["ar", "chain", "ddtree", "ddtree_width_capped", "static_kary"]


@dataclass(frozen=True)
class GenerationShape:
    """Model-level cases (acceptance, e2e): which model, drafter, policy and sizes."""
    model: str
    policy: Policy = "ddtree"
    budget: int = 64
    batch: int = 1
    prompts: int = 4                 # number of prompts (acceptance) drawn per category
    prompt_len: int = 32
    max_new_tokens: int = 32
    temperature: float = 0.0
    drafter: Literal["block", "synthetic"] = "synthetic"
    quality: float = 0.8             # synthetic drafter: probability mass on the target's true token
    draft_len: int = 15              # L, the drafter's block horizon (separate from the tree budget)
    max_width: int = 4               # ddtree_width_capped
    branching: tuple[int, ...] = (4, 2, 1)  # static_kary: children per node at each depth
    category: Literal["random", "repetitive"] = "random"
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"   # auto: bf16 on GPU, f64 tiny on CPU

    def validate(self):
        from kdbench.references.model_config import get_preset, preset_names
        try:
            get_preset(self.model)
        except KeyError:
            return "model", f"got {self.model!r}, expected a preset: {', '.join(preset_names())}"
        if self.temperature < 0:
            return "temperature", f"got {self.temperature}, expected >= 0"
        if not 0.0 <= self.quality <= 1.0:
            return "quality", f"got {self.quality}, expected a probability in [0, 1]"
        if self.max_new_tokens < 2:
            return "max_new_tokens", (f"got {self.max_new_tokens}, expected >= 2 (the first token comes from "
                                      "prefill; steps make the rest)")
        if self.policy == "static_kary" and (not self.branching or min(self.branching) < 1):
            return "branching", f"got {list(self.branching)}, expected a non-empty list of integers >= 1"
        return _budget(self.budget) or _positive(self, "batch", "prompts", "prompt_len", "draft_len",
                                                 "max_width")


def _nonneg(obj, *names):
    for name in names:
        if getattr(obj, name) < 0:
            return name, f"got {getattr(obj, name)}, expected an integer >= 0"
    return None


@dataclass(frozen=True)
class TopologyShape:
    """Multi-GPU cases (schema only in this wave: the runs come with the multi-GPU issue)."""
    model: str
    gpus: int = 2
    link: Literal["nvlink", "pcie"] = "nvlink"
    parallel: Literal["tp", "ep"] = "tp"
    batch: int = 1
    budget: int = 64

    def validate(self):
        return _budget(self.budget) or _positive(self, "gpus", "batch")


FAMILY_SHAPES = {
    "tree_build": TreeBuildShape,
    "tree_verify_mla": TreeVerifyMlaShape,
    "tree_accept": TreeAcceptShape,
    "kv_compact": KvCompactShape,
}
# Backends each family implements; the scenario loader checks case backends against these.
FAMILY_BACKENDS = {
    "tree_build": ("numpy_ref", "torch", "cpu_heap", "cuda"),   # cpu_heap: torch topk + the C++ heap
    # cuda: the kernel as the engine runs it (wgmma on sm_90); cuda_mma: the same kernel pinned to mma.sync
    "tree_verify_mla": ("numpy_ref", "torch", "torch_sdpa", "torch_twopass", "cuda", "cuda_mma"),
    "tree_accept": ("numpy_ref", "torch", "cuda"),
    "kv_compact": ("numpy_ref", "torch", "cuda"),
}
GENERATION_BACKENDS = ("torch", "cuda")   # stage backends of the engine (acceptance, e2e, topology)

KIND_SHAPES = {"acceptance": GenerationShape, "e2e": GenerationShape, "topology": TopologyShape}


def shape_keys(cls) -> list[str]:
    return [f.name for f in fields(cls)]
