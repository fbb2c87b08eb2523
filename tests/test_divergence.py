"""A greedy divergence is measured on the arms' own forwards (suite/kinds/divergence.py): the logit tap finds the
committed row of an AR decode and of a tree verify, and losslessness() classifies a real, re-run divergence by
the shift between the two arms' own gaps. CPU, tiny float64 target."""
from types import SimpleNamespace

import pytest
import torch

from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.stages import Policy
from kdbench.kinds import generation as gen
from kdbench.kinds.divergence import LogitTap, own_gaps, routing_flips
from kdbench.model.synthetic import SyntheticDrafter

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8, 7, 6, 5]]
MAX_NEW, DEPTH = 8, 3


@pytest.fixture(scope="module")
def world():
    model = target_from_preset("tiny", seed=5, device="cpu", dtype=torch.float64)
    ar = generate(model, None, PROMPTS, MAX_NEW, Policy(kind="ar"))
    oracle = [p + t for p, t in zip(PROMPTS, ar.tokens)]
    V = model.cfg.vocab_size
    make = lambda first, last: SyntheticDrafter(oracle[first:last], V, depth=DEPTH, quality=0.9,  # noqa: E731
                                                rank_probs=(0.7, 0.3), seed=3 + first)
    return model, ar, make


def _runner_up(model, prefix, a):
    top = torch.topk(gen.next_logits(model, prefix).double(), 2)
    return int(top.indices[1] if int(top.indices[0]) == a else top.indices[0])


def test_tap_reads_the_committed_row_of_ar_decode_and_of_the_verify(world):
    """The tap's gap in an AR re-run and in a DDTree re-run equals the prefill's (float64: one value), and it
    picks no row off the committed path (a wrong path's row would give another prediction's logits)."""
    model, ar, make = world
    row, p = 1, 4
    a = ar.tokens[row][p]
    b = _runner_up(model, PROMPTS[row] + ar.tokens[row][:p], a)
    want = float(gen.next_logits(model, PROMPTS[row] + ar.tokens[row][:p]).double()[[a, b]].diff().neg())
    seq = PROMPTS[row] + ar.tokens[row][:p]
    with LogitTap(model, row, len(seq) - 1, seq, a, b) as tap_ar:
        generate(model, None, PROMPTS, MAX_NEW, Policy(kind="ar"))
    with LogitTap(model, row, len(seq) - 1, seq, a, b) as tap_sp:
        spec = generate(model, make(0, 3), PROMPTS, MAX_NEW, Policy(kind="ddtree", budget=8))
    assert spec.tokens == ar.tokens and "forward" not in vars(model), "the tap leaves the model as it was"
    assert tap_ar.found.gap == pytest.approx(want, abs=1e-9) and tap_sp.found.gap == pytest.approx(want, abs=1e-9)
    assert want > 0 and tap_ar.found.margins and tap_ar.found.experts, "the tiny preset has an MoE layer: logged"
    assert tap_ar.found.experts == tap_sp.found.experts and routing_flips(tap_ar.found, tap_sp.found) == []


class _VerifyBias:
    """Installs on a model a forward that, in every tree verify (anc given) of a batch of `batch` requests (None:
    any), adds `delta` to token b's logit of request row `row` or (router=True) `delta` to expert `b`'s router
    bias in every MoE layer: planted bugs of the verify path, which AR decode never sees."""

    def __init__(self, model, row, b, delta, router=False, batch=None):
        self.model, inner = model, model.forward
        names = [f"layers.{i}.gate_bias" for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i)]

        def forward(tokens, positions, cache, past_lens, anc=None, **kw):
            hit = anc is not None and batch in (None, tokens.shape[0])
            saved = {n: model.w[n].clone() for n in names} if hit and router else {}
            for n in saved:
                model.w[n][b] += delta
            try:
                out = inner(tokens, positions, cache, past_lens, anc, **kw)
            finally:
                for n, v in saved.items():
                    model.w[n].copy_(v)                 # exactly the old values (x + d - d need not be x)
            if hit and not router:
                out.logits[row, :, b] += delta
            return out
        model.forward = forward

    def remove(self):
        del self.model.forward


@pytest.mark.parametrize("delta_over_gap, excuse, kind, batch, budget", [
    (50.0, 0.0, "MISMATCH", 3, 8), (1.5, None, "near-tie", 3, 8),
    (50.0, 0.0, "MISMATCH", 2, 64)])    # prompt 2 alone in the second batch (row 0); 65-row trees: 2 anc words
