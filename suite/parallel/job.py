"""What one sharded run does, as a frozen dataclass that travels to every rank (spawn pickles it; torchrun
reads it from a JSON file), and the inputs every rank rebuilds identically from the seed."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import torch

PHASES = ("prefill", "decode", "verify", "moe")
FAULTS = ("none", "raise", "kill", "hang")


@dataclass(frozen=True)
class Job:
    model: str
    seed: int
    dtype: str                      # float64 | float32 | bfloat16
    parallel: str                   # tp | ep (kdbench.parallel.shard)
    world: int
    device: str                     # cpu (gloo) | cuda (nccl, one GPU per rank)
    out_dir: str                    # per-rank result files, NCCL logs
    ep_dispatch: str = "padded"     # padded (capturable, fixed capacity) | exact (split sizes via the host)
    batch: int = 2
    prompt_len: int = 16
    budget: int = 15                # tree nodes besides the root: verify runs budget + 1 rows
    phases: tuple[str, ...] = PHASES
    check: bool = True              # rank 0 also runs the one-process model and compares
    warmup: int = 1
    repeat: int = 3
    attn: str = "torch"
    timeout_s: float = 60.0         # collective timeout (init_process_group) and the launcher's deadline
    fault: str = "none"             # inject on fault_rank before the decode phase (tests)
    fault_rank: int = 1
    comm_bench: tuple[int, ...] = ()   # message sizes in bytes for the collective microbenchmark
    comm_bench_step: bool = False   # also benchmark every distinct (op, bytes) the phases sent
    env: dict[str, str] = field(default_factory=dict)   # NCCL settings of the link mode, set in each rank

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Job":
        d = json.loads(text)
        d["phases"] = tuple(d["phases"])
        d["comm_bench"] = tuple(d["comm_bench"])
        return cls(**d)


@dataclass(frozen=True)
class Inputs:
    prompt: torch.Tensor     # [B, P] int64
    decode: torch.Tensor     # [B, 1] int64: the token after the prompt
    tree: torch.Tensor       # [B, N] int64 tree tokens, node 0 = root
    depth: torch.Tensor      # [B, N] int64 node depth (root 0)
    anc: torch.Tensor        # [B, N, ceil(N/64)] int64 ancestor-or-self bits


def make_inputs(job: Job, vocab: int) -> Inputs:
    """Random prompt, next token and a random tree (node i's parent uniform in [0, i)), from the job's seed."""
    g = torch.Generator().manual_seed(job.seed)
    B, P, N = job.batch, job.prompt_len, job.budget + 1
    prompt = torch.randint(0, vocab, (B, P), generator=g)
    decode = torch.randint(0, vocab, (B, 1), generator=g)
    tree = torch.randint(0, vocab, (B, N), generator=g)
    depth = torch.zeros(B, N, dtype=torch.int64)
    words = -(-N // 64)
    anc = torch.zeros(B, N, words, dtype=torch.int64)
    for b in range(B):
        bits = [1 << 0]                                   # python ints: ancestor-or-self sets
        for i in range(1, N):
            parent = int(torch.randint(0, i, (1,), generator=g))
            depth[b, i] = depth[b, parent] + 1
            bits.append(bits[parent] | (1 << i))
        for i, m in enumerate(bits):
            for w in range(words):
                v = (m >> (64 * w)) & ((1 << 64) - 1)
                anc[b, i, w] = v - (1 << 64) if v >= 1 << 63 else v   # as a signed int64
    return Inputs(prompt, decode, tree, depth, anc)
