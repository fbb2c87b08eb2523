#!/usr/bin/env bash
# The one findings driver for a GPU-machine call: install, build, run a list of steps, pack the results.
# A call is a steps file, not a new script: each non-comment line is `NAME TIMEOUT_S COMMAND...`, run from the
# repo root with $RUNS (where run directories go) and $LOGS set; its output goes to $LOGS/NAME.log. After every
# step everything is packed again into $OUT/findings.tgz, so a call cut off at its limit still brings back
# what finished (the device tool returns at most 8 files from $OUT).
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/findings.sh STEPS_FILE OUT_DIR
#   WHL=DIR installs the wheels carried there first (FlashInfer for the peer rows; plans/0012).
#   NO_BUILD=1 skips the package install and extension build (standalone nvcc benches only).
set -uo pipefail
steps=${1:?STEPS_FILE}; out=${2:?OUT_DIR}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a
export RUNS="$out/work/runs" LOGS="$out/work/logs"; mkdir -p "$RUNS" "$LOGS"
t0=$(date +%s); at() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$LOGS/driver.log"; }
pack() { tar -czf "$out/findings.tgz.tmp" -C "$out/work" . && mv "$out/findings.tgz.tmp" "$out/findings.tgz"; }

if [ -n "${WHL:-}" ] && ls "$WHL"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl \
    > "$LOGS/wheels.log" 2>&1; at "wheels rc=$?"; export PYTHONPATH=/tmp/site
fi
if [ -z "${NO_BUILD:-}" ]; then  # NO_BUILD=1: steps that only build standalone nvcc benches skip the ~60 s
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$LOGS/install.log" 2>&1; at "install rc=$?"
  timeout 240 kdbench build > "$LOGS/build.log" 2>&1; at "build rc=$?"
  kdbench env > "$LOGS/env.txt" 2>&1
else
  { nvidia-smi; echo "commit ${KDBENCH_GIT_SHA:-unknown}"; } > "$LOGS/env.txt" 2>&1; at "NO_BUILD: extension not built"
fi
nvidia-smi -q -d CLOCK,PERFORMANCE > "$LOGS/clocks.txt" 2>&1
pack

while read -r name limit cmd; do
  case "$name" in ''|'#'*) continue ;; esac
  at "start $name (limit $limit s)"
  timeout --signal=TERM --kill-after=10 "$limit" bash -c "$cmd" > "$LOGS/$name.log" 2>&1 < /dev/null
  at "end $name rc=$?"; tail -4 "$LOGS/$name.log" | sed "s/^/  $name| /"
  pack
done < "$steps"
at "done"; pack
