"""kdbench: benchmarking and kernel validation for DDTree speculative decoding on MLA+MoE models."""

__version__ = "0.1.0"
