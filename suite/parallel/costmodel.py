"""The link cost model (plans/0011-multi-gpu.md, MODELED, not measured): one sharded forward's time per rank =
sum over layers of compute (roofline bytes / flops of the rank's slice, divided by an efficiency) +
communication (the collectives messages.py lists, each alpha + bytes x factor / busbw, nccl-tests' factors).
Every hardware and link figure is an assumption, listed in ASSUMPTIONS with its source; the 2x H200 pair
points measured here calibrate the NVLink and host-staged PCIe curves."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kdbench.experts import uniform_experts
from kdbench.references.model_config import ModelConfig, get_preset

from .messages import bus_factor, layer_messages


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_Bps: float            # memory bandwidth a serving kernel reaches (B/s)
    flops: float              # dense bf16 tensor FLOP/s
    efficiency: float         # fraction of the roofline floor the step's kernels reach


@dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float            # per-collective latency (small messages)
    busbw_Bps: float          # bus bandwidth at large messages (nccl-tests' busbw)

    def seconds(self, op: str, nbytes: int, n: int) -> float:
        """nccl-tests' inverse: time = alpha + size x factor / busbw (0 at one rank: no collective)."""
        return 0.0 if n == 1 else self.alpha_s + nbytes * bus_factor(op, n) / self.busbw_Bps


@dataclass(frozen=True)
class Weights:
    """Bytes per parameter: routed experts (INT4 + group-32 bf16 scales in K2-Thinking and later), the rest."""
    expert: float = 0.5 + 2 / 32
    other: float = 2.0


MEASURED_WEIGHTS = Weights(expert=2.0)   # kdbench's own sharded runs: random bf16 experts, not INT4


H200 = Gpu("H200", hbm_Bps=4.25e12, flops=790e12, efficiency=0.5)
RTX_PRO_6000 = Gpu("RTX PRO 6000 Blackwell", hbm_Bps=1.6e12, flops=450e12, efficiency=0.5)
NVLINK_H200_8 = Link("8x H200 NVLink4 + NVSwitch", alpha_s=15e-6, busbw_Bps=360e9)
PCIE5_P2P_8 = Link("8x PCIe Gen5 P2P", alpha_s=24e-6, busbw_Bps=40e9)
PCIE_HOST_STAGED = Link("PCIe host-staged (NCCL_P2P_DISABLE=1)", alpha_s=40e-6, busbw_Bps=25e9)
MEASURED_PAIR = {   # 2x H200 on one host, NCCL all-reduce bf16 busbw (GB/s) by size (shared/device/h200_facts.md)
    "nvlink": {1 << 20: 21.5, 16 << 20: 222.0, 256 << 20: 300.0},
    "pcie": {1 << 20: 16.5, 16 << 20: 27.6, 256 << 20: 28.4},
}

ASSUMPTIONS = (
    "MODELED, not measured: no 8-GPU machine was used; every figure below is an input, not a result.",
    "H200: 4.25 TB/s HBM and 790 TF/s bf16 (measured ceilings on one H200 here; datasheet 4.8 TB/s, 989 TF/s).",
    "RTX PRO 6000 Blackwell: 1.6 TB/s of its 1.79 TB/s GDDR7 datasheet figure (same ~89 % ratio as the H200); "
    "450 TF/s bf16 dense (recall of the ~500 TF/s datasheet class, not measured); 96 GB per GPU.",
    "Kernel efficiency 0.5 of the roofline floor for every layer on both GPUs (kdbench's eager verify reached "
    "~0.43 of its floor at batch 8 on the H200; AR ~0.17; serving-grade kernels reach more).",
    "NVLink 8x H200 (HGX, NVSwitch): busbw 360 GB/s, alpha 15 us (2x H200 pair measured here: all-reduce "
    "busbw 300 GB/s at 256 MiB, 222 at 16 MiB; alpha-beta fit of those points ~21 us incl. launch).",
    "PCIe Gen5 P2P 8x RTX PRO 6000: busbw 40 GB/s (x16 Gen5 ~50 GB/s per direction effective, shared root "
    "complexes), alpha 24 us (public: NCCL all-reduce ~24 us for small messages on 8x RTX PRO 6000).",
    "PCIe host-staged (NCCL_P2P_DISABLE=1): busbw 25 GB/s, alpha 40 us (2x H200 measured busbw 28.4 GB/s).",
    "Sharding: MLA heads tensor-parallel with the latent cache replicated (every rank reads all of it); dense "
    "layer tensor-parallel; experts expert-parallel, balanced (each rank holds E/n and touches E_d/n of them); "
    "shared expert replicated; lm_head vocabulary-parallel with a local argmax (tiny gather, ignored).",
    "All-to-all bytes: exact per-destination sizes (k slots x d x 2 B per token, bf16 both ways); kdbench's "
    "capturable fixed-capacity buffers send n x more (see plans/0011) and are not what this models.",
    "Experts touched per layer: uniform routing E (1 - (1 - k/E)^N) over N verify rows (an upper bound: real "
    "sibling routing is correlated; random weights here touched 207 of 384 at N = 520).",
    "No overlap of communication with compute; one collective at a time; embedding and norms ignored.",
    "Weights: routed experts INT4 with group-32 scales (0.5625 B/param, K2-Thinking style), all else bf16.",
    "DDTree: tau (tokens committed per verify incl. the bonus) and the drafter's step time are inputs.",
)


