"""A greedy divergence measured on the arms' own forwards (plans/0003-engine.md, "Greedy divergences").

When speculative output leaves AR at (prompt i, position p), AR picked token a and the speculative run token b
from logits of the same prefix computed by two different forwards: AR's decode row and the verify row on the
committed path. Both arms of the prompt's batch are run again eagerly with a tap on model.forward that keeps,
for that prediction in each arm (the row at absolute position len(prompt) + p - 1 whose own token and every
ancestor's token are the committed ones), logit[a] - logit[b], and per MoE layer the row's experts and selection
margin. shift = gap_ar - gap_spec >= 0 is how far the two forwards disagree about that pair of logits.
- Rounding between GEMM and attention shapes moves bf16 logits by ~0.04 on kimi-k2-slice-2
  (reports/h200/variance_probe.py, s11), so a shift below the dtype's logit excuse is a near-tie.
- A larger shift where the row went to other experts in the two forwards, at a layer whose selection margin is
  below the dtype's router excuse, is a routing flip: rounding moved the row across the top-k boundary.
- Anything else is a MISMATCH. (A flip in an earlier row, seen by this row through the KV of deeper layers, is
  not traced: it reads as a MISMATCH, the safe side.)
A recomputation by a third path (one prefill, the fallback) cannot separate these: its own rounding is part of
what it measures."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class OwnGap:
    gap: float                                 # logit[a] - logit[b] at the divergent prediction, this arm's forward
    margins: tuple[tuple[int, float], ...]     # (layer, MoE selection margin of that row); () where none is logged
    experts: tuple[tuple[int, tuple[int, ...]], ...]   # (layer, the experts that row was routed to, sorted)

    def margin(self, layer: int) -> float:
        return dict(self.margins).get(layer, float("nan"))


@contextmanager
def model_logs(model, names=("margin_log", "route_log")):
    """While active, the model's MoE logs among `names` that it has (Transformer.margin_log / route_log) collect
    into fresh lists, yielded as {name: list}; the previous values come back on exit, exceptions included."""
    logs = {n: [] for n in names if hasattr(model, n)}
    before = {n: getattr(model, n) for n in logs}
    for n, v in logs.items():
        setattr(model, n, v)
    try:
        yield logs
    finally:
        for n, v in before.items():
            setattr(model, n, v)


class LogitTap:
    """Context manager: while active, every model.forward call is inspected for request row `row` of the batch.
    The row whose position is `pos` and whose path matches `seq` (the committed tokens by absolute position) gives
    logit[a] - logit[b] (float64) and, where the model logs them, its MoE selection margins and experts. The last
    forward holding such a row decides (an earlier one can hold it as a tree's padding row, which repeats the root
    token at depth 1, in a step that committed that token as its bonus; once a forward has decided, every later
    row of the request sits past `pos`); within a forward the first such row (real nodes precede padding)."""

    def __init__(self, model, row: int, pos: int, seq: list[int], a: int, b: int):
        self.model, self.row, self.pos, self.seq, self.a, self.b = model, row, pos, seq, a, b
        self.found: OwnGap | None = None

    def __enter__(self):
        inner = self.model.forward
        self._own = vars(self.model).get("forward")   # an instance's own forward (a wrapper) comes back on exit

        def forward(tokens, positions, cache, past_lens, anc=None, **kw):
            with model_logs(self.model) as logs:
                out = inner(tokens, positions, cache, past_lens, anc, **kw)
            self._inspect(tokens, positions, anc, kw.get("logit_rows"), out.logits, logs)
            return out

        self.model.forward = forward
        return self

    def __exit__(self, *exc):
        if self._own is None:
            del self.model.forward      # the class's method again
        else:
            self.model.forward = self._own
        return False

    def _inspect(self, tokens, positions, anc, logit_rows, logits, logs: dict) -> None:
        r, T = self.row, tokens.shape[1]
        tok, pos = tokens[r].tolist(), positions[r].tolist()
        rows = [int(logit_rows[r])] if logit_rows is not None else range(T)
        for k, n in enumerate(rows):
            if pos[n] != self.pos or not self._on_path(tok, pos, anc, n):
                continue
            lg = logits[r, k if logit_rows is not None else n].double()
            margins = tuple((layer, float(m[r * T + n])) for layer, m in logs.get("margin_log", []))
            experts = tuple((layer, tuple(sorted(idx[r * T + n].tolist()))) for layer, idx in logs.get("route_log", []))
            self.found = OwnGap(float(lg[self.a] - lg[self.b]), margins, experts)
            return

    def _on_path(self, tok: list[int], pos: list[int], anc, n: int) -> bool:
        """Row n and its ancestors among the new rows (anc bits; None = causal: rows 0..n) hold the committed
        tokens at their positions."""
        if anc is None:
            path = range(n + 1)
        else:
            words = anc[self.row, n].tolist()
            path = [j for j in range(len(pos)) if (words[j // 64] >> (j % 64)) & 1]
        return all(0 <= pos[j] < len(self.seq) and tok[j] == self.seq[pos[j]] for j in path)


def routing_flips(g_ar: OwnGap, g_sp: OwnGap) -> list[tuple[int, float]]:
    """(layer, the smaller of the two arms' selection margins there) for each MoE layer where the divergent row
    was routed to other experts in the two forwards."""
    sp = dict(g_sp.experts)
    return [(layer, min(g_ar.margin(layer), g_sp.margin(layer))) for layer, e in g_ar.experts
            if layer in sp and sp[layer] != e]


def own_gaps(model, prompt: list[int], row: int, p: int, ar_tokens: list[int], a: int, b: int, run_ar, run_spec
             ) -> tuple[OwnGap | None, OwnGap | None, bool]:
    """(AR's own gap, the speculative arm's own gap, reproduced): run_ar / run_spec re-run the prompt's batch
    (-> GenerateResult) under the tap; reproduced = the re-runs diverge where the measured runs did."""
    seq = list(prompt) + list(ar_tokens[:p])        # committed tokens by absolute position, up to the prediction
    at = len(prompt) + p - 1                         # the row whose logits predict generated token p
    found, out = [], []
    for run in (run_ar, run_spec):
        with LogitTap(model, row, at, seq, a, b) as tap:
            out.append(run().tokens[row])
        found.append(tap.found)
    ar_t, sp_t = out
    reproduced = ar_t[:p + 1] == list(ar_tokens[:p]) + [a] and sp_t[:p + 1] == list(ar_tokens[:p]) + [b]
    return found[0], found[1], reproduced
