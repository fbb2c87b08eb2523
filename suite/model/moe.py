"""DeepSeek-V3 / Kimi K2 mixture of experts in torch: sigmoid + bias group-limited routing (noaux_tc), the
routed experts (a registry entry moe_<dispatch>: torch grouped GEMM over expert-sorted slots, a per-expert
loop, the Triton fused experts) and the shared expert. Rules follow references/moe.py (the float64 truth) and shared/notes/mla_moe.md §2 and §6.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kdbench.backends import registry
from kdbench.references.model_config import ModelConfig

from . import invariant
from .moe_plan import shared_fits

# "auto" or X for each registry entry moe_X of the moe_experts family (grouped, loop, triton, flashinfer)
DISPATCH_MODES = registry.moe_dispatch_modes()
_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}  # (device type, dtype) -> torch._grouped_mm works


def gate_logits(x: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """[N, E] router logits with float32 values. For a float64 model: inputs rounded to float32, the dot
    product summed in float64 and rounded once (the reference's gate_logits_fp32); bf16 / fp16 on a GPU: one GEMM
    of the half inputs with float32 accumulation and output (the products are exact in float32; tensor cores add
    them in float32 with truncation, a few 1e-6 of the largest logit from float64 on the H200, plans/0015); else a
    float32 matmul. The GPU form reads the [E, d] weight once in its own dtype: no float32 copy per call (~12 MB at
    kimi-k2's gate)."""
    if x.dtype == torch.float64:
        return (x.float().double() @ w_gate.float().double().T).float().double()
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and w_gate.dtype == x.dtype and x.dim() == 2:
        return torch.mm(x, w_gate.T, out_dtype=torch.float32)
    return x.float() @ w_gate.float().T


def _stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[N, k] indices of the k largest per row; ties go to the lower index (stable descending sort)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def router_scores(x: torch.Tensor, w_gate: torch.Tensor, invariant_mode: bool = False) -> torch.Tensor:
    """[N, E] sigmoid router scores (float32; float64 for float64 x), batch-invariant GEMM in invariant_mode."""
    if invariant_mode:
        return invariant.sigmoid(invariant.gate_logits(x, w_gate))
    return torch.sigmoid(gate_logits(x, w_gate))


def biased_scores(s: torch.Tensor, bias: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """s + bias, group-limited: group score = sum of its top-2 biased scores; groups outside the top topk_group
    become -inf (n_group 1: no limit)."""
    biased = s + bias.to(s.dtype)
    if cfg.n_group > 1:
        n, e = biased.shape
        grouped = biased.view(n, cfg.n_group, e // cfg.n_group)
        top2 = torch.sort(grouped, dim=-1).values[..., -2:]   # ascending, as the reference sums it
        group_score = top2[..., 0] + top2[..., 1]            # [N, G]
        kept = _stable_topk(group_score, cfg.topk_group)     # [N, topk_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
        biased = biased.masked_fill(~keep.repeat_interleave(e // cfg.n_group, dim=1), float("-inf"))
    return biased


def selection_margin(biased: torch.Tensor, k: int) -> torch.Tensor:
    """[N]: the k-th largest biased score minus the (k+1)-th, how far each row's expert choice is from a flip
    (inf where fewer than k + 1 experts are selectable). Group choices are not covered."""
    if biased.shape[1] <= k:
        return torch.full(biased.shape[:1], float("inf"), dtype=biased.dtype, device=biased.device)
    v = torch.topk(biased, k + 1, dim=-1).values
    return v[:, k - 1] - v[:, k]


def route(x: torch.Tensor, w_gate: torch.Tensor, bias: torch.Tensor, cfg: ModelConfig, invariant_mode: bool = False,
          triton_select: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, d] -> (idx [N, k] int64 in selection order, weights [N, k] float32, float64 for float64 x).

    Selection on sigmoid + bias, group-limited (biased_scores); weights are the unbiased scores, normalized if
    norm_topk_prob, times routed_scaling.
    invariant_mode: batch-invariant gate GEMM and a left-to-right sum over the top-k (sorts and elementwise
    ops are row-independent already). triton_select: for one group, everything after the sigmoid in one Triton
    launch (moe_triton.route_select: the same experts, weights summed left to right), as the Triton dispatch runs.
    """
    s = router_scores(x, w_gate, invariant_mode)
    if triton_select and cfg.n_group == 1 and not invariant_mode:
        from . import moe_triton   # noqa: PLC0415  (imports triton; only the Triton dispatch asks)
        return moe_triton.route_select(s, bias, cfg.n_experts_per_tok, cfg.norm_topk_prob, cfg.routed_scaling)
    idx = _stable_topk(biased_scores(s, bias, cfg), cfg.n_experts_per_tok)          # [N, k]
    weights = torch.gather(s, 1, idx)
    if cfg.norm_topk_prob:
        total = invariant.ordered_sum(weights)[:, None] if invariant_mode else weights.sum(dim=-1, keepdim=True)
        weights = weights / total
    return idx, weights * cfg.routed_scaling


ROWS_F64 = 4   # swiglu's float64 CPU row padding (below)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """W2 (silu(W1 x) * W3 x): x [N, d], w1/w3 [m, d], w2 [d, m] -> [N, d]. float64 on the CPU pads the rows with
    zero rows to a multiple of ROWS_F64: MKL on an AMD EPYC (s11) computes the last N mod 4 rows of a float64 GEMM
    (and calls of 1-3 rows) on another path whose last bits differ, and the exact checks need an expert's row to
    come out the same among any rows (expert-parallel shards with padding against one process, AR against verify).
    With the padding every row of 1..300-row calls agreed there; tests/test_model.py checks it where it runs."""
    n = x.shape[0]
    if x.dtype == torch.float64 and not x.is_cuda and x.dim() == 2 and n % ROWS_F64:
        pad = torch.cat((x, x.new_zeros(ROWS_F64 - n % ROWS_F64, x.shape[1])))
        return swiglu(pad, w1, w2, w3)[:n]
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def experts_loop(x, idx, weights, w1, w2, w3) -> torch.Tensor:
    """Per-expert loop (host-synchronizing: unique / nonzero). Same accumulation order as the reference."""
    y = torch.zeros_like(x)
    for e in torch.unique(idx).tolist():
        rows, slots = torch.nonzero(idx == e, as_tuple=True)
        y.index_add_(0, rows, weights[rows, slots, None].to(x.dtype) * swiglu(x[rows], w1[e], w2[e], w3[e]))
    return y


def experts_grouped(x, idx, weights, w1, w2, w3) -> torch.Tensor:
    """(token, k) slots sorted by expert, three torch._grouped_mm calls over the expert segments.
    No host synchronization (counts via scatter_add, not bincount), so it can sit in a CUDA graph."""
    n, k = idx.shape
    flat = idx.flatten()                                       # [N*k] expert of each slot
    order = torch.sort(flat, stable=True).indices              # slots grouped by expert
    token = order // k                                         # [N*k] source row of each sorted slot
    counts = torch.zeros(w1.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)          # [E] segment ends
    xs = x[token]                                              # [N*k, d]
    h = F.silu(torch._grouped_mm(xs, w1.transpose(1, 2), offs)) * torch._grouped_mm(xs, w3.transpose(1, 2), offs)
    out = torch._grouped_mm(h, w2.transpose(1, 2), offs)       # [N*k, d]
    acc = torch.promote_types(x.dtype, torch.float32)           # bf16 / fp16 outputs sum in float32
    out = out.to(acc) * weights.flatten()[order, None].to(acc)
    # back to slot order, then the k weighted outputs of a token summed in float32 in slot order and rounded once,
    # like the Triton path (a bf16 index_add_ rounded after every add, in whatever order CUDA's atomics took:
    # layer rel L2 5.3e-3 -> 4.5e-3 in s10 call F, which used a float32 index_add_)
    slots = torch.empty_like(out).index_copy_(0, order, out)     # [N*k, d]
    return slots.view(n, k, -1).sum(1).to(x.dtype)


def _grouped_available(x: torch.Tensor, w1: torch.Tensor) -> bool:
    """torch._grouped_mm exists and runs on this device and dtype (tried once, remembered)."""
    key = (x.device.type, x.dtype)
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                probe = torch.zeros(2, w1.shape[2], dtype=x.dtype, device=x.device)
                torch._grouped_mm(probe, w1[:1].transpose(1, 2),
                                  torch.tensor([2], dtype=torch.int32, device=x.device))
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


def resolve_dispatch(dispatch: str, x: torch.Tensor, *weights: torch.Tensor) -> str:
    """The dispatch mode "auto" stands for here: triton for bf16 / fp16 activations on a CUDA device of compute
    capability >= 8.0 (bf16 tensor-core dots) where Triton imports, with every given expert weight contiguous and of
    x's dtype (the fastest path at every measured size, eager and graphed since 2026-12-02 s10, plans/0015), else
    grouped where torch._grouped_mm runs on this device and dtype, else loop. weights: w1 first."""
    if dispatch != "auto":
        return dispatch
    if (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and _triton_runs(x.device)
            and all(w.dtype == x.dtype and w.is_contiguous() for w in weights)):
        return "triton"
    return "grouped" if _grouped_available(x, weights[0]) else "loop"


@functools.cache
def _triton_runs(device: torch.device) -> bool:
    """The registry's moe_triton is available and the GPU has bf16 tensor cores (sm80+); asked once per device."""
    return registry.available("moe_triton", "cuda")[0] and torch.cuda.get_device_capability(device) >= (8, 0)


def experts_op(dispatch: str, x: torch.Tensor, w1: torch.Tensor):
    """The routed-experts function of a dispatch mode (auto: resolve_dispatch). ValueError naming the reason when
    the mode's backend cannot run here."""
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
    return _registered_op(resolve_dispatch(dispatch, x, w1), x.device.type)


@functools.cache
def _registered_op(dispatch: str, device_type: str):
    """The registry's experts function of a named dispatch, resolved once per (mode, device type): every MoE
    layer of every forward asks (availability probes imports; an error is not cached and repeats)."""
    ok, why = registry.available("moe_" + dispatch, device_type)
    if not ok:
        raise ValueError(f"moe dispatch {dispatch!r} cannot run here: {why}")
    return registry.get("moe_" + dispatch).op("moe_experts")


def moe_forward(w: dict, cfg: ModelConfig, layer: int, x: torch.Tensor, dispatch: str = "auto",
                invariant_mode: bool = False, route_log: list | None = None,
                margin_log: list | None = None) -> torch.Tensor:
    """x [N, d] (ffn-normed) -> routed experts + shared expert, [N, d].

    dispatch: "grouped" (torch._grouped_mm; CUDA bf16 or CPU float32), "loop", "triton" (CUDA bf16/fp16),
    "flashinfer" / "liger" (the peers), or "auto" = triton where it runs, else grouped where that runs, else loop
    (float64 on CPU always loops; resolve_dispatch). invariant_mode: the batch-invariant
    router, expert GEMMs and deterministic combine (invariant.py); dispatch is then not used.
    route_log: a list that gets (layer, idx [N, k]) appended (training reads expert loads from it to update
    the router bias). margin_log: a list that gets (layer, selection_margin [N]) appended (the e2e kind's
    divergence diagnosis; the scores are computed once more for it).
    """
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
    p = f"layers.{layer}."
    experts = (w[p + "experts.w1"], w[p + "experts.w2"], w[p + "experts.w3"])  # [E,mi,d], [E,d,mi], [E,mi,d]
    shared = (w[p + "shared.w1"], w[p + "shared.w2"], w[p + "shared.w3"]) if cfg.n_shared_experts > 0 else None
    mode = resolve_dispatch(dispatch, x, *experts)
    op = None if invariant_mode else experts_op(mode, x, experts[0])     # an unavailable dispatch says why first
    idx, weights = route(x, w[p + "gate"], w[p + "gate_bias"], cfg, invariant_mode, triton_select=mode == "triton")
    if route_log is not None:
        route_log.append((layer, idx))
    if margin_log is not None:
        s = router_scores(x, w[p + "gate"], invariant_mode)
        margin_log.append((layer, selection_margin(biased_scores(s, w[p + "gate_bias"], cfg), cfg.n_experts_per_tok)))
    if invariant_mode:
        y = invariant.experts(x, idx, weights, *experts)
        return y if shared is None else y + invariant.swiglu(x, *shared)
    if shared is not None and getattr(op, "fuses_shared", False) and shared_fits(shared, experts):
        return op(x, idx, weights, *experts, shared=shared)   # one expert wide: runs in the experts' launches
    y = op(x, idx, weights, *experts)
    return y if shared is None else y + swiglu(x, *shared)