def test_a_rerun_divergence_is_classified_by_the_shift_of_own_gaps(world, monkeypatch, delta_over_gap, excuse, kind,
                                                                   batch, budget):
    """A verify biased toward AR's runner-up diverges for real; the re-run reproduces it and the verdict quotes
    both own gaps and their shift, which is the bias: above the excuse a MISMATCH, below it (patched) a near-tie."""
    model, ar, make = world
    prompt, p = 2, 3
    row = prompt % batch
    a = ar.tokens[prompt][p]
    b = _runner_up(model, PROMPTS[prompt] + ar.tokens[prompt][:p], a)
    gap = float(gen.next_logits(model, PROMPTS[prompt] + ar.tokens[prompt][:p]).double()[[a, b]].diff().neg())
    delta = delta_over_gap * gap
    monkeypatch.setitem(gen.NEAR_TIE_LOGIT, torch.float64, 2 * delta if excuse is None else excuse)
    bias = _VerifyBias(model, row, b, delta, batch=len(PROMPTS) - batch * (prompt // batch) if batch < 3 else None)
    try:
        s = SimpleNamespace(batch=batch, max_new_tokens=MAX_NEW, temperature=0.0)
        policy = Policy(kind="ddtree", budget=budget)
        spec = gen.run_batched(model, make, PROMPTS, s, policy, "torch", 0)
        where = gen.first_divergence([ar], spec)
        assert where is not None and where[0] == prompt and where[1] <= p, "the planted bias must move the output"
        rerun = gen.batch_rerun(model, make, PROMPTS, s, policy, "torch", 0)
        verdict, bug = gen.losslessness(model, PROMPTS, [ar], spec, rerun)
    finally:
        bias.remove()
    assert verdict.startswith(f"no: {kind} (prompt {prompt}, position {where[1]}, own logit gaps: AR +"), verdict
    assert bug == (kind == "MISMATCH") and "speculative -" in verdict and "same experts at every MoE layer" in verdict
    shift = float(verdict.split("shift ")[1].split(" ")[0])
    assert shift == pytest.approx(delta, rel=1e-3), "the shift is the planted bias (4 significant digits quoted)"


def test_a_rerun_that_does_not_reproduce_falls_back_to_the_prefill_gap(world):
    """A planted output (no real divergence) is not reproduced by the re-run: the verdict says so and uses the
    prefill's AR logit gap, as before."""
    model, ar, make = world
    worst = int(gen.next_logits(model, PROMPTS[1] + ar.tokens[1][:2]).argmin())
    planted = [type(ar)(tokens=[ar.tokens[0], ar.tokens[1][:2] + [worst] + ar.tokens[1][3:], ar.tokens[2]])]
    s = SimpleNamespace(batch=3, max_new_tokens=MAX_NEW, temperature=0.0)
    rerun = gen.batch_rerun(model, make, PROMPTS, s, Policy(kind="ddtree", budget=8), "torch", 0)
    verdict, bug = gen.losslessness(model, PROMPTS, [ar], planted, rerun)
    assert bug and "AR logit gap" in verdict and "by prefill" in verdict and "did not reproduce" in verdict, verdict


def test_own_gaps_returns_none_where_no_row_matches(world):
    """A committed sequence no forward holds (a token AR never saw) gives no gap rather than another row's."""
    model, ar, make = world
    bogus = [t + 1 for t in ar.tokens[0]]
    g_ar, g_sp, same = own_gaps(model, PROMPTS[0], 0, 3, bogus, bogus[3], 0,
                                lambda: generate(model, None, PROMPTS, MAX_NEW, Policy(kind="ar")),
                                lambda: generate(model, make(0, 3), PROMPTS, MAX_NEW, Policy(kind="ddtree", budget=8)))
    assert g_ar is None and g_sp is None and not same


@pytest.mark.parametrize("router_excuse, kind", [(0.0, "MISMATCH"), (10.0, "routing flip")])
def test_other_experts_in_the_verify_read_as_a_routing_flip_below_the_router_excuse(world, monkeypatch,
                                                                                    router_excuse, kind):
    """A verify whose router prefers one more expert routes the divergent row elsewhere: the verdict names the
    layer and margin; it is a routing flip (not a bug) only while that margin is below the dtype's router excuse."""
    model, ar, make = world
    monkeypatch.setitem(gen.ROUTER_EXCUSE, torch.float64, router_excuse)
    bias = _VerifyBias(model, 0, 0, 5.0, router=True)
    try:
        s = SimpleNamespace(batch=3, max_new_tokens=MAX_NEW, temperature=0.0)
        policy = Policy(kind="ddtree", budget=8)
        spec = gen.run_batched(model, make, PROMPTS, s, policy, "torch", 0)
        assert gen.first_divergence([ar], spec) is not None, "the planted routing must move the output"
        verdict, bug = gen.losslessness(model, PROMPTS, [ar], spec, gen.batch_rerun(model, make, PROMPTS, s, policy,
                                                                                    "torch", 0))
    finally:
        bias.remove()
    layer = next(i for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i))
    assert verdict.startswith(f"no: {kind} (") and f"other experts at layer {layer} (margin" in verdict, verdict
    assert bug == (kind == "MISMATCH")


class _FakeModel:
    """forward(tokens, positions, ...) -> logits [B, T, 4] whose value at token 2 marks the call."""

    def __init__(self):
        self.calls = 0

    def forward(self, tokens, positions, cache, past_lens, anc=None, **kw):
        self.calls += 1
        B, T = tokens.shape
        lg = torch.zeros(B, T, 4, dtype=torch.float64)
        lg[..., 2] = float(self.calls)
        return SimpleNamespace(logits=lg)


def test_the_tap_takes_the_last_forward_holding_the_row_not_a_padding_row_before_it():
    """A step whose drafter missed the next token still holds a row at that position with the root's token: a
    tree's padding row (depth 1, the root's token, root + self as ancestors). When the committed token repeats
    the root's, that row matches, but the token was the bonus of that step, and the next step's root decides."""
    seq = [5, 7, 7]                           # committed: position 1 holds 7 (the root), position 2 repeats it
    model = _FakeModel()
    with LogitTap(model, 0, 2, seq, 2, 3) as tap:
        bits = torch.tensor([[[1], [3], [5], [9]]])           # root, a drafted child (token 3), two padding rows
        model.forward(torch.tensor([[7, 3, 7, 7]]), torch.tensor([[1, 2, 2, 2]]), None, None, bits)
        assert tap.found is not None and tap.found.gap == 1.0, "the padding row matches the first forward"
        model.forward(torch.tensor([[7]]), torch.tensor([[2]]), None, None, torch.ones(1, 1, 1, dtype=torch.int64))
        model.forward(torch.tensor([[4]]), torch.tensor([[3]]), None, None, torch.ones(1, 1, 1, dtype=torch.int64))
    assert tap.found.gap == 2.0, "the next step's root decided; the one after it sits past the position"


def _fake_rerun(runs):
    """A rerun function whose arms count their calls in `runs` and return nothing useful (own_gaps is patched)."""
    def at(i):
        return 0, lambda: runs.append("ar"), lambda: runs.append("spec")
    at.memo = {}
    return at


@pytest.mark.parametrize("g_ar, g_sp, note", [(-0.5, -1.0, "do not pick the arms' tokens"),
                                              (1.0, 0.5, "do not pick the arms' tokens")])
def test_own_gaps_of_the_wrong_sign_fall_back_to_the_prefill(world, monkeypatch, g_ar, g_sp, note):
    """The deciding rows rank a over b in AR and b over a in the speculative arm; rows that do not are not the
    deciding ones, and the verdict says so and uses the prefill gap."""
    from kdbench.kinds.divergence import OwnGap
    model, ar, _ = world
    planted = [type(ar)(tokens=[ar.tokens[0], ar.tokens[1][:2] + [0] + ar.tokens[1][3:], ar.tokens[2]])]
    monkeypatch.setattr(gen, "own_gaps", lambda *a, **k: (OwnGap(g_ar, (), ()), OwnGap(g_sp, (), ()), True))
    verdict, _ = gen.losslessness(model, PROMPTS, [ar], planted, _fake_rerun([]))
    assert "by prefill" in verdict and note in verdict, verdict


def test_a_rerun_that_raises_falls_back_and_one_divergence_is_measured_once(world, monkeypatch):
    """An exception in the re-run (out of memory, say) leaves the prefill verdict with the reason; the memo
    answers a second verdict on the same divergence without re-running."""
    model, ar, _ = world
    planted = [type(ar)(tokens=[ar.tokens[0], ar.tokens[1][:2] + [0] + ar.tokens[1][3:], ar.tokens[2]])]
    calls = []

    def boom(*a, **k):
        calls.append(1)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
    monkeypatch.setattr(gen, "own_gaps", boom)
    rerun = _fake_rerun([])
    first = gen.losslessness(model, PROMPTS, [ar], planted, rerun)
    second = gen.losslessness(model, PROMPTS, [ar], planted, rerun)
    assert first == second and len(calls) == 1
    assert "by prefill" in first[0] and "raised RuntimeError: CUDA out of memory" in first[0], first
