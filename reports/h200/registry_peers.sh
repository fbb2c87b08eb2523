#!/usr/bin/env bash
# H200 (registry helper, 2026-12-01): FlashInfer 0.5.3 from the wheels carried in .whl, kdbench's extension
# built beside the peer tests, then the GPU tests of tree_verify_mla, the registry and the peers, and the
# verify scenario's peer cases (validate-peers, validate-chain-peers, bench-chain*). ~3 minutes.
# Usage (device machine, in the copied tree): WHL=../../.whl bash reports/h200/registry_peers.sh OUT_DIR
# TESTS=0 skips the pytest steps (~75 s): install, build, the scenario's peer cases only (~110 s).
set -uo pipefail
out=${1:?OUT_DIR}; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site "${WHL:-.whl}"/*.whl > "$out/install.log" 2>&1
at "flashinfer wheels rc=$?"
export PYTHONPATH=/tmp/site FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
python3 -m pip install -q --no-build-isolation --no-deps -e . >> "$out/install.log" 2>&1; at "kdbench install rc=$?"
python3 -c 'import flashinfer, torch; print("flashinfer", flashinfer.__version__, "torch", torch.__version__)'
(timeout 170 kdbench build > "$out/build.log" 2>&1; echo "build rc=$? at $(( $(date +%s) - t0 )) s" >> "$out/build.log") &
if [ "${TESTS:-1}" = 1 ]; then
  timeout 120 python3 -m pytest -q -rs --benchmark-skip -p no:cacheprovider tests/test_flashinfer_peers.py \
    tests/test_registry.py > "$out/peer_tests.log" 2>&1; at "peer + registry tests rc=$?"; tail -6 "$out/peer_tests.log"
fi
wait; tail -1 "$out/build.log"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 90 python3 -m pytest -q -rs -x --benchmark-skip -p no:cacheprovider tests/test_tree_verify_mla.py \
    tests/test_kinds.py tests/test_engine_graph.py > "$out/gpu_tests.log" 2>&1; at "verify/kinds/graph GPU tests rc=$?"
  tail -6 "$out/gpu_tests.log"
fi
timeout 150 kdbench run scenarios/kernels/tree_verify_mla.yaml --device cuda --out "$out/run" \
  --filter validate-peers --filter validate-chain-peers --filter bench-chain --filter 'bench-small-heads' \
  > "$out/run.log" 2>&1; at "verify scenario (peer cases) rc=$?"; tail -8 "$out/run.log"
python3 - "$out/run" <<'PY' 2>&1 | tee "$out/peer_table.txt"
import sys
from kdbench.results import load_records
for r in load_records(sys.argv[1]):
    print(f"{r.case[:44]:44s} {r.backend:19s} {r.status:7s} {r.time_median_s * 1e3:9.4f} ms  "
          f"floor% {r.pct_of_floor_rate:5.1f}  relL2 {r.rel_l2:.2e}  {r.reason[:90]}")
PY
tar -czf "$out/run.tgz" -C "$out" run && rm -rf "$out/run"
