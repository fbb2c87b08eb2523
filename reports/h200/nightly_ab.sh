#!/usr/bin/env bash
# H200: the nightly through `--against` on one machine, A/A (the base is a copy of the same files, so the
# expected exit is 0), then the between-machine A/A spread the stored baseline needs: this machine's pooled
# run against the committed baseline (another H200, 2026-11-30; kernel code unchanged since), written to
# OUT's baselines/nvidia-h200/spread.json for the integrator to commit next to reports/baselines/nvidia-h200/.
# The base is given as a source-tree path because the device's .git can be older than the files it got.
# Expected: ~4-6 min (4 nightly rounds of ~60 s each; one CUDA build, shared: identical sources hash alike).
# Returns OUT/nightly_ab.tgz (rounds, pooled runs, compare.html, report.html, log).
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/nightly_ab.sh OUT_DIR [ROUNDS]
set -uo pipefail
out=${1:?OUT_DIR}; rounds=${2:-2}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
n=/tmp/kdbench_nightly_ab; base=/tmp/kdbench_base_tree; rm -rf "$n" "$base"; mkdir -p "$n" "$base"
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1; kdbench build > /dev/null 2>&1
tar --exclude=./.git --exclude=./runs --exclude=./.carry -cf - . | tar -xf - -C "$base"
timeout 480 kdbench nightly --against "$base" --rounds "$rounds" --out "$n/ab" > "$n/nightly_ab.log" 2>&1
echo "nightly --against (A/A) rc=$? (expected 0)"; grep -E "A/B against|SLOWER|FAIL|stored baseline" "$n/nightly_ab.log"
kdbench nightly --calibrate reports/baselines/nvidia-h200 "$n/ab/new" --baselines "$n/baselines" >> "$n/nightly_ab.log" 2>&1
echo "calibrate rc=$?"; tail -1 "$n/nightly_ab.log"
tar -czf "$out/nightly_ab.tgz" -C /tmp kdbench_nightly_ab
