#!/usr/bin/env bash
# H200 call 1 of 3: install, JIT build, every GPU test, compute-sanitizer memcheck + racecheck on each kernel.
# Usage (device machine, repo root): bash reports/h200/run_tests.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
# The device gets the working tree without .git: pass the commit as KDBENCH_GIT_SHA=<sha> when calling.
{ nvidia-smi; nvidia-smi topo -m; nvidia-smi -q -d CLOCK; } > "$out/env.txt" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
timeout 400 kdbench build > "$out/build.log" 2>&1; echo "build rc=$? at $(( $(date +%s) - t0 )) s"
kdbench env > "$out/kdbench_env.txt" 2>&1
timeout 420 python3 -m pytest -q -rs --benchmark-skip -p no:cacheprovider -m "not slow" tests/ > "$out/pytest.log" 2>&1
echo "pytest rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 "$out/pytest.log"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --kernel-regex kns=kdb --error-exitcode 9 \
    python3 reports/h200/sanitize_kernels.py > "$out/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool rc=$? at $(( $(date +%s) - t0 )) s"; tail -4 "$out/sanitizer_$tool.log"
done
