#!/usr/bin/env bash
# Acceptance sweep of the trained pair on one H200 (scenarios/acceptance/trained_sweep.yaml, torch stages, bf16).
# ACCEPT_FILTER (optional): kdbench --filter terms, e.g. "temperature=0.0". Writes the run folder $OUT/accept
# (records.jsonl, results.csv, meta.json, report.html) and $OUT/accept_log.txt. About 45 s greedy only, 90 s for the whole sweep.
set -eo pipefail
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
args=()
[ -n "${ACCEPT_FILTER:-}" ] && args=(--filter "$ACCEPT_FILTER")
python3 -u -m kdbench run scenarios/acceptance/trained_sweep.yaml --device cuda --out "$OUT/accept" "${args[@]}" \
  2>&1 | tee "$OUT/accept_log.txt" || true
