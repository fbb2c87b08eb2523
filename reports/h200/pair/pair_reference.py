"""Write tests/data/pair_reference.kdtr: the shipped pair's float32 CPU logits for three held-out prompts (one
per category; the target's next-token logits after each prompt, and the drafter's block after the first), the
values tests/test_pair.py must reproduce. Rerun only when the shipped pair changes."""
import sys
from pathlib import Path

import numpy as np
import torch

from kdbench import kdtr, pair
from kdbench.corpus import CATEGORIES
from kdbench.kinds.generation import next_logits
from kdbench.prompts import token_prompts

PROMPT_LEN = 24


def reference() -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    target = pair.load_target("cpu", torch.float32)
    drafter = pair.load_drafter(target)
    prompts = [token_prompts(c, 1, PROMPT_LEN)[0] for c in CATEGORIES]
    out = {"prompts": np.array(prompts, dtype=np.int64)}
    out["target_logits"] = np.stack([next_logits(target, p).numpy() for p in prompts])  # [3, V]
    p = torch.tensor([prompts[0]])
    taps = target.forward(p, torch.arange(PROMPT_LEN)[None], target.new_cache(1, PROMPT_LEN),
                          torch.zeros(1, dtype=torch.int32), tap_layers=drafter.tap_layers).taps
    drafter.reset(1, PROMPT_LEN + 32)
    drafter.begin(taps, torch.tensor([PROMPT_LEN]))
    bonus = torch.tensor([int(out["target_logits"][0].argmax())])
    out["drafter_logits"] = drafter.draft(bonus, torch.tensor([PROMPT_LEN]), PROMPT_LEN + 32)[0].numpy()  # [L, V]
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/pair_reference.kdtr")
    kdtr.save(path, reference())
    print(path)
