"""numpy float64 references: the truth that every kernel, the torch model and the engine are judged by.

Rules: numpy only (tests/test_references_no_torch.py proves no torch import), float64, loops allowed,
readable over fast. One module per kernel family (tree_build, tree_accept, kv_compact,
tree_verify_mla) plus the model pieces (mla, moe, model, model_config).
"""
