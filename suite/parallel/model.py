"""ShardedTransformer: the target's forward on one rank of a tensor-parallel (MLA heads, dense MLP, "tp"
experts) or tensor + expert-parallel ("ep") group. Same forward() as Transformer (prefill, AR decode, tree
verify), same outputs on every rank; the collectives per layer are listed in plans/0011-multi-gpu.md.
"""
from __future__ import annotations


import torch

from kdbench.model.moe import moe_forward, swiglu
from kdbench.model.transformer import Transformer
from kdbench.model.weights import check_weights, iter_weights
from kdbench.references.model_config import ModelConfig
from kdbench.timing import stamp

from .comm import Comm
from .ep_moe import ep_moe_forward
from .shard import check_divisible, local_config, shard_weights


class ShardedTransformer(Transformer):
    """One rank's slice of a Transformer; `comm` carries the process group (and the collective timing)."""

    def __init__(self, cfg: ModelConfig, full_weights, comm: Comm, parallel: str, *, exact_dispatch: bool = False,
                 **kw):
        """full_weights: the whole model's dict (checked, then sharded), or an iterable of (name, full tensor)
        sharded one at a time (weights.iter_weights: the rank never holds the whole model; `drawn`)."""
        if isinstance(full_weights, dict):
            check_weights(cfg, full_weights)
        if kw.get("batch_invariant"):
            raise ValueError("the sharded model has no batch-invariant mode (plans/0010 is one process)")
        reason = check_divisible(cfg, comm.world, parallel)
        if reason:
            raise ValueError(reason)
        self.full_cfg, self.comm, self.parallel, self.exact_dispatch = cfg, comm, parallel, exact_dispatch
        local = local_config(cfg, comm.world, parallel)
        w = shard_weights(cfg, full_weights, comm.rank, comm.world, parallel)
        if parallel == "tp":
            super().__init__(local, w, **kw)         # every local shape is the local config's
        else:                                        # ep: E/n experts under a config that routes over all E
            self._init_unchecked(local, w, **kw)
        self.layer_marks: list = []                  # (layer, start, end) of each layer while comm.timing

    @classmethod
    def drawn(cls, cfg: ModelConfig, seed: int, comm: Comm, parallel: str, device, dtype, **kw) -> "ShardedTransformer":
        """The rank's slice of Transformer.random(cfg, seed): each weight drawn (same order and values) and cut
        at once, so a rank's peak is its shards plus the largest full tensor, not the whole model."""
        return cls(cfg, iter_weights(cfg, seed, device, dtype), comm, parallel, **kw)

    def _init_unchecked(self, local: ModelConfig, w: dict, **kw) -> None:
        """Transformer's checks see full-E meta stand-ins for the experts; the real E/n slices replace them."""
        experts = {k: v for k, v in w.items() if ".experts." in k}
        stand_in = {k: torch.empty((local.n_routed_experts,) + tuple(v.shape[1:]), dtype=v.dtype, device="meta")
                    for k, v in experts.items()}
        super().__init__(local, {**w, **stand_in}, **kw)
        self.w = {**self.w, **experts}

    def _attention(self, layer, x, positions, cache, past_lens, visible, anc, naive, attn, S) -> torch.Tensor:
        """The rank's heads (the latent row written to the replicated cache is identical on every rank),
        wo's row-parallel partial sum, then one all-reduce."""
        self.comm.layer = layer
        self._mark(layer, "start")
        return self.comm.all_reduce(super()._attention(layer, x, positions, cache, past_lens, visible, anc,
                                                       naive, attn, S))

    def _ffn(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        cfg, w = self.cfg, self.w
        if not cfg.is_moe_layer(layer):
            p = f"layers.{layer}.mlp."
            y = self.comm.all_reduce(swiglu(x, w[p + "w1"], w[p + "w2"], w[p + "w3"]))
        elif self.parallel == "tp":
            y = self.comm.all_reduce(moe_forward(w, cfg, layer, x.reshape(B * T, d), self.moe_dispatch)).view(B, T, d)
        else:
            y = self._ep_ffn(layer, x.reshape(B * T, d)).view(B, T, d)
        self._mark(layer, "end")
        return y

    def _ep_ffn(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Token shard r of the (replicated) rows through expert parallelism, then an all-gather."""
        world, rank = self.comm.world, self.comm.rank
        n = x.shape[0]
        per = -(-n // world)                                     # rows per rank, the last one zero-padded
        pad = torch.cat((x, x.new_zeros(per * world - n, x.shape[1]))) if per * world != n else x
        y = ep_moe_forward(self.w, self.cfg, layer, pad[rank * per:(rank + 1) * per], self.comm, self.moe_dispatch,
                           self.exact_dispatch)
        return self.comm.all_gather(y)[:n]

    def _mark(self, layer: int, what: str) -> None:
        """Layer boundaries for the compute/communication split (events on a GPU, ns on the CPU)."""
        if not self.comm.timing:
            return
        self.layer_marks.append((layer, what, stamp(self.device.type == "cuda")))
