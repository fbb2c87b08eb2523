#!/usr/bin/env bash
# Re-generate a committed replay findings report on the CPU (no GPU, ~1-2 min on 2 cores): re-fit the cost model
# to the committed measurements (costmodel_measure.py --from-jsonl), record the synthetic trace of
# replay_findings.sh again on the CPU (same settings; its tau differs slightly from the cuda-recorded one: the
# synthetic drafter's random draws depend on the device) and replay it with step times modeled from the cells.
# Usage (repo root, kdbench installed): bash reports/h200/replay_refindings_cpu.sh DIR   (DIR holds
# costmodel_measurements.jsonl; findings.md / findings.html there are replaced)
set -euo pipefail
DIR=${1:?usage: replay_refindings_cpu.sh DIR}
PY=${PYTHON:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" reports/h200/costmodel_measure.py "$TMP/cm" --from-jsonl "$DIR/costmodel_measurements.jsonl" > "$TMP/fit.log"
"$PY" -m kdbench trace --drafter synthetic-only --categories 0.6,0.8,0.9 --prompts 8 --rounds "${ROUNDS:-127}" \
    --k 256 --device cpu --out "$TMP/synthetic.kdtr"
"$PY" -m kdbench replay "$TMP/synthetic.kdtr" --findings --measured "$DIR/costmodel_measurements.jsonl" \
    --policies chain,ddtree,ddtree_width_capped:4,static_kary:4x2x2x1x1x1x1x1,adaptive \
    --budgets 4,8,16,32,64,128,256 --out "$TMP/replay" > "$TMP/replay.log"
{
  echo "<!-- re-generated on the CPU by reports/h200/replay_refindings_cpu.sh from the committed measurements"
  echo "     (GPU log of the measurement: replay_log.txt); synthetic trace recorded on the CPU -->"
  cat "$TMP/replay/findings.md" "$TMP/cm/costmodel_validation.md"
} > "$DIR/findings.md"
cp "$TMP/replay/findings.html" "$DIR/findings.html"
echo "findings: $DIR/findings.md"
