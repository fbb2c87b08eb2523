"""Timing: CUDA events per sample after warm-up with an optional L2 flush (GPU), perf_counter_ns (CPU);
raw samples kept, median with p20/p80; rounds() interleaves several contenders in alternating order (ABBA).
Also the measured roofline ceilings of the machine (cached per GPU) and the one roofline floor formula.
"""
from __future__ import annotations

import datetime
import functools
import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

L2_FALLBACK_BYTES = 64 << 20        # used only when torch does not report the L2 size
# Launch shield: a GPU spin of this many cycles (~100 us at 1.98 GHz) is queued before each sample's start
# event, so the event, fn's first launch and the end event are enqueued while the GPU is still busy: host
# launch latency stays out of the device time (on the H200 a slower host made 7-35 us kernels read 1.2-2.2x
# slower in one run of an A/A pair). It also hides up to ~100 us of any host work inside fn that does not wait
# for the GPU; host work that blocks on the GPU (a sync, a device-to-host copy) is timed in full. Callers that
# measure host overhead itself (eager vs CUDA-graph steps) pass shield=False.
LAUNCH_SHIELD_CYCLES = 200_000


def stamp(cuda: bool):
    """A time point in the current stream's order: a recorded CUDA event on the GPU, perf_counter_ns on the CPU.
    The one place the engine's stage timer and the sharded run's phase / layer / collective timers take one."""
    if not cuda:
        return time.perf_counter_ns()
    import torch   # noqa: PLC0415  (timing stays importable without torch, as the functions below)
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def between_s(a, b) -> float:
    """Seconds from stamp a to stamp b (CUDA events: only after b has completed, e.g. a synchronize)."""
    return (b - a) * 1e-9 if isinstance(a, int) else a.elapsed_time(b) * 1e-3


@dataclass(frozen=True)
class TimingResult:
    samples_s: list[float]          # one per timed call, seconds, in measurement order
    median_s: float
    p20_s: float
    p80_s: float
    outputs: list = field(default_factory=list, repr=False, compare=False)   # fn's returns (keep_outputs)


def summarize(samples) -> TimingResult:
    """Median and 20th/80th percentiles (linear interpolation) of raw samples in seconds."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("summarize() needs at least one sample")
    p20, med, p80 = np.percentile(arr, [20, 50, 80])
    return TimingResult([float(x) for x in arr], float(med), float(p20), float(p80))


def measure(fn: Callable[[], object], *, warmup: int, repeat: int, device: str,
            flush_l2: bool = True, shield: bool = True, keep_outputs: bool = False) -> TimingResult:
    """Call fn `warmup` times untimed, then `repeat` timed samples. device 'cuda' (or 'cuda:N'): one pair of
    CUDA events around each call on the current stream, a 2x-L2 buffer written before each sample when
    flush_l2 (cold caches), then the launch shield when `shield` (LAUNCH_SHIELD_CYCLES). device 'cpu':
    perf_counter_ns around each call; flush_l2 is not applied. keep_outputs: the result holds every timed
    call's return value (held alive, so no timed call can write into a block an earlier one filled)."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"measure(): warmup={warmup}, repeat={repeat}; need warmup >= 0, repeat >= 1")
    if device == "cpu":
        return _measure_cpu(fn, warmup, repeat, keep_outputs)
    if device.startswith("cuda"):
        return _measure_cuda(fn, warmup, repeat, device, flush_l2, shield, keep_outputs)
    raise ValueError(f"measure(): device {device!r}, expected 'cpu' or 'cuda'")


def _measure_cpu(fn, warmup: int, repeat: int, keep: bool) -> TimingResult:
    for _ in range(warmup):
        fn()
    samples, outputs = [], []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        out = fn()
        samples.append((time.perf_counter_ns() - t0) * 1e-9)
        if keep:
            outputs.append(out)
    return _with_outputs(summarize(samples), outputs)


