#!/usr/bin/env bash
# Session 6, call G: does any output of v3 (ping-pong) or v4 (seesaw) depend on the warpgroups' relative timing? The
# harness built plainly and with -DKDB_TVM_JITTER (random 0..1.5 us sleeps per warp around every named barrier); the
# hash of every output bit must not change: 4 small shapes x 5 jittered runs, and the 3 big timed shapes x 1.
# Usage (device machine, repo root): bash reports/h200/2026-12-01-s6/call_g.sh OUT
set -uo pipefail
out=${1:?OUT}; mkdir -p "$out"
F="-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc"; S=reports/h200/racecheck_pingpong.cu
(nvcc $F $S -o /tmp/rcp & nvcc $F -DKDB_TVM_JITTER $S -o /tmp/rcp_j & wait) || exit 1
for p in pingpong seesaw; do
  { echo "== $p plain"; timeout 30 /tmp/rcp $p; for r in 1 2 3 4 5; do echo "== $p jitter $r"; timeout 60 /tmp/rcp_j $p; done
    echo "== $p plain time"; timeout 90 /tmp/rcp $p time; echo "== $p jitter time"; timeout 200 /tmp/rcp_j $p time; } \
    > "$out/jitter_$p.log" 2>&1
  grep -h "hash" "$out/jitter_$p.log" | sed 's/.*: //' | sort | uniq -c > "$out/jitter_${p}_counts.txt"
done
for p in pingpong seesaw; do echo "-- $p: distinct (shape, hash) lines"; grep "hash" "$out/jitter_$p.log" | sed 's/sum of lse [^,]*, //' | sort | uniq -c; done
