"""Verify-cost model (plans/0008-cost-model.md): the time of an AR step and of a speculative step from floors
(FLOPs / peak, bytes / bandwidth per class of work) divided by measured efficiencies, plus fixed overheads;
a forward takes max(host issue time, device time): eager launches overlap the GPU's work.
MoE weight traffic follows the number of distinct experts the step's rows touch (measured curve or the
uniform-routing formula). Every figure is per forward of `batch` requests x `rows` rows at context `ctx`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kdbench import experts
from kdbench.pair import DRAFTER_SHAPE
from kdbench.model.drafter import DrafterConfig, drafter_shapes
from kdbench.references.model_config import ModelConfig

BF16 = 2            # bytes per weight / activation element
LOGIT_BYTES = 8     # per (row, vocab): bf16 logits written + read by the float cast + float32 written


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float   # dense bf16 FLOP/s
    mem_bw: float       # bytes/s (read + write)


# measured ceilings on the lent H200 (device/h200_facts.md): bf16 8192^3 matmul 771-798 TF/s, copy 4166-4248 GB/s
H200 = Hardware("H200", 790e12, 4.2e12)


@dataclass(frozen=True)
class Efficiency:
    """Fraction of the floor rate each class reaches, and fixed times. gemm: dense weight GEMMs (attention
    projections, dense MLP, shared expert, router, lm_head); moe: routed experts (grouped GEMM and its
    dispatch); attn: the attention kernel vs its roofline. overhead_s per forward, layer_s per layer: fixed
    DEVICE time (kernel latencies); host_s per forward + host_layer_s per MoE layer: the host's time to issue
    the eager forward (Python + launches, what CUDA graphs remove), which overlaps the device time, so a forward
    takes max(host, device); draft_overhead_s + draft_request_s * batch: the speculative step's fixed time
    outside verify beyond the drafter's modeled work, the build and accept + compact (eager: launches, and
    host work per request)."""
    gemm: float
    moe: float
    attn: float
    overhead_s: float
    layer_s: float = 0.0
    draft_overhead_s: float = 0.0
    label: str = ""
    host_s: float = 0.0
    host_layer_s: float = 0.0
    draft_request_s: float = 0.0


# Today's engine before any fit: attention at 50 % (the kdbench kernel, device/h200_facts.md), the rest fitted.
SERVING = Efficiency(gemm=0.85, moe=0.70, attn=0.75, overhead_s=30e-6, layer_s=0.0, draft_overhead_s=10e-6,
                     label="serving-grade (modeled: CUDA graphs, GEMV at 85 % of copy bandwidth, grouped MoE "
                           "at 70 %, attention at FlashInfer's measured 75 %)")


@dataclass(frozen=True)
class Floors:
    """Seconds at peak per class (max of compute and memory time) and the bytes / FLOPs behind them."""
    gemm_s: float
    moe_s: float
    attn_s: float
    bytes: float
    flops: float
    experts: float       # distinct routed experts per MoE layer
    layers: int
    moe_layers: int = 0


def _roof(flops: float, nbytes: float, hw: Hardware) -> float:
    return max(flops / hw.peak_flops, nbytes / hw.mem_bw)


def attn_proj_params(cfg: ModelConfig) -> int:
    """Per layer: q path, kv_a, the absorbed W_UK / W_UV (per-row matmuls against wkv_b), wo."""
    h, dc = cfg.n_heads, cfg.kv_lora_rank
    q = (cfg.q_lora_rank * cfg.hidden + h * cfg.qk_head_dim * cfg.q_lora_rank if cfg.q_lora_rank
         else h * cfg.qk_head_dim * cfg.hidden)
    return q + cfg.kv_dim * cfg.hidden + h * (cfg.qk_nope_dim + cfg.v_head_dim) * dc + cfg.hidden * h * cfg.v_head_dim


def uniform_experts(cfg: ModelConfig, tokens: float) -> float:
    """Expected distinct experts per MoE layer when `tokens` rows route uniformly (experts.uniform_experts)."""
    return experts.uniform_experts(cfg.n_routed_experts, cfg.n_experts_per_tok, tokens)


@dataclass(frozen=True)
class ExpertCurve:
    """Measured distinct experts per MoE layer at (batch, rows) points, interpolated bilinearly in
    (log2 batch, log2 rows) and clamped to the measured range; None of points = the uniform formula."""
    points: tuple[tuple[int, int, float], ...] = ()   # (batch, rows per request, experts)
    source: str = "uniform routing"

    def __call__(self, cfg: ModelConfig, batch: int, rows: int) -> float:
        if not self.points:
            return uniform_experts(cfg, batch * rows)
        return min(_bilinear(self.points, batch, rows), cfg.n_routed_experts)


def _bilinear(points, batch: int, rows: int) -> float:
    bs, rs = sorted({p[0] for p in points}), sorted({p[1] for p in points})
    table = {(b, r): e for b, r, e in points}

    def bracket(xs, x):
        x = min(max(x, xs[0]), xs[-1])
        hi = next(i for i, v in enumerate(xs) if v >= x)
        lo = max(hi - 1, 0)
        span = math.log2(xs[hi]) - math.log2(xs[lo])
        return xs[lo], xs[hi], (math.log2(x) - math.log2(xs[lo])) / span if span else 0.0

    b0, b1, fb = bracket(bs, batch)
    r0, r1, fr = bracket(rs, rows)
    corner = lambda b, r: table.get((b, r), math.nan)  # noqa: E731
    top = corner(b0, r0) * (1 - fr) + corner(b0, r1) * fr
    bot = corner(b1, r0) * (1 - fr) + corner(b1, r1) * fr
    return top * (1 - fb) + bot * fb


def floors(cfg: ModelConfig, batch: int, rows: int, ctx: int, *, experts: ExpertCurve = ExpertCurve(),
           hw: Hardware = H200) -> Floors:
    """The target forward of batch x rows new rows over ctx committed rows (AR: rows = 1)."""
    M, d = batch * rows, cfg.hidden
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    n_dense = cfg.n_layers - n_moe
    pa = attn_proj_params(cfg)
    mi, k = cfg.moe_intermediate, cfg.n_experts_per_tok
    dense_p = 3 * d * cfg.intermediate
    moe_dense_p = 3 * d * mi * cfg.n_shared_experts + cfg.n_routed_experts * d     # shared expert + router
    lm_p = cfg.vocab_size * d
    act = M * d * BF16 * 2                                                         # in + out of one GEMM
    g_flops = 2 * M * (cfg.n_layers * pa + n_dense * dense_p + n_moe * moe_dense_p + lm_p)
    g_bytes = BF16 * (cfg.n_layers * pa + n_dense * dense_p + n_moe * moe_dense_p + lm_p) \
        + act * (5 * cfg.n_layers + 3 * n_dense + 3 * n_moe) + M * cfg.vocab_size * LOGIT_BYTES
    e = experts(cfg, batch, rows) if n_moe else 0.0
    m_flops = n_moe * 2 * M * k * 3 * d * mi
    m_bytes = n_moe * (e * 3 * d * mi * BF16 + M * k * (6 * d + 3 * mi) * BF16)      # weights + dispatch
    keys = ctx + rows
    per_key = 2 * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim)                         # 2176 for K2
    a_flops = cfg.n_layers * batch * cfg.n_heads * rows * keys * per_key
    a_bytes = cfg.n_layers * batch * (keys * cfg.kv_dim + rows * cfg.n_heads * (cfg.kv_dim + cfg.kv_lora_rank)) * BF16
    return Floors(_roof(g_flops, g_bytes, hw), _roof(m_flops, m_bytes, hw), _roof(a_flops, a_bytes, hw),
                  g_bytes + m_bytes + a_bytes, g_flops + m_flops + a_flops, e, cfg.n_layers, n_moe)


def forward_time(f: Floors, eff: Efficiency) -> float:
    return max(host_time(f, eff), device_time(f, eff))


def host_time(f: Floors, eff: Efficiency) -> float:
    return eff.host_s + eff.host_layer_s * f.moe_layers


def device_time(f: Floors, eff: Efficiency) -> float:
    return eff.overhead_s + eff.layer_s * f.layers + work_time(f, eff)


def work_time(f: Floors, eff: Efficiency) -> float:
    """The floors over the efficiencies, without the fixed overheads."""
    return f.gemm_s / eff.gemm + f.moe_s / eff.moe + f.attn_s / eff.attn


# ------------------------------------------------------------------ the stages around verify

# kdbench's CUDA tree build on the H200 (device/h200_facts.md, 2026-12-01): (batch, budget, V, seconds)
BUILD_MEASURED = ((1, 64, 163840, 0.167e-3), (32, 256, 163840, 0.441e-3), (64, 1024, 163840, 1.71e-3),
                  (8, 64, 32000, 0.110e-3))
ACCEPT_S, COMPACT_S = 0.12e-3, 0.006e-3   # cuda accept / compact, batch 8, B = 64 (plans/0003, 2026-11-29)


def build_time(batch: int, budget: int, vocab: int, depth: int = 15) -> float:
    """t = a + b * (batch * L * V) + c * (batch * budget): the vocabulary pass and the heap, least squares
    over BUILD_MEASURED (4 points, 3 unknowns; the fit's residuals are in plans/0008)."""
    A = np.array([[1.0, b * depth * v, b * n] for b, n, v, _ in BUILD_MEASURED])
    y = np.array([t for *_, t in BUILD_MEASURED])
    a, bv, c = np.linalg.lstsq(A, y, rcond=None)[0]
    return float(a + bv * batch * depth * vocab + c * batch * budget)


def drafter_floors(dc: DrafterConfig, cfg: ModelConfig, batch: int, ctx: int, hw: Hardware = H200) -> Floors:
    """One block-drafter forward: batch x (L + 1) block rows through its layers, its context K/V projection
    of the committed rows not counted (a few rows per step), the target's lm_head over batch x L rows and
    the float32 logits the tree build reads."""
    M, T = batch * dc.block_size, dc.block_size
    p = sum(math.prod(s) for n, s in drafter_shapes(dc).items() if len(s) == 2 and n != "fc")
    lm_p = cfg.vocab_size * dc.hidden
    flops = 2 * M * p + 2 * batch * dc.depth * lm_p
    nbytes = BF16 * (p + lm_p) + batch * dc.depth * cfg.vocab_size * 4 + M * dc.hidden * BF16 * 10 * dc.n_layers
    a_flops = dc.n_layers * batch * dc.n_heads * T * (ctx + T) * 4 * dc.head_dim
    a_bytes = dc.n_layers * batch * (ctx + T) * 2 * dc.n_kv_heads * dc.head_dim * BF16
    return Floors(_roof(flops, nbytes, hw), 0.0, _roof(a_flops, a_bytes, hw), nbytes + a_bytes, flops + a_flops,
                  0.0, dc.n_layers)


@dataclass(frozen=True)
class CostSetting:
    """Which model, context, efficiencies, expert curve and hardware a modeled step time comes from."""
    cfg: ModelConfig
    ctx: int
    eff: Efficiency
    experts: ExpertCurve = ExpertCurve()
    hw: Hardware = H200


def default_drafter(cfg: ModelConfig, depth: int = 15) -> DrafterConfig:
    """The drafter a modeled step charges: the trained pair's own shape for kdbench-pair (pair.DRAFTER_SHAPE,
    plans/0007), else the block drafter scaled to the target."""
    extra = DRAFTER_SHAPE if cfg.name == "kdbench-pair" else {}
    return DrafterConfig.for_target(cfg, block_size=depth + 1, **extra)


def draft_time(dc: DrafterConfig, cs: CostSetting, batch: int) -> float:
    return (cs.eff.draft_overhead_s + cs.eff.draft_request_s * batch
            + work_time(drafter_floors(dc, cs.cfg, batch, cs.ctx, cs.hw), cs.eff))


@dataclass(frozen=True)
class StepCost:
    seconds: float
    verify_s: float
    draft_s: float
    build_s: float
    other_s: float       # accept + compact
    experts: float       # distinct routed experts per MoE layer in the verify
    bytes: float         # bytes the verify forward moves
    rows: int


def ar_step(cs: CostSetting, batch: int) -> StepCost:
    f = floors(cs.cfg, batch, 1, cs.ctx, experts=cs.experts, hw=cs.hw)
    t = forward_time(f, cs.eff)
    return StepCost(t, t, 0.0, 0.0, 0.0, f.experts, f.bytes, 1)


def spec_step(cs: CostSetting, batch: int, nodes: int, drafter: DrafterConfig | None = None) -> StepCost:
    """Draft + build + verify of nodes + 1 rows per request + accept + compact. drafter: the block drafter's
    config (default default_drafter(cfg), L = 15)."""
    dc = drafter or default_drafter(cs.cfg)
    f = floors(cs.cfg, batch, nodes + 1, cs.ctx, experts=cs.experts, hw=cs.hw)
    verify = forward_time(f, cs.eff)
    draft = draft_time(dc, cs, batch)
    build = build_time(batch, nodes, cs.cfg.vocab_size, dc.depth) if nodes > 0 else 0.0
    other = ACCEPT_S + COMPACT_S
    return StepCost(verify + draft + build + other, verify, draft, build, other, f.experts, f.bytes, nodes + 1)
