"""What runs at each stage of a speculative step: the tree policy (which build) and the stage backend (a
backend registry entry serving the engine's kinds: "torch" = suite/backends/torch_ops.py, "cuda" = the
kdbench_cuda extension via suite/backends/cuda_ext.py, imported only when asked for).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

from kdbench.backends import chain_device, registry, torch_ops
from kdbench.backends.adaptive import adaptive
from kdbench.backends.cuda_build import ExtensionUnavailable

POLICY_KINDS = ("ar", "chain", "ddtree", "ddtree_width_capped", "static_kary", "adaptive")
BACKENDS = registry.for_kind("e2e")   # the stage backends (registry entries serving the engine's kinds)
MAX_BUDGET = 1024  # the largest tree the stages support (the paper's sweep ends here)


@dataclass(frozen=True)
class Policy:
    """kind: ar | chain (argmax chain, min(budget, L) deep) | ddtree (Algorithm 1, `budget` nodes) |
    ddtree_width_capped (at most max_width tokens per depth) | static_kary (branching[i] children at depth i;
    budget ignored) | adaptive (DDTree cut per round where expected tokens per verify cost peak, at most
    `budget` nodes; row_cost = one row's verify cost over a root-only verify's, backends/adaptive.py)."""
    kind: str = "ddtree"
    budget: int = 64
    max_width: int = 0
    branching: tuple[int, ...] = ()
    row_cost: float = 0.0

    def __post_init__(self):
        if isinstance(self.budget, numbers.Integral) and not isinstance(self.budget, bool):
            object.__setattr__(self, "budget", int(self.budget))  # numpy ints from sweeps are fine
        object.__setattr__(self, "branching", tuple(int(b) for b in self.branching))
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown policy kind {self.kind!r}; valid kinds: {', '.join(POLICY_KINDS)}")
        if not isinstance(self.budget, int) or not 0 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"budget must be an int in [0, {MAX_BUDGET}], got {self.budget!r}")
        if self.kind == "ddtree_width_capped" and self.max_width < 1:
            raise ValueError(f"ddtree_width_capped needs max_width >= 1, got {self.max_width}")
        if self.kind == "adaptive" and not (isinstance(self.row_cost, (int, float)) and self.row_cost >= 0):
            raise ValueError(f"adaptive needs row_cost >= 0, got {self.row_cost!r}")
        if self.kind == "static_kary":
            if not self.branching or min(self.branching) < 1:
                raise ValueError(f"static_kary needs branching: a non-empty tuple of ints >= 1, got {self.branching}")
            if torch_ops.static_kary_size(self.branching) > MAX_BUDGET:
                raise ValueError(f"static_kary branching {self.branching} has "
                                 f"{torch_ops.static_kary_size(self.branching)} nodes > {MAX_BUDGET}")

    def nodes(self, depth: int) -> int:
        """Tree nodes per request, root excluded (the verify pass has nodes + 1 rows); depth = drafter L."""
        if self.kind == "ar":
            return 0
        if self.kind == "chain":
            return min(self.budget, depth)
        if self.kind == "static_kary":
            if len(self.branching) > depth:
                raise ValueError(f"static_kary branching {self.branching} is deeper than the drafter (L={depth})")
            return torch_ops.static_kary_size(self.branching)
        return self.budget

    def build_one(self) -> torch_ops.BuildOne:
        return {"chain": lambda: torch_ops.build_chain, "ddtree": lambda: torch_ops.build_ddtree,
                "ddtree_width_capped": lambda: torch_ops.width_capped(self.max_width),
                "static_kary": lambda: torch_ops.static_kary(self.branching),
                "adaptive": lambda: adaptive(self.row_cost)}[self.kind]()

    @property
    def label(self) -> str:
        extra = {"ar": "", "chain": f"B={self.budget}", "ddtree": f"B={self.budget}",
                 "ddtree_width_capped": f"B={self.budget},w={self.max_width}",
                 "static_kary": "b=" + "x".join(map(str, self.branching)),
                 "adaptive": f"B={self.budget},c={self.row_cost:g}"}[self.kind]
        return f"{self.kind}({extra})" if extra else self.kind


@dataclass(frozen=True)
class Stages:
    """The callables of one backend; tree_build takes (draft_logits, budgets, roots, past_lens, max_budget)."""
    backend: str
    attn: str                  # the model's attention backend for verify / decode
    tree_build: Callable
    tree_accept_greedy: Callable
    tree_accept_sampled: Callable
    kv_compact: Callable


DEVICE_BUILT = ("ddtree", "chain")   # tree kinds a GPU stage backend builds on the device (its tree_build, argmax)


def device_built(kind: str, backend: str) -> bool:
    """Whether a policy kind's tree is built on the device (no host heap) on this stage backend."""
    return kind in DEVICE_BUILT and backend != "torch"


def get_stages(backend: str, policy: Policy) -> Stages:
    """The stage callables of a registry backend serving the engine. A backend's own tree_build is DDTree's
    Algorithm 1 only (the cuda kernel); a chain on such a backend is built on the device (chain_device.py);
    other policies, and the torch backend, use the torch host build.
    Raises ExtensionUnavailable (a RuntimeError) with the reason when the backend cannot be used here."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    entry = registry.get(backend)
    reason = entry.why_unavailable()   # the cuda extension: builds (or reuses) it once per process
    if reason:
        raise ExtensionUnavailable(f"backend {backend!r} is unavailable: {reason}")
    build_one = policy.build_one() if policy.kind != "ar" else None

    def torch_build(logits, budgets, roots, past, max_budget):
        return torch_ops.tree_build(logits, budgets, roots, past, max_budget, build_one)

    build = torch_build
    if device_built(policy.kind, entry.name):   # no host heap: capturable in a CUDA graph
        build = entry.op("tree_build") if policy.kind == "ddtree" else chain_device.build_chain  # argmax chain
    return Stages(backend, backend, build,
                  entry.op("tree_accept_greedy"), entry.op("tree_accept_sampled"), entry.op("kv_compact"))
