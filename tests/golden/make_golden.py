"""Golden test vectors: writes tests/golden/<family>.kdtr from fixed seeds with the numpy references.
Run `python tests/golden/make_golden.py [OUT_DIR]` (default: this folder); the output is deterministic.

Files, one per family: tree_build, tree_accept, kv_compact, tree_verify_mla, moe_routing, model_forward.
Tensor names (KDTR, plans/0006-kdtr.md), in this order per case:
  `<case>.meta`        uint8: UTF-8 JSON (sorted keys) {"family", "case", "seed", "note", "params",
                       "tolerance"}; `seed` seeds np.random.default_rng for that case's inputs;
                       `params` holds what is not a tensor (a preset name);
  `<case>.in.<name>`   the inputs; scalars are 0-d (budget, past_len, scale, config fields); q, kv and
                       one logits case are tagged bf16 (raw bits, the kernel's own dtype);
  `<case>.out.<name>`  what COMPUTE[family](inputs, tags, params) returns with the current references.
`tolerance` = {out name: [atol, rtol]} for float outputs that pass through libm exp/log or BLAS, whose
last bits depend on the CPU's SIMD dispatch (numpy's AVX-512 exp/log, OpenBLAS DYNAMIC_ARCH kernels);
every output not listed, and every integer output, must match bit for bit. Units: float64 values.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kdbench import kdtr
from kdbench.references import kv_compact as kvc
from kdbench.references import model as ref_model
from kdbench.references import moe, tree_accept as acc, tree_build as tb, tree_verify_mla as tvm
from kdbench.references.model_config import get_preset

HERE = Path(__file__).resolve().parent
EPS64 = float(np.finfo(np.float64).eps)
LIBM_TOL = (1e-13, 64 * EPS64)  # a few ulps of libm differences carried through sums of O(10) terms
BLAS_TOL = (1e-11, 1e-11)       # float64 reassociation through matmul chains (model, attention)
NEG = -1e4                      # "impossible" logit: exp underflows to exactly 0 (ddtree.md §2.6)
BF16_NAN = 0x7FC0


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    seed: int
    note: str
    inputs: dict                                   # name -> array (bf16 as uint16 bits)
    bf16: tuple[str, ...] = ()                     # input names tagged bf16
    params: dict = field(default_factory=dict)     # JSON-able, not tensors
    tolerance: dict = field(default_factory=dict)  # out name -> (atol, rtol)


def _f(arr: np.ndarray, tag: str) -> np.ndarray:
    """Input values as float64 (bf16 bits widened exactly)."""
    return (kdtr.bf16_bits_to_f32(arr) if tag == "bf16" else np.asarray(arr)).astype(np.float64)


def _i(x) -> np.ndarray:
    return np.array(x, dtype=np.int64)


# ---------------------------------------------------------------------------------------- compute

def compute_tree_build(x: dict, tags: dict, params: dict) -> dict:
    logits, budget = _f(x["logits"], tags["logits"]), int(x["budget"])
    top_lp, top_tok = tb.topk_logprobs(logits, max(budget, 0))           # [L, K], K = min(budget, V)
    tree = tb.build_tree(logits, budget, int(x["root"]))
    pad = tb.pad_tree_arrays(tree, int(x["n_max"]))
    keys = ("tokens", "parents", "depths", "ranks", "scores", "first_child", "next_sibling", "bitmask", "n_nodes")
    return {"top_lp": top_lp, "top_tok": top_tok, **{k: pad[k] for k in keys}}


def _tree_from_padded(x: dict) -> tb.Tree:
    n = int(x["n_nodes"])
    return tb.Tree(tokens=x["tokens"][:n], parents=x["parents"][:n], depths=x["depths"][:n],
                   ranks=x["ranks"][:n], scores=x["scores"][:n])


def compute_tree_accept(x: dict, tags: dict, params: dict) -> dict:
    tree = _tree_from_padded(x)
    if "target_tokens" in x:                                             # greedy
        accepted, bonus = acc.accept_greedy(tree, x["target_tokens"][:tree.size])
        out = {}
    else:                                                                # sampled: every row, padding too
        sampled = acc.sample_per_node(x["target_probs"], x["uniforms"])  # [n_max]
        accepted, bonus = acc.accept_sampled(tree, x["target_probs"][:tree.size], x["uniforms"][:tree.size])
        out = {"sampled": sampled}
    return {**out, "accepted": accepted, "accept_len": _i(len(accepted)), "bonus": _i(bonus)}


def compute_kv_compact(x: dict, tags: dict, params: dict) -> dict:
    cache, new_len = kvc.compact_kv(x["cache"], int(x["past_len"]), x["accepted"])  # bits copied as-is
    return {"cache": cache, "new_len": _i(new_len)}


def compute_tree_verify_mla(x: dict, tags: dict, params: dict) -> dict:
    t = x["q"].shape[0]
    anc = tvm.unpack_anc_bits(x["anc_bits"], t)                          # [T, T] bool
    o_lat, lse = tvm.tree_verify_mla(_f(x["q"], tags["q"]), _f(x["kv"], tags["kv"]), int(x["past_len"]),
                                     anc, float(x["scale"]))
    return {"o_lat": o_lat, "lse": lse}                                  # [T, H, 512], [T, H] float64


def routing_config(x: dict, params: dict):
    """The preset named in params with the routing fields stored as 0-d tensors."""
    return dataclasses.replace(
        get_preset(params["preset"]), n_routed_experts=len(x["gate"]), n_group=int(x["n_group"]),
        topk_group=int(x["topk_group"]), n_experts_per_tok=int(x["n_experts_per_tok"]),
        norm_topk_prob=bool(x["norm_topk_prob"]), routed_scaling=float(x["routed_scaling"]))


def compute_moe_routing(x: dict, tags: dict, params: dict) -> dict:
    idx, weights = moe.route(x["x"], x["gate"], x["bias"], routing_config(x, params))
    return {"idx": idx, "weights": weights}                              # [N, k] int64, [N, k] float64


def compute_model_forward(x: dict, tags: dict, params: dict) -> dict:
    cfg = get_preset(params["preset"])
    weights = ref_model.init_weights(cfg, int(x["init_seed"]))
    out, cache = ref_model.prefill(weights, cfg, x["tokens"])
    res = {"prefill_logits": out.logits}                                 # [T, V]
    if "tree_tokens" in x:
        tree = ref_model.tree_verify(weights, cfg, x["tree_tokens"], x["tree_depths"], x["tree_visible"], cache)
        res["tree_logits"] = tree.logits                                 # [n+1, V]
    return res


COMPUTE = {"tree_build": compute_tree_build, "tree_accept": compute_tree_accept,
           "kv_compact": compute_kv_compact, "tree_verify_mla": compute_tree_verify_mla,
           "moe_routing": compute_moe_routing, "model_forward": compute_model_forward}


# ------------------------------------------------------------------------------------------ cases

def worked_logits(v: int = 40) -> np.ndarray:
    """ddtree.md §2.6: q1 on tokens 10..12, q2 on 20..22, q3 on 30..32; NEG elsewhere. [3, V] float32."""
    x = np.full((3, v), NEG)
    for d, (toks, q) in enumerate([((10, 11, 12), (.6, .3, .1)), ((20, 21, 22), (.7, .2, .1)),
                                   ((30, 31, 32), (.55, .35, .1))]):
        x[d, list(toks)] = np.log(q)
    return x.astype(np.float32)


def _tb(name, seed, note, logits, budget, root, n_max, bf16=False) -> Case:
    logits = kdtr.f32_to_bf16_bits(logits) if bf16 else np.asarray(logits, np.float32)
    return Case("tree_build", name, seed, note, {"logits": logits, "budget": _i(budget), "root": _i(root),
                "n_max": _i(n_max)}, ("logits",) if bf16 else (), tolerance={"top_lp": LIBM_TOL, "scores": LIBM_TOL})


def _tie_logits(rng, l: int, v: int) -> np.ndarray:
    """[L, V]: one token at 0, the others at NEG - {0, 1, 2}. exp(NEG) underflows, so lse = log(1) = 0 on
    every libm and every log-prob is an exact integer: score ties are exact on any machine."""
    x = NEG - rng.integers(0, 3, (l, v)).astype(np.float64)
    x[np.arange(l), rng.integers(0, v, l)] = 0.0
    return x


def tree_build_cases() -> list[Case]:
    r = lambda s: np.random.default_rng(s)  # noqa: E731
    neg = r(106).standard_normal((4, 9)) * 2
    neg[:, [2, 5, 6]] = -np.inf                                          # zero-probability tokens
    return [
        _tb("worked_example", 0, "ddtree.md §2.6, B=6, L=3: nodes 10,20,11,30,20,31", worked_logits(), 6, 7, 7),
        _tb("random_f32", 100, "L=15 V=64 B=40, N=65 (2 mask words, padding)",
            r(100).standard_normal((15, 64)) * 3, 40, 5, 65),
        _tb("random_bf16", 101, "bf16 logits (many equal values: tie rules), L=6 V=100 B=20",
            r(101).standard_normal((6, 100)) * 2, 20, 9, 24, bf16=True),
        _tb("tie_heavy", 102, "one logit 0, the rest -1e4 - {0,1,2}: lse = 0 exactly, integer scores, exact "
            "ties across depths, L=4 V=8 B=30", _tie_logits(r(102), 4, 8), 30, 1, 31),
        _tb("budget_0", 103, "budget 0: the root only, padded to 3 rows", r(103).standard_normal((3, 5)), 0, 4, 3),
        _tb("budget_1", 104, "budget 1: the argmax of depth 1", r(104).standard_normal((3, 5)), 1, 4, 2),
        _tb("v_lt_budget", 105, "V=3 < budget: all 12 prefixes of L=2, then padding",
            r(105).standard_normal((2, 3)), 20, 2, 21),
        _tb("neg_inf", 106, "-inf logits are never pushed: 6 tokens per depth, L=4, B=50", neg, 50, 0, 51),
        _tb("depth_1", 107, "L=1: a star of the top-B tokens", r(107).standard_normal((1, 33)), 8, 3, 9),
    ]


def _random_tree(seed: int, l: int, v: int, budget: int) -> tb.Tree:
    return tb.build_tree(np.random.default_rng(seed).standard_normal((l, v)) * 2, budget, 1)


def _padded_tree(tree: tb.Tree, n_max: int) -> dict:
    pad = tb.pad_tree_arrays(tree, n_max)
    keys = ("tokens", "parents", "depths", "ranks", "scores", "first_child", "next_sibling", "n_nodes")
    return {k: pad[k] for k in keys}


def _follow_targets(rng, tree: tb.Tree, n_max: int, v: int, p_follow: float) -> np.ndarray:
    """[n_max] target tokens: at each node, with probability p_follow, the token of a random child."""
    t = rng.integers(0, v, n_max)
    for node in range(tree.size):
        kids = np.flatnonzero(tree.parents == node)
        if len(kids) and rng.random() < p_follow:
            t[node] = tree.tokens[rng.choice(kids)]
    return t.astype(np.int64)


def _target_probs(rng, tree: tb.Tree, n_max: int, v: int) -> np.ndarray:
    """[n_max, V] float32 unnormalised probs: sparse noise (some exact zeros) plus mass on child tokens,
    halving with the child's rank (the target agrees with the draft's order, so walks go deep)."""
    p = rng.random((n_max, v)) ** 4 * (rng.random((n_max, v)) < 0.6)
    for node in range(tree.size):
        kids = np.flatnonzero(tree.parents == node)
        p[node, tree.tokens[kids]] += 8.0 * 0.5 ** tree.ranks[kids] * rng.random(len(kids))
    return p.astype(np.float32)


def tree_accept_cases() -> list[Case]:
    worked = tb.build_tree(worked_logits(), 6, 7)
    t_worked = _i([10, 20, 31, 0, 0, 0, 99])                             # path [0, 1, 2, 6], bonus 99
    cases = [Case("tree_accept", "greedy_worked", 0, "ddtree.md §2.6: accepted [0,1,2,6], bonus 99",
                  {**_padded_tree(worked, 7), "target_tokens": t_worked})]
    for name, seed, budget, n_max, p in (("greedy_deep", 200, 30, 33, 0.9), ("greedy_random", 201, 30, 31, 0.5),
                                         ("greedy_root_only", 202, 0, 2, 1.0)):
        rng, tree = np.random.default_rng(seed), _random_tree(seed, 5, 16, budget)
        cases.append(Case("tree_accept", name, seed, f"L=5 V=16 B={budget} N={n_max}, follow p={p}",
                          {**_padded_tree(tree, n_max), "target_tokens": _follow_targets(rng, tree, n_max, 16, p)}))
    for name, seed, budget, n_max in (("sampled_deep", 210, 30, 33), ("sampled_wide", 211, 60, 64)):
        rng, tree = np.random.default_rng(seed), _random_tree(seed, 5, 16, budget)
        cases.append(Case("tree_accept", name, seed, f"inverse CDF per node, L=5 V=16 B={budget} N={n_max}",
                          {**_padded_tree(tree, n_max), "target_probs": _target_probs(rng, tree, n_max, 16),
                           "uniforms": rng.random(n_max)}))
    probs = np.zeros((7, 40), np.float32)                               # [N, V], exact binary fractions
    probs[0, [10, 11]] = 0.5                                             # u=.5: t == c[10], strict < picks 11
    probs[1, [20, 21]] = [0.0, 1.0]                                      # u=0: zero-probability 20 is skipped
    probs[2, [30, 31]] = 0.5
    probs[3, [20, 21]] = [0.25, 0.75]                                    # u=.25: t == c[20] -> 21: not a child
    probs[4:, 5] = 1.0
    cases.append(Case("tree_accept", "sampled_boundary", 0, "t == c[j] exactly (strict <); accepted [0, 3], "
                      "bonus 21", {**_padded_tree(worked, 7), "target_probs": probs,
                                   "uniforms": np.array([0.5, 0.0, 0.3, 0.25, 0.9, 0.1, 0.7])}))
    return cases


def kv_compact_cases() -> list[Case]:
    out = []
    for name, seed, shape, past, keep, bf16 in (
            ("worked_keep", 300, (2, 16, 8), 5, [0, 1, 2, 6], False),
            ("bf16_kv_heads", 301, (2, 2, 3, 12, 6), 3, [0, 2, 5, 8], True),
            ("root_only", 302, (1, 6, 4), 4, [0], False),
            ("identity_chain", 303, (1, 9, 5), 0, [0, 1, 2, 3], False),
            ("past_0_deep", 304, (3, 20, 7), 0, [0, 3, 9, 17, 19], False)):
        rng = np.random.default_rng(seed)
        cache = rng.standard_normal(shape).astype(np.float32)           # [..., S, D]
        cache[..., past + keep[-1] + 1:, :] = np.nan                     # rows past the tree: never read
        cache = kdtr.f32_to_bf16_bits(cache) if bf16 else cache
        out.append(Case("kv_compact", name, seed, f"cache {list(shape)}, past {past}, keep {keep}",
                        {"cache": cache, "past_len": _i(past), "accepted": _i(keep)}, ("cache",) if bf16 else ()))
    return out


def _tvm_case(name: str, seed: int, tree: tb.Tree, n_pad: int, heads: int, past: int, tail: int) -> Case:
    """T = tree.size + n_pad rows (padding rows have no bits); kv has `tail` NaN rows after the tree."""
    rng = np.random.default_rng(seed)
    t = tree.size + n_pad
    anc = np.zeros((t, -(-t // 64)), dtype=np.uint64)                   # [T, W]
    anc[:tree.size] = tb.ancestor_bitmask(tree, anc.shape[1])
    q = kdtr.f32_to_bf16_bits(rng.standard_normal((t, heads, 576)).astype(np.float32))
    kv = rng.standard_normal((past + t + tail, 576)).astype(np.float32)
    kv[past + t:] = np.nan
    scale = get_preset("kimi-k2").softmax_scale
    return Case("tree_verify_mla", name, seed, f"T={t} ({n_pad} padding) H={heads} past={past}, {tail} NaN rows",
                {"q": q, "kv": kdtr.f32_to_bf16_bits(kv), "past_len": _i(past), "anc_bits": anc,
                 "scale": np.array(scale)}, ("q", "kv"), tolerance={"o_lat": BLAS_TOL, "lse": BLAS_TOL})


def tree_verify_mla_cases() -> list[Case]:
    worked = tb.build_tree(worked_logits(), 6, 7)
    chain = tb.build_chain(np.random.default_rng(403).standard_normal((4, 10)), 1)
    return [_tvm_case("worked_tree", 400, worked, 0, 2, 9, 8),
            _tvm_case("two_words", 401, _random_tree(401, 6, 20, 64), 1, 1, 3, 5),
            _tvm_case("t1_past0", 402, tb.build_tree(np.zeros((1, 4)), 0, 1), 0, 2, 0, 3),
            _tvm_case("chain_odd_heads", 403, chain, 1, 3, 130, 4)]


def _moe_case(name, seed, preset, e, d, n, groups, k, norm=True, tie=False) -> Case:
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((e, d)) / np.sqrt(d)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(e)).astype(np.float32)
    if tie:                                                              # experts 0..3 identical: ties to lower index
        gate[1:4], bias[:4] = gate[0], bias[0]
    cfg = get_preset(preset)
    return Case("moe_routing", name, seed, f"{preset} routing: E={e} d={d} N={n} groups={groups} k={k}",
                {"x": rng.standard_normal((n, d)).astype(np.float32), "gate": gate, "bias": bias,
                 "n_group": _i(groups[0]), "topk_group": _i(groups[1]), "n_experts_per_tok": _i(k),
                 "norm_topk_prob": np.array(norm), "routed_scaling": np.array(cfg.routed_scaling)},
                params={"preset": preset}, tolerance={"weights": LIBM_TOL})


def moe_routing_cases() -> list[Case]:
    return [_moe_case("tiny", 500, "tiny", 8, 64, 5, (1, 1), 2),
            _moe_case("tiny_groups", 501, "tiny-groups", 16, 64, 7, (4, 2), 4),
            _moe_case("kimi_k2_experts", 502, "kimi-k2", 384, 32, 3, (1, 1), 8),
            _moe_case("deepseek_v3_groups", 503, "deepseek-v3", 256, 32, 4, (8, 4), 8),
            _moe_case("ties_lower_index", 504, "tiny", 8, 16, 2, (1, 1), 3, tie=True),
            _moe_case("unnormalized_n1", 505, "tiny-groups", 16, 24, 1, (4, 2), 4, norm=False)]


def model_forward_cases() -> list[Case]:
    worked = tb.build_tree(worked_logits(), 6, 7)
    rng = np.random.default_rng(600)
    tree_in = {"tree_tokens": rng.integers(0, 256, worked.size), "tree_depths": worked.depths,
               "tree_visible": tb.visibility(worked)}
    tol = {"prefill_logits": BLAS_TOL, "tree_logits": BLAS_TOL}
    return [Case("model_forward", "tiny_prefill_tree", 600, "tiny, init seed 11: prefill 8, then the §2.6 tree",
                 {"init_seed": _i(11), "tokens": rng.integers(0, 256, 8), **tree_in}, params={"preset": "tiny"},
                 tolerance=tol),
            Case("model_forward", "tiny_groups_prefill", 601, "tiny-groups, init seed 12: prefill 5",
                 {"init_seed": _i(12), "tokens": np.random.default_rng(601).integers(0, 256, 5)},
                 params={"preset": "tiny-groups"}, tolerance={"prefill_logits": BLAS_TOL})]


CASES = {"tree_build": tree_build_cases, "tree_accept": tree_accept_cases, "kv_compact": kv_compact_cases,
         "tree_verify_mla": tree_verify_mla_cases, "moe_routing": moe_routing_cases,
         "model_forward": model_forward_cases}


# ------------------------------------------------------------------------------------------ files

def meta_json(case: Case) -> dict:
    return {"family": case.family, "case": case.name, "seed": case.seed, "note": case.note,
            "params": case.params, "tolerance": {k: list(v) for k, v in case.tolerance.items()}}


def case_tensors(case: Case) -> tuple[dict, dict]:
    """(name -> array, name -> bf16 tag) of one case, in file order: meta, inputs, outputs."""
    tags = {k: ("bf16" if k in case.bf16 else "") for k in case.inputs}
    outputs = COMPUTE[case.family](case.inputs, tags, case.params)
    text = json.dumps(meta_json(case), sort_keys=True, separators=(",", ":")).encode()
    tensors = {f"{case.name}.meta": np.frombuffer(text, dtype=np.uint8)}
    tensors.update({f"{case.name}.in.{k}": np.asarray(v) for k, v in case.inputs.items()})
    tensors.update({f"{case.name}.out.{k}": np.asarray(v) for k, v in outputs.items()})
    return tensors, {f"{case.name}.in.{k}": "bf16" for k in case.bf16}


def write_family(family: str, out_dir: Path) -> Path:
    tensors, dtypes = {}, {}
    for case in CASES[family]():
        t, d = case_tensors(case)
        tensors.update(t)
        dtypes.update(d)
    path = Path(out_dir) / f"{family}.kdtr"
    kdtr.save(path, tensors, dtypes)
    return path


def write_all(out_dir: Path = HERE) -> list[Path]:
    return [write_family(family, out_dir) for family in CASES]


def split_cases(tensors: dict, tags: dict) -> dict[str, dict]:
    """A loaded file -> {case: {"meta": dict, "in": {name: array}, "in_tags": {...}, "out": {...}}}."""
    cases: dict[str, dict] = {}
    for full, arr in tensors.items():
        case, role, *rest = full.split(".", 2)
        c = cases.setdefault(case, {"in": {}, "in_tags": {}, "out": {}})
        if role == "meta":
            c["meta"] = json.loads(bytes(arr).decode())
        else:
            c[role][rest[0]] = arr
            if role == "in":
                c["in_tags"][rest[0]] = "bf16" if tags[full] == "bf16" else ""
    return cases


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"{p}: {p.stat().st_size} bytes")