def layer_compute_s(cfg: ModelConfig, layer: int, gpu: Gpu, n: int, *, batch: int, T: int, ctx: int,
                    w: Weights) -> float:
    """Roofline floor / efficiency of one layer on one rank: N = batch * T rows at context ctx."""
    d, H, dc, dr = cfg.hidden, cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_dim
    rows = batch * T
    attn_w = (cfg.q_lora_rank * d + (dc + dr) * d) + (H * cfg.qk_head_dim * cfg.q_lora_rank
                                                      + H * (cfg.qk_nope_dim + cfg.v_head_dim) * dc
                                                      + d * H * cfg.v_head_dim) / n
    kv_bytes = batch * (ctx + T) * (dc + dr) * 2                   # replicated latent: every rank reads it all
    flops = 2 * rows * attn_w + 2 * (2 * dc + dr) * (H / n) * T * (ctx + T) * batch
    nbytes = attn_w * w.other + kv_bytes
    if cfg.is_moe_layer(layer):
        per_expert = 3 * d * cfg.moe_intermediate
        touched = uniform_experts(cfg.n_routed_experts, cfg.n_experts_per_tok, rows) / n
        nbytes += touched * per_expert * w.expert + cfg.n_shared_experts * per_expert * w.other
        flops += 2 * per_expert * rows * (cfg.n_experts_per_tok + cfg.n_shared_experts) / n
    else:
        nbytes += 3 * d * cfg.intermediate / n * w.other
        flops += 2 * 3 * d * cfg.intermediate / n * rows
    return max(nbytes / gpu.hbm_Bps, flops / gpu.flops) / gpu.efficiency


def _exact_a2a(cfg: ModelConfig, n: int, rows: int) -> list[tuple[str, int]]:
    """Dispatch + combine with exact sizes: each rank sends its rows/n tokens' k slots (bf16) each way."""
    per_rank = math.ceil(rows / n) * cfg.n_experts_per_tok * cfg.hidden * 2
    return [("all_to_all", per_rank), ("all_to_all", per_rank)]


def layer_comm_s(cfg: ModelConfig, layer: int, link: Link, n: int, rows: int) -> float:
    msgs = layer_messages(cfg, layer, n, "ep", rows, 2)
    if cfg.is_moe_layer(layer):
        msgs = [m for m in msgs if m[0] != "all_to_all"] + _exact_a2a(cfg, n, rows)
    return sum(link.seconds(op, b, n) for op, b in msgs)


def step_s(cfg: ModelConfig, gpu: Gpu, link: Link, n: int, *, batch: int, T: int, ctx: int,
           w: Weights = Weights()) -> dict:
    """{compute_s, comm_s, lm_head_s, total_s} of one forward of batch x T rows on n ranks."""
    rows = batch * T
    compute = sum(layer_compute_s(cfg, i, gpu, n, batch=batch, T=T, ctx=ctx, w=w) for i in range(cfg.n_layers))
    comm = sum(layer_comm_s(cfg, i, link, n, rows) for i in range(cfg.n_layers))
    lm = max(cfg.vocab_size * cfg.hidden * w.other / n / gpu.hbm_Bps,
             2 * rows * cfg.vocab_size * cfg.hidden / n / gpu.flops) / gpu.efficiency
    return {"compute_s": compute, "comm_s": comm, "lm_head_s": lm, "total_s": compute + comm + lm}


