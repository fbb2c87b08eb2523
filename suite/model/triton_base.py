"""What the Triton kernel modules share (moe_triton: the fused MoE experts; invariant_triton: the batch-invariant
kernels): the guarded import (CPU-only machines have no Triton; the callers report IMPORT_ERROR), the jit
decorator that is a no-op there, and the row-block prelude of a kernel over an expert-sorted block plan
(moe_plan.block_plan)."""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
    AVAILABLE, IMPORT_ERROR = True, ""
except ImportError as exc:  # CPU-only machines (CI): the registry and invariant.py report why, GPU tests skip
    triton, tl = None, None
    AVAILABLE, IMPORT_ERROR = False, f"import triton failed: {exc}"


def jit(**kw):
    """triton.jit(**kw), or the function unchanged where Triton is missing (so the module still imports)."""
    return triton.jit(**kw) if AVAILABLE else (lambda f: f)


@jit()
def plan_block(BLK_E, BLK_R0, BLK_R1, BM: tl.constexpr):
    """Program pid_m's block of the plan: its expert (-1: an unused tail block, the caller returns), the BM sorted
    positions r0 + 0..BM-1 and their mask (< r1, the end of the expert's segment)."""
    pid_m = tl.program_id(0)
    e = tl.load(BLK_E + pid_m)
    r0, r1 = tl.load(BLK_R0 + pid_m), tl.load(BLK_R1 + pid_m)
    rs = r0 + tl.arange(0, BM)
    return e, rs, rs < r1
