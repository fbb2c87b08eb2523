#!/usr/bin/env bash
# H200 (issue 15 round 2, 2026-12-01): tree_verify_mla's wgmma ping-pong path. One call: install, build, a
# 40 s smoke of the new path (a hang or crash drops it from the later steps), the GPU tests of the kernel, the
# A/B timing of the paths (reports/h200/verify_ab.py) and, with FINAL=1, the verify scenario's peer cases
# (FlashInfer from WHL) and compute-sanitizer memcheck + racecheck. Logs and results under OUT as they finish.
# Usage (device machine, repo root): [FINAL=1 WHL=.whl] bash reports/h200/verify_round2.sh OUT   (~150 / ~300 s)
set -uo pipefail
top=${1:?OUT}; out="$top/w"; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a
# everything is packed into OUT/results.tgz after each step (the device tool returns at most 8 files)
t0=$(date +%s); at() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/driver.log"; pack; }
pack() { tar -czf "$top/results.tgz.tmp" -C "$out" . && mv "$top/results.tgz.tmp" "$top/results.tgz"; }
if [ "${FINAL:-0}" = 1 ] && ls "${WHL:-.whl}"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${WHL:-.whl}"/*.whl > "$out/install.log" 2>&1
  at "wheels rc=$?"; export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-build-isolation --no-deps -e . >> "$out/install.log" 2>&1; at "install rc=$?"
timeout 240 kdbench build > "$out/build.log" 2>&1; at "build rc=$?"; tail -3 "$out/build.log"
smoke() {
timeout 40 python3 - > "$out/smoke.log" 2>&1 <<'PY'
import torch
from kdbench.backends import cuda_ext
g = torch.Generator(device="cuda").manual_seed(1)
for b, h, t, past in ((1, 16, 65, 300), (2, 8, 9, 4097)):
    q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
    anc = torch.ones(b, t, (t + 63) // 64, dtype=torch.int64, device="cuda")   # every node sees all tree rows
    ref = cuda_ext.tree_verify_mla(q, kv, lens, anc, 0.13, "mma")
    got = cuda_ext.tree_verify_mla(q, kv, lens, anc, 0.13, "pingpong")
    torch.cuda.synchronize()
    print(b, h, t, past, "max |o diff|", float((ref[0].float() - got[0].float()).abs().max()),
          "max |lse diff|", float((ref[1] - got[1]).abs().max()))
PY
}
# FINAL=1 tests the ping-pong path only (the other two are unchanged since the last full run) and, when that
# fails and FALLBACK names a ping-pong header known to pass, swaps it in, rebuilds and tests again.
tests() {  # $1: log suffix, $2: pytest -k expression (empty: the whole file)
  timeout 200 python3 -m pytest -q -rs --benchmark-skip -p no:cacheprovider tests/test_tree_verify_mla.py \
    ${2:+-k "$2"} > "$out/gpu_tests$1.log" 2>&1
}
sel=""; [ "${FINAL:-0}" = 1 ] && sel="pingpong"
smoke; rc=$?; at "smoke rc=$rc"; cat "$out/smoke.log"
[ $rc = 0 ] && { tests "" "$sel"; rc=$?; at "tree_verify_mla GPU tests rc=$rc"; tail -3 "$out/gpu_tests.log"; }
if [ $rc != 0 ] && [ -n "${FALLBACK:-}" ]; then
  cp "$FALLBACK" csrc/tree_verify_mla_pingpong.h; echo "FALLBACK: $FALLBACK" >> "$out/driver.log"
  timeout 240 kdbench build > "$out/build_fallback.log" 2>&1; at "fallback build rc=$?"
  smoke; rc=$?; at "fallback smoke rc=$rc"
  [ $rc = 0 ] && { tests _fallback "$sel"; rc=$?; at "fallback GPU tests rc=$rc"; tail -3 "$out/gpu_tests_fallback.log"; }
fi
if [ $rc = 0 ]; then impls="wgmma pingpong"; else impls="wgmma"; tests _no_pingpong "not pingpong"; fi
timeout 120 python3 reports/h200/verify_ab.py "$out" $impls > "$out/verify_ab.log" 2>&1; at "A/B rc=$?"
cat "$out/verify_ab.log"
[ "${FINAL:-0}" = 1 ] || exit 0
timeout 200 kdbench run scenarios/kernels/tree_verify_mla.yaml --device cuda --out "$out/run" --filter bench-peer \
  --filter bench-chain --filter bench-small-heads,batch=32 > "$out/run.log" 2>&1; at "verify scenario (peer cases) rc=$?"
tail -4 "$out/run.log"
python3 - "$out/run" <<'PY' 2>&1 | tee "$out/peer_table.txt"
import sys
from kdbench.results import load_records
for r in load_records(sys.argv[1]):
    print(f"{r.case[:40]:40s} {r.backend:19s} {r.status:7s} {r.time_median_s * 1e3:9.4f} ms  "
          f"floor% {r.pct_of_floor_rate:5.1f}  relL2 {r.rel_l2:.2e}  {r.reason[:80]}")
PY
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool python3 reports/h200/sanitize_kernels.py > "$out/sanitizer_$tool.log" 2>&1
  at "sanitizer $tool rc=$?"; tail -3 "$out/sanitizer_$tool.log"
done
cp "$out/driver.log" "$top/"
