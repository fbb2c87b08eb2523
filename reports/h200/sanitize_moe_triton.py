"""The fused Triton MoE experts (kdbench/model/moe_triton.py) on small odd shapes, for compute-sanitizer
(memcheck, racecheck): hidden and intermediate not multiples of the 64-wide tiles (the EVEN_K = False masks),
expert counts with unused experts, rows 1 / 3 / 37 / 129 / 1031 / 4100 (all three BM row-block sizes), k distinct
random experts per token, without and with the shared expert fused (expert E); each output checked against the torch emulation of the plan
(float64 on the host), so a masked-off tail that went missing fails here too; and the one-launch block plan
(moe_plan_triton) against the torch plan, at its limits (385 experts, 1024 slots) and small odd sizes. Prints one line per shape, exits 1 on a mismatch.
Usage: compute-sanitizer --tool memcheck python3 reports/h200/sanitize_moe_triton.py [MAX_ROWS]
(MAX_ROWS: skip the larger shapes; racecheck runs the Triton kernels ~10x slower than memcheck)"""
import sys

import torch

from kdbench.model import moe_plan_triton, moe_triton
from kdbench.model.moe_plan import block_plan, emulate

dev, bad = "cuda", 0
max_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
g = torch.Generator(device=dev).manual_seed(11)
for e, mi, d, k, rows in ((13, 200, 328, 8, (1, 3, 37)), (7, 64, 128, 2, (129, 1031, 4100)), (384, 96, 520, 8, (5,))):
    w1, w3 = (torch.randn(e, mi, d, generator=g, device=dev).mul_(d ** -0.5).bfloat16() for _ in range(2))
    w2 = torch.randn(e, d, mi, generator=g, device=dev).mul_(mi ** -0.5).bfloat16()
    for n in (r for r in rows if r <= max_rows):
        x = torch.randn(n, d, generator=g, device=dev).bfloat16()
        idx = torch.stack([torch.randperm(e, generator=g, device=dev)[:k] for _ in range(n)])
        wts = torch.rand(n, k, generator=g, device=dev)
        cpu = [t.cpu() for t in (x, idx, wts, w1, w2, w3)]                # emulate is a host loop (float64)
        for sh in (None, (w1[0] * 0.5, w2[-1] * 0.5, w3[1] * 0.5)):       # without / with the shared expert fused
            got = moe_triton.experts(x, idx, wts, w1, w2, w3, shared=sh).float().cpu()
            want = emulate(*cpu, moe_triton.block_rows(n * (k + (sh is not None))),
                           shared=None if sh is None else tuple(m.cpu() for m in sh)).float()
            rel = float((got - want).norm() / want.norm())
            bad += rel > 2e-2
            print(f"E {e} mi {mi} d {d} k {k} rows {n} shared {sh is not None}: rel L2 vs emulation {rel:.1e}",
                  flush=True)
for e, n, bm in ((385, 1024, 16), (13, 37, 3), (7, 1, 1)):                 # the one-launch plan alone
    flat = torch.randint(0, e, (n,), generator=g, device=dev)
    want, (got, token) = block_plan(flat, e, bm), moe_plan_triton.block_plan(flat, e, bm, 9)
    same = all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(token.long(), want.order // 9)
    bad += not same
    print(f"plan E {e} S {n} BM {bm}: {'equal' if same else 'DIFFERS'} to the torch plan", flush=True)
torch.cuda.synchronize()
print(f"sanitize_moe_triton: {'all shapes agree' if not bad else f'{bad} shapes differ'}")
sys.exit(1 if bad else 0)
