"""Expected distinct routed experts under uniform routing (torch-free: the report and the link cost model
import it). plans/0008: the verify's MoE weight traffic follows the distinct experts its rows touch."""
from __future__ import annotations


def uniform_experts(n_experts: int, top_k: int, tokens: float) -> float:
    """E (1 - (1 - k/E)^tokens): each of `tokens` rows picks k of E experts uniformly (a row's k picks are
    distinct; rows independent). 0 for a model without routed experts."""
    if n_experts <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)
