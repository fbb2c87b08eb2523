#!/usr/bin/env bash
# tree_build round 2, a short GPU call (device time was short): the CUDA extension JIT-built while pip installs,
# then the tree_build GPU tests, then as much of the timing grid as the call's limit leaves. Usage: bash THIS OUT
set -uo pipefail
out=${1:?OUT}; mkdir -p "$out"; export MAX_JOBS=16 PYTHONUNBUFFERED=1
t0=$(date +%s); at() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/driver.log"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 &
python3 -c "import importlib.util as u; s = u.spec_from_file_location('cb', 'suite/backends/cuda_build.py'); \
m = u.module_from_spec(s); s.loader.exec_module(m); m.load(verbose=True)" > "$out/build.log" 2>&1 &
wait; at "install + build"; grep -E "error" "$out/build.log" | head -5
timeout 45 python3 -m pytest -q --maxfail=8 -p no:cacheprovider tests/test_tree_build.py > "$out/tests.log" 2>&1
at "tests rc=$?"; tail -12 "$out/tests.log"
python3 reports/h200/time_tree_build_grid.py "$out" 2>&1 | tee "$out/grid.log"