def memory_ok(cfg: ModelConfig, n: int, gpu_bytes: float, w: Weights = Weights()) -> tuple[bool, float]:
    """(fits in 90 % of gpu_bytes, GB per GPU) for the weights alone under this file's sharding."""
    d, H, moe = cfg.hidden, cfg.n_heads, cfg.n_layers - cfg.n_dense_layers
    per_expert = 3 * d * cfg.moe_intermediate
    attn_rep = (cfg.q_lora_rank + cfg.kv_dim) * d                              # wq_a, wkv_a: replicated
    attn_tp = H * (cfg.qk_head_dim * cfg.q_lora_rank + (cfg.qk_nope_dim + cfg.v_head_dim) * cfg.kv_lora_rank
                   + d * cfg.v_head_dim)
    params_other = (cfg.n_layers * (attn_rep + attn_tp / n) + cfg.n_dense_layers * 3 * d * cfg.intermediate / n
                    + moe * cfg.n_shared_experts * per_expert + cfg.vocab_size * d * (1 + 1 / n))
    total = moe * cfg.n_routed_experts / n * per_expert * w.expert + params_other * w.other
    return total < 0.9 * gpu_bytes, total / 1e9


def calibrated_efficiency(measured_s: float, cfg: ModelConfig, gpu: Gpu, *, batch: int, T: int, ctx: int,
                          w: Weights = MEASURED_WEIGHTS) -> float:
    """The efficiency that makes the one-rank model equal a measured forward of the same shape (floor / measured);
    kdbench's measured runs hold bf16 experts (random weights), hence the default."""
    ideal = dataclasses.replace(gpu, efficiency=1.0)
    floor = step_s(cfg, ideal, NVLINK_H200_8, 1, batch=batch, T=T, ctx=ctx, w=w)["total_s"]
    return floor / measured_s


def compare_8gpu(batch: int = 1, budget: int = 64, ctx: int = 4096, tau: float = 4.0, draft_s: float = 1.0e-3,
                 cfg: ModelConfig | None = None, efficiency: float | None = None) -> list[dict]:
    """The modeled 8-GPU comparison for full-size K2 with DDTree: per system the AR step, the verify step,
    tokens/s per request for AR and DDTree, and the speculative speedup tau x t_AR / (t_verify + t_draft).
    efficiency: override both GPUs' kernel efficiency (e.g. calibrated from a measured H200 forward)."""
    cfg = cfg or get_preset("kimi-k2")
    systems = [("8x H200, NVLink", H200, NVLINK_H200_8, 141e9),
               ("8x RTX PRO 6000 Blackwell, PCIe Gen5 P2P", RTX_PRO_6000, PCIE5_P2P_8, 96e9),
               ("8x RTX PRO 6000 Blackwell, PCIe host-staged", RTX_PRO_6000, PCIE_HOST_STAGED, 96e9)]
    out = []
    for name, gpu, link, mem in systems:
        gpu = gpu if efficiency is None else dataclasses.replace(gpu, efficiency=efficiency)
        ar = step_s(cfg, gpu, link, 8, batch=batch, T=1, ctx=ctx)
        ver = step_s(cfg, gpu, link, 8, batch=batch, T=budget + 1, ctx=ctx)
        fits, gb = memory_ok(cfg, 8, mem)
        spec_step = ver["total_s"] + draft_s
        out.append({"system": name, "gpu": gpu.name, "link": link.name, "weights_GB_per_gpu": gb, "fits": fits,
                    "ar": ar, "verify": ver, "ar_tok_s": 1 / ar["total_s"], "ddtree_tok_s": tau / spec_step,
                    "speedup": tau * ar["total_s"] / spec_step, "comm_share_ar": ar["comm_s"] / ar["total_s"],
                    "comm_share_verify": ver["comm_s"] / ver["total_s"],
                    "inputs": {"batch": batch, "budget": budget, "ctx": ctx, "tau": tau, "draft_s": draft_s,
                               "gpu": dataclasses.asdict(gpu), "link_model": dataclasses.asdict(link)}})
    return out