def _with_outputs(t: TimingResult, outputs: list) -> TimingResult:
    return TimingResult(t.samples_s, t.median_s, t.p20_s, t.p80_s, outputs)


@dataclass(frozen=True)
class Contender:
    """One entry of rounds(): the timed call and the device it is timed on."""
    fn: Callable[[], object]
    device: str


def graph_replays_s(fn: Callable[[], object], reps: int = 20, inner: int = 1) -> list[float]:
    """Per-call seconds of `reps` replays of a CUDA graph of `inner` back-to-back calls of fn (one warm call before
    the capture, 3 untimed replays), each replay between two events with a synchronize after it. No L2 flush and no
    launch shield: a replay's reading includes the graph's launch (~15-25 us on the H200), which inner > 1 spreads
    over the calls. The scripts' small-op A/Bs use it (reports/h200/forward_profile.py, decode_splits.py)."""
    import torch   # noqa: PLC0415
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    for _ in range(3):
        g.replay()
    out = []
    for _ in range(reps):
        a = stamp(True)
        g.replay()
        b = stamp(True)
        torch.cuda.synchronize()
        out.append(between_s(a, b) / inner)
    return out


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: as given, then reversed, alternating (A B, B A, A B, ...: ABBA), so a drift
    of the machine over the run (clocks, temperature, a neighbour) falls on every contender alike."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def rounds(contenders: dict[str, Contender], *, warmup: int, repeat: int, n_rounds: int = 4,
           flush_l2: bool = True, keep_outputs: bool = False) -> dict[str, TimingResult | Exception]:
    """Time every contender in n_rounds rounds of about repeat / n_rounds samples each (repeat in total), in
    round_orders(); each later round warms its contender up again with one call (none when warmup is 0).
    A contender that raises is dropped from the later rounds and its exception returned in its place.
    keep_outputs: each result's outputs are the returns of its first and its last timed call (the calls of
    one round are all held alive until the round ends)."""
    n = max(1, min(n_rounds, repeat))
    sizes = [repeat // n + (1 if r < repeat % n else 0) for r in range(n)]
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    outputs: dict[str, list] = {k: [] for k in contenders}
    failed: dict[str, Exception] = {}
    for r, order in enumerate(round_orders(list(contenders), n)):
        for name in (k for k in order if k not in failed):
            c = contenders[name]
            try:
                t = measure(c.fn, warmup=warmup if r == 0 else min(warmup, 1), repeat=sizes[r],
                            device=c.device, flush_l2=flush_l2, keep_outputs=keep_outputs)
            except Exception as exc:  # noqa: BLE001 - one contender's failure must not stop the others
                failed[name] = exc
                continue
            samples[name] += t.samples_s
            outputs[name] = (outputs[name][:1] or t.outputs[:1]) + t.outputs[-1:]   # the first and the last
    return {k: failed[k] if k in failed else _with_outputs(summarize(samples[k]), outputs[k]) for k in contenders}


def l2_bytes(device: str = "cuda") -> int:
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or L2_FALLBACK_BYTES)


def _measure_cuda(fn, warmup: int, repeat: int, device: str, flush_l2: bool, shield: bool,
                  keep: bool = False) -> TimingResult:
    import torch
    dev = torch.device(device)
    with torch.cuda.device(dev):
        for _ in range(warmup):
            fn()
        # writing 2x L2 evicts everything fn's previous call left in L2 (the flush itself is not timed)
        flush = torch.empty(2 * l2_bytes(device), dtype=torch.uint8, device=dev) if flush_l2 else None
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeat)]
        torch.cuda.synchronize(dev)
        spin = getattr(torch.cuda, "_sleep", None) if shield else None   # torch's spin kernel
        outputs = []
        for start, end in events:
            if flush is not None:
                flush.fill_(1)
            if spin is not None:
                spin(LAUNCH_SHIELD_CYCLES)
            start.record()
            out = fn()
            end.record()
            if keep:
                outputs.append(out)
        torch.cuda.synchronize(dev)
        samples = [start.elapsed_time(end) * 1e-3 for start, end in events]   # ms -> s
    return _with_outputs(summarize(samples), outputs)


