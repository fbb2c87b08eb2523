#!/usr/bin/env bash
# H200 call D (session 2), right after C on the warm machine: the nightly twice (an A/A pair; the first run
# becomes the committed H200 baseline), then part b of run_grid.sh (tree_build grid, tree_accept, verify
# batch 32 at 32K, kv_compact B 8/64/128, the validation cases while time is left).
# Returns OUT/nightly.tgz and OUT/grid_b.tgz.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_d.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; n=/tmp/kdbench_nightly; rm -rf "$n"; mkdir -p "$n"
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1; kdbench build > /dev/null 2>&1
timeout 100 kdbench nightly --out "$n/n1" > "$n/nightly1.log" 2>&1; echo "nightly 1 rc=$?"
timeout 100 kdbench nightly --out "$n/n2" > "$n/nightly2.log" 2>&1; echo "nightly 2 rc=$?"
timeout 60 kdbench compare "$n/n1" "$n/n2" --out "$n/aa_compare.html" > "$n/aa_compare.log" 2>&1
echo "A/A compare rc=$?"; tail -2 "$n/aa_compare.log"
tar -czf "$out/nightly.tgz" -C /tmp kdbench_nightly
GRID_DEADLINE_S=500 bash reports/h200/run_grid.sh "$out" b
