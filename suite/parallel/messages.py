"""The collectives one sharded forward sends, per layer, in nccl-tests' size convention (comm.py): the
analytic list the cost model uses, checked against what a run records. No torch: the report imports it."""
from __future__ import annotations

from kdbench.references.model_config import ModelConfig


def capacity(n_local_tokens: int, k: int, local_experts: int) -> int:
    """Slots one source can send one rank at most: each token picks k distinct experts, <= E/n live there."""
    return n_local_tokens * min(k, local_experts)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw: 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def layer_messages(cfg: ModelConfig, layer: int, world: int, parallel: str, rows: int, elem: int
                   ) -> list[tuple[str, int]]:
    """(op, bytes) of one layer for `rows` = B * T tokens; elem = bytes per activation element."""
    d = cfg.hidden
    out = [("all_reduce", rows * d * elem)]                      # attention: wo's row-parallel partial sums
    if not cfg.is_moe_layer(layer) or parallel == "tp":
        return out + [("all_reduce", rows * d * elem)]           # dense MLP / tp experts: w2's partial sums
    per = -(-rows // world)
    cap = capacity(per, cfg.n_experts_per_tok, cfg.n_routed_experts // world)
    return out + [("all_to_all", world * cap * d * elem),          # dispatch: token rows
                  ("all_to_all", world * cap * 8),                 # dispatch: local expert id per slot (int64)
                  ("all_to_all", cfg.n_routed_experts * 4),        # per-rank expert counts (int32)
                  ("all_to_all", world * cap * d * elem),          # combine: expert outputs back
                  ("all_gather", world * per * d * elem)]          # the token shards back to every rank


def step_messages(cfg: ModelConfig, world: int, parallel: str, rows: int, elem: int) -> list[tuple[int, str, int]]:
    """(layer, op, bytes) for the whole forward, in the order they are sent."""
    return [(i, op, b) for i in range(cfg.n_layers) for op, b in layer_messages(cfg, i, world, parallel, rows, elem)]