# ------------------------------------------------------------------------------------------ ceilings

@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float         # device-to-device copy, bytes read + written per second
    bf16_flops_per_s: float         # 8192^3 bf16 matmul on the GPU; a float32 matmul rate on CPU
    source: str                     # how and where it was measured (or the cache file it came from)


def floor_seconds(bytes_moved: float, flops: float, c: Ceilings) -> float:
    """Roofline floor: the time the work needs at the measured ceilings, max(bytes/copy_bw, flops/rate)."""
    return max(bytes_moved / c.copy_bytes_per_s, flops / c.bf16_flops_per_s)


def pct_of_floor_rate(floor_s: float, median_s: float) -> float:
    """100 * floor / measured: 100 means the kernel runs at the ceiling, 10 means 10x slower than it."""
    return 100.0 * floor_s / median_s if median_s > 0 else math.nan


def attainable_flops_per_s(intensity: float, copy_bytes_per_s: float, flops_per_s: float) -> float:
    """The roof of the roofline plot at `intensity` FLOP/byte: min(peak, intensity x bandwidth), the rate form
    of floor_seconds (flops / attainable = the floor of that work)."""
    return min(flops_per_s, intensity * copy_bytes_per_s)


def cache_dir() -> Path:
    return Path(os.environ.get("KDBENCH_CACHE_DIR", Path.home() / ".cache" / "kdbench"))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@functools.lru_cache(maxsize=None)
def ceilings(device: str) -> Ceilings:
    """Measured once per process (CPU) or once per machine (GPU: cached as JSON keyed by name + driver)."""
    if device == "cpu":
        return _cpu_ceilings()
    if not device.startswith("cuda"):
        raise ValueError(f"ceilings(): device {device!r}, expected 'cpu' or 'cuda'")
    import torch
    name = torch.cuda.get_device_name(torch.device(device))
    path = cache_dir() / f"ceilings-{_slug(name)}-{_slug(_driver_version())}.json"
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        return Ceilings(data["copy_bytes_per_s"], data["bf16_flops_per_s"], f"{data['source']}; cached {path}")
    result = _gpu_ceilings(device, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=2), encoding="utf-8")
    return result


def _driver_version() -> str:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as exc:   # noqa: BLE001 - any NVML problem only weakens the cache key
        return f"unknown-driver-{type(exc).__name__}"


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _gpu_ceilings(device: str, name: str) -> Ceilings:
    import torch
    dev = torch.device(device)
    n_bytes = 1 << 30                                     # 1 GiB each way
    src = torch.empty(n_bytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    copy = measure(lambda: dst.copy_(src), warmup=3, repeat=10, device=device, flush_l2=False)
    del src, dst
    n = 8192
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
    mm = measure(lambda: a @ b, warmup=3, repeat=10, device=device, flush_l2=False)
    return Ceilings(2 * n_bytes / copy.median_s, 2 * n ** 3 / mm.median_s,
                    f"measured {_today()} on {name}: 1 GiB device copy (read+write), 8192^3 bf16 matmul, "
                    "median of 10")


def _cpu_ceilings() -> Ceilings:
    n_bytes = 64 << 20                                    # 64 MiB: past the LLC of most CPUs, fast to copy
    src = np.ones(n_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    copy = measure(lambda: np.copyto(dst, src), warmup=1, repeat=5, device="cpu")
    n = 512
    rng = np.random.default_rng(0)
    # float32: the CPU backends run float32 (a float64 rate let float32 kernels show > 100 % of the floor)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    mm = measure(lambda: a @ b, warmup=1, repeat=5, device="cpu")
    return Ceilings(2 * n_bytes / copy.median_s, 2 * n ** 3 / mm.median_s,
                    f"measured {_today()} on CPU: 64 MiB memcpy (read+write), 512^3 float32 matmul, median of 5")
