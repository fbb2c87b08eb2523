"""One line per e2e record of the invariant scenario: case, policy, lossless verdict, tau, step and AR step times."""
import json
import sys

for line in open(sys.argv[1]):
    r = json.loads(line)
    ex = r.get("extra") or {}
    print(f"{r.get('case', '')[:40]:40s} {r.get('family', ''):16s} inv={ex.get('batch_invariant')} "
          f"status={r.get('status')} lossless={r.get('lossless')} tau={r.get('tau')} "
          f"step_ms={1e3 * (r.get('time_median_s') or 0):.2f} ar_step_ms={1e3 * (ex.get('ar_step_median_s') or 0):.2f} "
          f"stages_ms={ {k: round(v * 1e3, 2) for k, v in (ex.get('stage_s') or {}).items()} }")
