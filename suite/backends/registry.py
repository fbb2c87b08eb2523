"""The one list of backends: what each is (ours, a peer, a baseline, the reference), what it serves, what it
needs, and why it is unavailable. Config validation, availability, dispatch, gating, speedup columns, report
labels, the engine's stages and the model's attention all read it. Adding a backend = one entry + its module.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Literal

Role = Literal["ours", "peer", "baseline", "reference"]
STEP_FAMILIES = ("tree_build", "tree_verify_mla", "tree_accept", "kv_compact")   # the speculative step's kernels
FAMILIES = (*STEP_FAMILIES, "moe_experts")    # moe_experts: the target's routed experts (model.moe dispatch)
GENERATION_KINDS = ("acceptance", "e2e", "topology", "replay")   # kinds whose backends are the engine's stage backends


@dataclass(frozen=True)
class Backend:
    """One backend. Its module implements, per family it serves, functions named after the family's ops
    (suite/families/__init__.py states their signatures): tree_build; tree_accept_greedy and
    tree_accept_sampled; kv_compact; tree_verify_mla, which prepares once (a peer's plan(), its paged copy)
    and returns the zero-argument call that is timed. `ops` points an op elsewhere ("module:function")."""
    name: str
    role: Role
    families: tuple[str, ...]            # kernel families it implements
    kinds: tuple[str, ...]               # scenario kinds it serves ("kernel" when it has families)
    device: Literal["any", "cuda"]       # "any": the run's device (cpu or cuda); "cuda": needs a CUDA GPU
    module: str                          # dotted module path ("" for the reference: the family's own code)
    label: str                           # a few words for report tables and `kdbench list`
    why_unavailable: Callable[[], str | None] = lambda: None   # beyond the device: a missing build or package
    ops: tuple[tuple[str, str], ...] = ()   # (op, "module:function") where it is not module.<op>
    same_work: bool = True               # False: computes less than the case asks (never "the best peer")
    host_sync: str = ""                  # why a call reads the device from the host (then no CUDA graph holds it)

    def unavailable(self, device: str) -> str | None:
        """Why this backend cannot run on `device` here, or None."""
        if self.device == "cuda" and device != "cuda":
            return f"the {self.name} backend needs --device cuda (a CUDA GPU)"
        return self.why_unavailable()

    def op(self, name: str) -> Callable:
        """The function implementing op `name` (imports the module: only call when the backend is available)."""
        where = dict(self.ops).get(name)
        if where is None:
            if not self.module:
                raise KeyError(f"backend {self.name!r} has no module (the reference runs in the family's code)")
            return getattr(importlib.import_module(self.module), name)
        module, _, function = where.partition(":")
        return getattr(importlib.import_module(module), function)


def _cuda_extension() -> str | None:
    from kdbench.backends import cuda_build   # noqa: PLC0415  (imports torch's extension tooling)
    return cuda_build.unavailable_reason()


def _cuda_sm90() -> str | None:
    """The extension, on compute capability 9.0: the paths pinned to sm_90a code (wgmma, TMA) exist only there."""
    reason = _cuda_extension()
    if reason is not None:
        return reason
    import torch   # noqa: PLC0415
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        return f"pinned to an sm_90a path: needs compute capability 9.0 (H100/H200), this GPU is {cap[0]}.{cap[1]}"
    return None


def _cpu_heap() -> str | None:
    try:
        importlib.import_module("kdbench._cpu_heap")   # built by pip install from csrc/tree_build_cpu.cpp
    except ImportError as exc:
        return f"the C++ heap extension is not built ({exc}); run pip install -e ."
    return None


def _triton() -> str | None:
    from kdbench.model import moe_triton   # noqa: PLC0415  (imports triton only when asked)
    return None if moe_triton.AVAILABLE else f"{moe_triton.IMPORT_ERROR} (the Triton path needs a CUDA torch)"


def _flashinfer_moe() -> str | None:
    from kdbench.backends import flashinfer_moe   # noqa: PLC0415  (imports flashinfer only when asked)
    return flashinfer_moe.unavailable_reason()


def _liger_moe() -> str | None:
    from kdbench.backends import liger_moe   # noqa: PLC0415  (imports liger_kernel only when asked)
    return liger_moe.unavailable_reason()


def _flashinfer() -> str | None:
    from kdbench.backends import flashinfer_mla   # noqa: PLC0415  (imports flashinfer only when asked)
    return flashinfer_mla.unavailable_reason()


_GEN = ("kernel", *GENERATION_KINDS)
_CUDA_KINDS = tuple(k for k in _GEN if k != "replay")   # replay is torch only: its live check runs generate() on torch
_MLA = ("tree_verify_mla",)
_B = "kdbench.backends."
_VERIFY = "tree_verify_mla"
_MOE, _MOE_OP, _M = ("moe_experts",), "moe_experts", "kdbench.model."
ENTRIES = (
    Backend("numpy_ref", "reference", FAMILIES, ("kernel",), "any", "", "float64 numpy reference"),
    Backend("torch", "baseline", STEP_FAMILIES, _GEN, "any", _B + "torch_ops", "torch eager",
            ops=((_VERIFY, _B + "mla_baselines:prepare_eager"),)),
    Backend("torch_sdpa", "baseline", _MLA, ("kernel",), "any", "", "torch SDPA, bool mask",
            ops=((_VERIFY, _B + "mla_baselines:prepare_sdpa"),)),
    Backend("torch_twopass", "baseline", _MLA, ("kernel",), "any", "", "torch prefix + tree block, LSE merge",
            ops=((_VERIFY, _B + "mla_baselines:prepare_twopass"),)),
    Backend("cpu_heap", "baseline", ("tree_build",), ("kernel",), "any", _B + "cpu_heap",
            "torch top-K + C++ host heap", _cpu_heap),
    Backend("cuda", "ours", STEP_FAMILIES, _CUDA_KINDS, "cuda", _B + "cuda_ext", "kdbench CUDA kernels", _cuda_extension,
            ops=((_VERIFY, _B + "cuda_ext:prepare_tree_verify_mla"),)),
    Backend("cuda_mma", "ours", _MLA, ("kernel",), "cuda", "", "kdbench kernel, mma.sync path",
            _cuda_extension, ops=((_VERIFY, _B + "cuda_ext:prepare_tree_verify_mla_mma"),)),
    Backend("cuda_pingpong", "ours", _MLA, ("kernel",), "cuda", "", "kdbench kernel, v3 ping-pong path (sm_90a)",
            _cuda_sm90, ops=((_VERIFY, _B + "cuda_ext:prepare_tree_verify_mla_pingpong"),)),
    Backend("flashinfer_cascade", "peer", _MLA, ("kernel",), "cuda", "",
            "FlashInfer MLA over the prefix + torch tree block + merge_state", _flashinfer,
            ops=((_VERIFY, _B + "flashinfer_mla:prepare_cascade"),)),
    Backend("flashinfer_prefix", "peer", _MLA, ("kernel",), "cuda", "",
            "FlashInfer MLA over the prefix only: does less work (no tree block)", _flashinfer,
            ops=((_VERIFY, _B + "flashinfer_mla:prepare_prefix"),), same_work=False),
    Backend("flashinfer_causal", "peer", _MLA, ("kernel",), "cuda", "",
            "FlashInfer MLA, causal over prefix + chain (chain trees only)", _flashinfer,
            ops=((_VERIFY, _B + "flashinfer_mla:prepare_causal"),)),
    # The routed experts; the model's moe dispatch mode X (model/moe.py) is the entry moe_X.
    Backend("moe_loop", "baseline", _MOE, ("kernel",), "any", "", "torch per-expert loop (host-synchronizing)",
            ops=((_MOE_OP, _M + "moe:experts_loop"),), host_sync="its loop reads the touched experts (unique)"),
    Backend("moe_grouped", "baseline", _MOE, ("kernel",), "any", "", "torch._grouped_mm over expert-sorted slots",
            ops=((_MOE_OP, _M + "moe:experts_grouped"),)),
    Backend("moe_triton", "ours", _MOE, ("kernel",), "cuda", "", "kdbench Triton experts, SwiGLU fused", _triton,
            ops=((_MOE_OP, _M + "moe_triton:experts"),)),
    Backend("moe_flashinfer", "peer", _MOE, ("kernel",), "cuda", "", "FlashInfer cutlass_fused_moe (sm90, bf16)",
            _flashinfer_moe, ops=((_MOE_OP, _B + "flashinfer_moe:experts"),)),
    Backend("moe_liger", "peer", _MOE, ("kernel",), "cuda", "",
            "Liger-Kernel fused MoE (Triton: gather + grouped GEMM + SwiGLU, down, weighted sum; eager, pinned config)",
            _liger_moe, ops=((_MOE_OP, _B + "liger_moe:experts"),), host_sync="it reads its tile count (.item())"),
)
BACKENDS = {b.name: b for b in ENTRIES}
# Row backends that are not entries: the topology kind's collective microbenchmarks record the library that
# carried them. A scenario cannot name them (no kind lists them) and they never gate (gates()): they time
# the link and the library, not our code. Report legends read their label here (label()).
COLLECTIVES = {
    "nccl": "NCCL collectives between the GPUs (the link and the library; context, never gates)",
    "gloo": "gloo collectives between CPU processes (the library; context, never gates)",
}


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def for_family(family: str) -> tuple[str, ...]:
    """Backends a kernel family's cases may name, in registry order."""
    return tuple(b.name for b in ENTRIES if family in b.families)


def for_kind(kind: str) -> tuple[str, ...]:
    """Backends a generation kind's cases may name (the engine's stage backends)."""
    return tuple(b.name for b in ENTRIES if kind in b.kinds)


def moe_dispatch_modes() -> tuple[str, ...]:
    """The model's MoE dispatch modes: "auto" and X for every moe_experts entry moe_X (model/moe.py, the
    `moe` key of generation scenarios)."""
    return ("auto", *(b.name.removeprefix("moe_") for b in ENTRIES
                      if "moe_experts" in b.families and b.role != "reference"))


def label(name: str) -> str:
    """A few words on a row's backend for report legends: the entry's, a collective library's, or ''."""
    return BACKENDS[name].label if name in BACKENDS else COLLECTIVES.get(name, "")


def names(role: Role) -> tuple[str, ...]:
    return tuple(b.name for b in ENTRIES if b.role == role)


def shipped(family: str) -> str:
    """The backend a family's headline speedups are ours for: its first role-ours entry in registry order (cuda for
    the CUDA kernel families, moe_triton for moe_experts; cuda_mma and cuda_pingpong are older paths beside it).
    'cuda' for a family no ours entry covers (records of an older kdbench)."""
    return next((b.name for b in ENTRIES if b.role == "ours" and family in b.families), "cuda")


def role(name: str) -> str:
    """The role of a backend; '' for a name the registry does not know (records of an older kdbench)."""
    return BACKENDS[name].role if name in BACKENDS else ""


def available(name: str, device: str) -> tuple[bool, str]:
    """(available, the reason when not) for a backend on the run's device."""
    if name not in BACKENDS:
        return False, f"unknown backend {name!r}"
    reason = BACKENDS[name].unavailable(device)
    return reason is None, reason or ""


def gates(kind: str, backend: str) -> bool:
    """Whether a slower (or dropped) row fails a compare. Kernel rows: our kernels (role ours) only; baselines
    and peers are context (host-bound baselines move with the machine's CPU: an H200 A/A nightly pair moved
    them by up to 1.8x; a peer's speed is not our change). Rows of a generation kind (acceptance, e2e,
    replay, and the topology kind's phase rows) gate for every registered backend: they time our engine,
    and a topology phase row our sharded code (tp/ep sharding, the EP MoE dispatch) whichever attention
    backend it runs on; topology rows join only on the same device and link (KEY_COLUMNS). Never: the
    reference, the collective microbenchmarks (COLLECTIVES: the link and the library), names the registry
    does not know (records of an older kdbench) and other kinds."""
    if backend == "numpy_ref" or backend not in BACKENDS:
        return False
    if kind == "kernel":
        return role(backend) == "ours"
    return kind in GENERATION_KINDS
