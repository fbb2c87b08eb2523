"""The collectives the sharded model calls, over one torch.distributed process group, each one timed when asked
(CUDA events on a GPU, read after the step; perf_counter on the CPU), with its layer, name and bytes."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kdbench.timing import between_s, stamp

# torch >= 2.13 renames the *_into_tensor / *_tensor collectives (*_single) and warns on the old names; the
# GPU machine's torch 2.11 has only the old ones, so use them and silence the rename notice
warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed.*_single`")


@dataclass
class CommEvent:
    layer: int          # -1 outside the layer stack
    op: str             # all_reduce | all_gather | reduce_scatter | all_to_all
    nbytes: int         # nccl-tests' size: the larger of the per-rank input and output buffers
    start: object       # cuda Event or perf_counter_ns int
    end: object = None


@dataclass
class Comm:
    """rank / world of the default group; `events` collects timed collectives while `timing` is on."""
    rank: int
    world: int
    device: torch.device
    timing: bool = False
    layer: int = -1
    events: list[CommEvent] = field(default_factory=list)

    def _begin(self, op: str, nbytes: int) -> CommEvent:
        return CommEvent(self.layer, op, nbytes, stamp(self.device.type == "cuda"))

    def _end(self, ev: CommEvent) -> None:
        ev.end = stamp(self.device.type == "cuda")
        self.events.append(ev)

    def _timed(self, op: str, nbytes: int, fn) -> None:
        if not self.timing:
            fn()
            return
        ev = self._begin(op, nbytes)
        fn()
        self._end(ev)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns x."""
        self._timed("all_reduce", x.numel() * x.element_size(), lambda: dist.all_reduce(x))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, ...] per rank -> [world * n, ...], rank order."""
        out = x.new_empty((self.world * x.shape[0],) + tuple(x.shape[1:]))
        self._timed("all_gather", out.numel() * out.element_size(),
                    lambda: dist.all_gather_into_tensor(out, x.contiguous()))
        return out

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x [world, ...]: block q goes to rank q; returns [world, ...] whose block q came from rank q.
        Equal splits, so no split sizes travel through the host (capturable)."""
        out = torch.empty_like(x)
        self._timed("all_to_all", x.numel() * x.element_size(), lambda: dist.all_to_all_single(out, x.contiguous()))
        return out

    def all_to_all_v(self, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """Rows x[sum(send[:q]) : sum(send[:q+1])] go to rank q; returns the rows received, source order.
        The split sizes are host lists: the caller synchronized to get them (not capturable)."""
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        self._timed("all_to_all", x.numel() * x.element_size(),
                    lambda: dist.all_to_all_single(out, x.contiguous(), recv, send))
        return out

    def seconds(self) -> list[tuple[int, str, int, float]]:
        """(layer, op, bytes, seconds) of every timed collective; synchronizes a GPU once."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return [(e.layer, e.op, e.nbytes, between_s(e.start, e.end)) for e in self.events]
