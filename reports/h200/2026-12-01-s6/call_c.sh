#!/usr/bin/env bash
# Session 6, call C: ncu on tree_verify_mla v4 (seesaw) and v3 (ping-pong), B 16 H 64 T 65 ctx 8192 (the harness's
# first timed shape, 4th launch), with warp-state sampling per SASS instruction; the top stalled instructions of each.
# Usage (device machine, repo root): bash reports/h200/2026-12-01-s6/call_c.sh OUT
set -uo pipefail
out=${1:?OUT}; mkdir -p "$out"
F="-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc -lineinfo"
nvcc $F reports/h200/racecheck_pingpong.cu -o /tmp/rcp || exit 1
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy"
for p in seesaw pingpong; do
  timeout 150 ncu --clock-control none $S --kernel-name regex:"tree_verify_mla_${p}_kernel" --launch-skip 3 --launch-count 1 \
    -f -o "/tmp/ncu_$p" /tmp/rcp $p time > "$out/ncu_$p.log" 2>&1
  ncu --import "/tmp/ncu_$p.ncu-rep" --page details > "$out/ncu_${p}_details.txt" 2>&1
  ncu --import "/tmp/ncu_$p.ncu-rep" --page source --csv --print-source sass > "$out/ncu_${p}_sass.csv" 2>&1
  ncu --import "/tmp/ncu_$p.ncu-rep" --page raw --csv > "$out/ncu_${p}_raw.csv" 2>&1
done
tar -czf "$out/ncu.tgz" -C "$out" $(cd "$out" && ls ncu_*) && ls -la "$out"
