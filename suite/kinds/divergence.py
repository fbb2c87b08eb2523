"""A greedy divergence measured on the arms' own forwards (plans/0003-engine.md, "Greedy divergences").

When speculative output leaves AR at (prompt i, position p), AR picked token a and the speculative run token b
from logits of the same prefix computed by two different forwards: AR's decode row and the verify row on the
committed path. Both arms of the prompt's batch are run again eagerly with a tap on model.forward that keeps
logit[a] - logit[b] of that prediction in each arm (the row at absolute position len(prompt) + p - 1 whose own
token and every ancestor's token are the committed ones). Their difference, shift = gap_ar - gap_spec >= 0, is
how far the two forwards disagree about that pair of logits: rounding between GEMM and attention shapes moves
bf16 logits by ~0.03 on kimi-k2-slice-2 (reports/h200/variance_probe.py), so a shift above the dtype's excuse
is not rounding. A recomputation by a third path (one prefill) cannot tell this: its own rounding is part of
what it measures (s10's floor-b8 read -0.20 at a divergence AR and DDTree had both made)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OwnGap:
    gap: float                          # logit[a] - logit[b] at the divergent prediction, this arm's own forward
    margin: tuple[float, int] | None    # (smallest MoE selection margin of that row, its layer); None: not logged


class LogitTap:
    """Context manager: while active, every model.forward call is inspected for request row `row` of the batch;
    the first row whose position is `pos` and whose path matches `seq` (the committed tokens by absolute position)
    gives logit[a] - logit[b] (float64) and, where the model logs them, its MoE selection margins."""

    def __init__(self, model, row: int, pos: int, seq: list[int], a: int, b: int):
        self.model, self.row, self.pos, self.seq, self.a, self.b = model, row, pos, seq, a, b
        self.found: OwnGap | None = None

    def __enter__(self):
        inner = self.model.forward
        self._own = vars(self.model).get("forward")   # an instance's own forward (a wrapper) comes back on exit

        def forward(tokens, positions, cache, past_lens, anc=None, **kw):
            log = [] if self.found is None and hasattr(self.model, "margin_log") else None
            if log is not None:
                before, self.model.margin_log = self.model.margin_log, log
            try:
                out = inner(tokens, positions, cache, past_lens, anc, **kw)
            finally:
                if log is not None:
                    self.model.margin_log = before
            if self.found is None:
                self._inspect(tokens, positions, anc, kw.get("logit_rows"), out.logits, log)
            return out

        self.model.forward = forward
        return self

    def __exit__(self, *exc):
        if self._own is None:
            del self.model.forward      # the class's method again
        else:
            self.model.forward = self._own
        return False

    def _inspect(self, tokens, positions, anc, logit_rows, logits, log) -> None:
        r, T = self.row, tokens.shape[1]
        tok, pos = tokens[r].tolist(), positions[r].tolist()
        rows = [int(logit_rows[r])] if logit_rows is not None else range(T)
        for k, n in enumerate(rows):
            if pos[n] != self.pos or not self._on_path(tok, pos, anc, n):
                continue
            lg = logits[r, k if logit_rows is not None else n].double()
            margins = [(float(m[r * T + n]), layer) for layer, m in log or []]
            self.found = OwnGap(float(lg[self.a] - lg[self.b]), min(margins) if margins else None)
            return

    def _on_path(self, tok: list[int], pos: list[int], anc, n: int) -> bool:
        """Row n and its ancestors among the new rows (anc bits; None = causal: rows 0..n) hold the committed
        tokens at their positions."""
        if anc is None:
            path = range(n + 1)
        else:
            words = anc[self.row, n].tolist()
            path = [j for j in range(n + 1) if (words[j // 64] >> (j % 64)) & 1]
        return all(0 <= pos[j] < len(self.seq) and tok[j] == self.seq[pos[j]] for j in path)


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
