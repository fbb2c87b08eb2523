#!/usr/bin/env bash
# H200 call A (session 2): build; tree_verify_mla GPU tests on both MMA paths; the wgmma vs mma.sync A/B;
# compute-sanitizer memcheck + racecheck on every kernel; the vocabulary pass alone; the nightly A/A pair.
# ~7 minutes. Everything lands in OUT/a/ and comes back as one OUT/call_a.tgz.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_a.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}/a; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
pack() { tar -czf "${out%/a}/call_a.tgz" -C "${out%/a}" a; }
trap pack EXIT
{ nvidia-smi; nvidia-smi -q -d CLOCK; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } \
  > "$out/env.txt" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
timeout 300 kdbench build --verbose > "$out/build.log" 2>&1; at "build rc=$?"
grep -E "error|spill|Used [0-9]+ registers" "$out/build.log" | sort | uniq -c | head -20
kdbench env > "$out/kdbench_env.txt" 2>&1
timeout 240 python3 -m pytest -q -rs --maxfail=6 --benchmark-skip -p no:cacheprovider tests/test_tree_verify_mla.py \
  > "$out/verify_tests.log" 2>&1; at "verify tests rc=$?"; tail -12 "$out/verify_tests.log"
timeout 90 python3 reports/h200/verify_ab.py "$out" 2>&1 | tail -8; at "A/B"
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --kernel-regex kns=kdb --error-exitcode 9 \
    python3 reports/h200/sanitize_kernels.py > "$out/sanitizer_$tool.log" 2>&1
  at "compute-sanitizer $tool rc=$?"; tail -3 "$out/sanitizer_$tool.log"
done
timeout 60 python3 reports/h200/time_vocab_pass.py "$out" 2>&1 | tail -5; at "vocab pass"
# issue 6: the nightly twice (an A/A pair must show no 'slower'); the first becomes the H200 baseline here
timeout 100 kdbench nightly --out "$out/n1" > "$out/nightly1.log" 2>&1; at "nightly 1 rc=$?"; tail -2 "$out/nightly1.log"
timeout 100 kdbench nightly --out "$out/n2" > "$out/nightly2.log" 2>&1; at "nightly 2 rc=$?"; tail -2 "$out/nightly2.log"
timeout 60 kdbench compare "$out/n1" "$out/n2" --out "$out/aa_compare.html" > "$out/aa_compare.log" 2>&1
at "A/A compare rc=$?"; tail -4 "$out/aa_compare.log"
