"""ModelConfig (a frozen dataclass) and the named presets shared by the references and the torch model.

Pure Python: no numpy, no torch. Lookup is by exact name; a miss lists the valid names.
Field names follow DeepSeek-V3's HF config where one exists (see ../shared/notes/mla_moe.md §3).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden: int                 # d
    n_layers: int
    n_dense_layers: int         # first_k_dense_replace: the first layers use a dense SwiGLU MLP
    n_heads: int                # H
    q_lora_rank: int            # 0 = a direct wq [H*(nope+rope), d]
    kv_lora_rank: int           # d_c (512 in the real models)
    qk_nope_dim: int            # d_n
    qk_rope_dim: int            # d_r
    v_head_dim: int             # d_v
    intermediate: int           # dense MLP width
    moe_intermediate: int       # per-expert width
    n_routed_experts: int
    n_shared_experts: int
    n_experts_per_tok: int      # top-k
    n_group: int
    topk_group: int
    routed_scaling: float
    norm_topk_prob: bool = True
    rope_theta: float = 10000.0
    rope_factor: float = 1.0    # YaRN factor; 1.0 = no YaRN
    original_max_pos: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    max_seq_len: int = 4096 * 4
    rms_eps: float = 1e-6

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    @property
    def kv_dim(self) -> int:
        """Cached values per token per layer: the normalized latent plus the rotated rope key."""
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def yarn_enabled(self) -> bool:
        return self.rope_factor > 1.0

    @property
    def softmax_scale(self) -> float:
        """mscale^2 / sqrt(qk_nope + qk_rope), as HF applies it whenever YaRN is configured."""
        scale = self.qk_head_dim ** -0.5
        if self.yarn_enabled:
            m = 1.0 + 0.1 * self.mscale_all_dim * math.log(self.rope_factor)
            scale *= m * m
        return scale

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.n_dense_layers


_KIMI_K2 = ModelConfig(
    name="kimi-k2", vocab_size=163840, hidden=7168, n_layers=61, n_dense_layers=1, n_heads=64,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
    intermediate=18432, moe_intermediate=2048, n_routed_experts=384, n_shared_experts=1,
    n_experts_per_tok=8, n_group=1, topk_group=1, routed_scaling=2.827, rope_theta=50000.0,
    rope_factor=32.0, original_max_pos=4096, beta_fast=1.0, beta_slow=1.0, max_seq_len=131072,
)

_DEEPSEEK_V3 = ModelConfig(
    name="deepseek-v3", vocab_size=129280, hidden=7168, n_layers=61, n_dense_layers=3, n_heads=128,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
    intermediate=18432, moe_intermediate=2048, n_routed_experts=256, n_shared_experts=1,
    n_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling=2.5, rope_theta=10000.0,
    rope_factor=40.0, original_max_pos=4096, beta_fast=32.0, beta_slow=1.0, max_seq_len=163840,
)

# Tiny presets run the whole engine on CPU in seconds. tiny-moe-groups exercises group-limited routing.
_TINY = ModelConfig(
    name="tiny", vocab_size=256, hidden=64, n_layers=2, n_dense_layers=1, n_heads=4,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
    intermediate=128, moe_intermediate=32, n_routed_experts=8, n_shared_experts=1,
    n_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling=2.827, rope_theta=50000.0,
    rope_factor=32.0, original_max_pos=64, beta_fast=1.0, beta_slow=1.0, max_seq_len=1024,
)
_TINY_GROUPS = dataclasses.replace(
    _TINY, name="tiny-groups", n_layers=3, n_dense_layers=1, q_lora_rank=0, n_routed_experts=16,
    n_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling=2.5, rope_theta=10000.0,
    rope_factor=40.0, beta_fast=32.0,
)

# The trained pair's target (weights ship in kdbench/data, plans/0007): DeepSeek-V3 routing (sigmoid + bias,
# 4 groups keep 2, top-2 of 8 experts, a shared expert) and the real latent width 512 + 64, so every CUDA
# kernel runs on it unchanged; 4 layers at d = 256 keep it under 16 MB in bf16 and trainable in minutes.
_PAIR = ModelConfig(
    name="kdbench-pair", vocab_size=4096, hidden=256, n_layers=4, n_dense_layers=1, n_heads=4,
    q_lora_rank=0, kv_lora_rank=512, qk_nope_dim=32, qk_rope_dim=64, v_head_dim=32,
    intermediate=512, moe_intermediate=128, n_routed_experts=8, n_shared_experts=1,
    n_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling=2.5, rope_theta=10000.0,
    max_seq_len=2048,
)

PRESETS: dict[str, ModelConfig] = {c.name: c for c in (_KIMI_K2, _DEEPSEEK_V3, _TINY, _TINY_GROUPS, _PAIR)}
_SLICE = re.compile(r"kimi-k2-slice-([1-9][0-9]*)")


def preset_names() -> list[str]:
    return sorted(PRESETS) + ["kimi-k2-slice-N (N >= 1)"]


def get_preset(name: str) -> ModelConfig:
    """Exact-name lookup; `kimi-k2-slice-N` is kimi-k2 with N layers (real widths, one GPU)."""
    if name in PRESETS:
        return PRESETS[name]
    m = _SLICE.fullmatch(name)
    if m:
        n = int(m.group(1))
        return dataclasses.replace(_KIMI_K2, name=name, n_layers=n, n_dense_layers=min(1, n))
    raise KeyError(f"unknown model preset {name!r}; valid presets: {', '.join(preset_names())}")
