#!/usr/bin/env bash
# Issue 13 in one GPU call (~3-4 min on one H200; session 2 used reports/h200/2026-12-01-s2/replay/replay.steps instead): measure the cost model's cells (kimi-k2-slice-2 and slice-4,
# batch 1/8/32, budget 0/16/64/256 chains, router experts), then the best budget per batch size from a
# synthetic trace (three drafter qualities) with step times modeled from THESE measurements, then (if under
# LIVE_CHECK_BEFORE_S) the live check: generate() at the predicted best DDTree budget and its neighbours.
# Usage (repo root, kdbench installed): bash reports/h200/replay_findings.sh OUT_DIR
# Leaves 4 files in OUT_DIR: costmodel_measurements.jsonl, findings.md, findings.html, replay_log.txt.
# A CPU dry run of the plumbing: MODELS=tiny,tiny-groups DEVICE=cpu ROUNDS=15 MEASURE_ARGS="--ctx 16 --repeat 1"
#   LIVE_MODEL=tiny LIVE_BATCHES=1,3 LIVE_ARGS="--rounds 15 --prompt-len 8" bash reports/h200/replay_findings.sh /tmp/o
set -o pipefail
MODELS=${MODELS:-kimi-k2-slice-2,kimi-k2-slice-4,kdbench-pair}
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-127}
OUT=${1:?usage: replay_findings.sh OUT_DIR}
TMP=$(mktemp -d)
mkdir -p "$OUT"
{
  python3 reports/h200/costmodel_measure.py "$TMP/cm" --deadline-s 150 --models "$MODELS" $MEASURE_ARGS &&
  python3 -m kdbench trace --drafter synthetic-only --categories 0.6,0.8,0.9 --prompts 8 --rounds "$ROUNDS" \
      --k 256 --device "$DEVICE" --out "$TMP/synthetic.kdtr" &&
  python3 -m kdbench replay "$TMP/synthetic.kdtr" --findings --measured "$TMP/cm/costmodel_measurements.jsonl" \
      --policies chain,ddtree,ddtree_width_capped:4,static_kary:4x2x2x1x1x1x1x1,adaptive \
      --budgets 4,8,16,32,64,128,256 --out "$TMP/replay" &&
  if [ "$SECONDS" -lt "${LIVE_CHECK_BEFORE_S:-170}" ]; then
    python3 reports/h200/replay_live_check.py "$TMP/live" --measured "$TMP/cm/costmodel_measurements.jsonl" \
        --model "${LIVE_MODEL:-kdbench-pair}" --batches "${LIVE_BATCHES:-1,8,32}" $LIVE_ARGS
  else
    echo "live check skipped: ${SECONDS} s elapsed"
  fi
} 2>&1 | tee "$OUT/replay_log.txt"
rc=$?
cp "$TMP/cm/costmodel_measurements.jsonl" "$OUT/" 2>/dev/null
if [ -f "$TMP/replay/findings.md" ]; then
  cat "$TMP/replay/findings.md" "$TMP/cm/costmodel_validation.md" "$TMP"/live/live_check_*.md > "$OUT/findings.md" 2>/dev/null
  cp "$TMP/replay/findings.html" "$OUT/"
fi
exit $rc
