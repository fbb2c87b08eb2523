"""Kernel families: one module per family, the same name as csrc/<family>.cu and references/<family>.py.

Each module provides (duck-typed, see tree_build.py for the longest example):
  BACKENDS: tuple of backend names it implements ("numpy_ref" is always the reference)
  make_inputs(shape, dtype, seed) -> dict of numpy arrays (bf16 cases hold bf16-representable values)
  reference(inputs, shape) -> dict of numpy outputs (float64 / int64): the truth
  run(backend, inputs, shape, device) -> dict of numpy outputs of that backend (one fresh run)
  timed(backend, inputs, shape, device) -> zero-argument callable that runs the backend on resident inputs
      (a family may cache those device copies in inputs["_device"], shared by its backends: tree_verify_mla)
  check(got, want, tol) -> CheckResult (worst over the output arrays)
  bytes_moved(shape, dtype) -> float, flops(shape) -> float: the napkin math behind every roofline figure
"""
from __future__ import annotations

import importlib
from types import ModuleType

from kdbench.shapes import FAMILY_BACKENDS  # noqa: F401  (re-exported: the one list of backends)

FAMILIES = ("tree_build", "tree_verify_mla", "tree_accept", "kv_compact")



def get(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise KeyError(f"unknown kernel family {family!r}; valid: {', '.join(FAMILIES)}")
    return importlib.import_module(f"kdbench.families.{family}")


def backend_available(backend: str, device: str) -> tuple[bool, str]:
    """(available, reason when not). numpy_ref runs anywhere; torch* on the run's device; cuda needs the
    built extension and a GPU."""
    if backend == "numpy_ref":
        return True, ""
    if backend.startswith("torch"):
        return True, ""
    if backend == "cpu_heap":
        try:
            import kdbench._cpu_heap  # noqa: F401  (built by pip install from csrc/tree_build_cpu.cpp)
        except ImportError as exc:
            return False, f"the C++ heap extension is not built ({exc}); run pip install -e ."
        return True, ""
    if backend in ("cuda", "cuda_mma"):
        if device != "cuda":
            return False, f"the {backend} backend needs --device cuda (a CUDA GPU)"
        from kdbench.backends import cuda_build
        reason = cuda_build.unavailable_reason()
        return (reason is None), (reason or "")
    return False, f"unknown backend {backend!r}"
