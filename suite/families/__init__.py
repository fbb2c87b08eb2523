"""Kernel families: one module per family, the same name as csrc/<family>.cu and references/<family>.py.
Each module implements KernelFamily (checked by tests/test_registry.py); which backends serve it is the
backend registry's (suite/backends/registry.py), and the kernel kind runs the numpy_ref backend itself.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Protocol

from kdbench.backends import registry
from kdbench.check import CheckResult
from kdbench.config import Case, Tolerance

FAMILIES = registry.FAMILIES


class KernelFamily(Protocol):
    """The contract of a family module (functions at module level). `case` is a config.Case whose `shape` is
    the family's shapes.*Shape; inputs are numpy arrays (bf16 cases hold bf16-representable values in float32);
    backends here are device backends, never numpy_ref (the kernel kind calls reference() for it)."""

    def make_inputs(self, case: Case, seed: int) -> dict:
        """Fresh random inputs of the case (numpy; a family may cache device copies in inputs["_device"])."""

    def reference(self, inputs: dict, case: Case) -> dict:
        """The float64 / int64 truth the backends are checked against."""

    def reference_for(self, backend: str, inputs: dict, case: Case) -> dict | None:
        """The truth for a backend that does less work than the case (registry same_work=False); None: the
        case's reference."""

    def unsupported(self, backend: str, case: Case) -> str | None:
        """Why this backend cannot run this case (dtype, shape, tree), or None."""

    def run(self, backend: str, inputs: dict, case: Case, device: str) -> dict:
        """One fresh run of the backend -> numpy outputs with the reference's keys (a subset where checked)."""

    def timed(self, backend: str, inputs: dict, case: Case, device: str) -> Callable[[], object]:
        """The zero-argument call that is timed, on inputs already resident on the device."""

    def outputs(self, backend: str, result: object, inputs: dict, case: Case) -> dict | None:
        """What one timed call returned -> run()'s numpy outputs, for the check after timing; None when a
        repeated call cannot give the checked result (in-place work: kv_compact)."""

    def check(self, got: dict, want: dict, tol: Tolerance) -> CheckResult:
        """The worst comparison over the output arrays."""

    def bytes_moved(self, case: Case, inputs: dict) -> float:
        """Bytes read + written: the napkin math behind the memory floor."""

    def flops(self, case: Case, inputs: dict) -> float:
        """Floating-point operations: the napkin math behind the compute floor."""


def get(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise KeyError(f"unknown kernel family {family!r}; valid: {', '.join(FAMILIES)}")
    return importlib.import_module(f"kdbench.families.{family}")
