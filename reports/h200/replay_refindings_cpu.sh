#!/usr/bin/env bash
# Re-generate a committed replay findings report on the CPU (no GPU, ~3 min on 2 cores): re-fit the cost model
# to the committed measurements (costmodel_measure.py --from-jsonl), record two traces on the CPU and replay
# each with step times modeled from the cells: the trained pair's (its own drafter on the held-out code /
# prose / structured prompts, float32) and the synthetic keyed one of replay_findings.sh (qualities
# 0.6 / 0.8 / 0.9; its tau differs slightly from a cuda-recorded one: the random draws depend on the device).
# Usage (repo root, kdbench installed): bash reports/h200/replay_refindings_cpu.sh DIR   (DIR holds
# costmodel_measurements.jsonl; writes findings.md / findings.html (synthetic trace) and
# findings_pair.md / findings_pair.html (trained pair's trace) there)
set -euo pipefail
DIR=${1:?usage: replay_refindings_cpu.sh DIR}
PY=${PYTHON:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
POLICIES=chain,ddtree,ddtree_width_capped:4,static_kary:4x2x2x1x1x1x1x1,adaptive
"$PY" reports/h200/costmodel_measure.py "$TMP/cm" --from-jsonl "$DIR/costmodel_measurements.jsonl" > "$TMP/fit.log"
"$PY" -m kdbench trace --drafter synthetic-only --categories 0.6,0.8,0.9 --prompts 8 --rounds "${ROUNDS:-127}" \
    --k 256 --device cpu --out "$TMP/synthetic.kdtr"
"$PY" -m kdbench trace --drafter pair --category mixed --prompts 4 --prompt-len 128 --rounds "${ROUNDS:-127}" \
    --k 256 --device cpu --out "$TMP/pair.kdtr"
for t in synthetic pair; do
  "$PY" -m kdbench replay "$TMP/$t.kdtr" --findings --measured "$DIR/costmodel_measurements.jsonl" \
      --policies "$POLICIES" --budgets 4,8,16,32,64,128,256 --out "$TMP/replay_$t" > "$TMP/replay_$t.log"
done
note() {
  echo "<!-- re-generated on the CPU by reports/h200/replay_refindings_cpu.sh from the committed measurements"
  echo "     (GPU log of the measurement: logs/measure.log); $1 trace recorded on the CPU -->"
}
{ note synthetic; cat "$TMP/replay_synthetic/findings.md" "$TMP/cm/costmodel_validation.md"; } > "$DIR/findings.md"
{ note "trained pair"; cat "$TMP/replay_pair/findings.md"; } > "$DIR/findings_pair.md"
cp "$TMP/replay_synthetic/findings.html" "$DIR/findings.html"
cp "$TMP/replay_pair/findings.html" "$DIR/findings_pair.html"
cp "$TMP/replay_pair/findings.json" "$DIR/findings_pair.json"
cp "$TMP/replay_synthetic/findings.json" "$DIR/findings.json"
echo "findings: $DIR/findings.md $DIR/findings_pair.md"
