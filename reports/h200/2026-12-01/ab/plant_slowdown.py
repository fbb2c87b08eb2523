"""Plant a slowdown of one of our kernels in a COPY of the tree, for the `--against` demonstration (issue 10):
the cuda backend's tree_accept_greedy queues torch.cuda._sleep(CYCLES) on the stream after the kernel, so the
CUDA-event time of that row grows by the spin (plus one kernel launch) and nothing else changes; no C++
source changes, so both sides share one CUDA build. Usage: python3 plant_slowdown.py TREE [CYCLES]
"""
import sys
from pathlib import Path

tree, cycles = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2000
path = tree / "suite" / "backends" / "cuda_ext.py"
text = path.read_text()
anchor = "                                                            target_tokens, int(max_depth))\n"
if text.count(anchor) != 1:
    sys.exit(f"{path}: the tree_accept_greedy call moved; update plant_slowdown.py")
path.write_text(text.replace(anchor, anchor + f"    torch.cuda._sleep({cycles})   # PLANTED slowdown (A/B demo)\n"))
print(f"planted torch.cuda._sleep({cycles}) after tree_accept_greedy in {path}")
