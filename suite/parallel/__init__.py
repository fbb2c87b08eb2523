"""Multi-process execution of the target: tensor-parallel MLA, tensor- or expert-parallel MoE, the launcher,
link modes, communication microbenchmarks and the link cost model (plans/0011-multi-gpu.md)."""
