"""Tests of kdbench.timing on CPU: summarize statistics, the CPU measure path (counts, units, ordering),
argument errors, the roofline helpers and the CPU ceilings."""
import time

import numpy as np
import pytest
import torch

from kdbench import timing
from kdbench.timing import Ceilings, TimingResult, floor_seconds, measure, pct_of_floor_rate, summarize


def test_summarize_matches_numpy_percentiles():
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    res = summarize(samples)
    assert res.samples_s == samples           # raw order kept for the compare step
    assert res.median_s == 3.0
    assert res.p20_s == pytest.approx(np.percentile(samples, 20)) == pytest.approx(1.8)
    assert res.p80_s == pytest.approx(4.2)


def test_summarize_single_sample_and_empty():
    res = summarize([0.25])
    assert (res.median_s, res.p20_s, res.p80_s) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError):
        summarize([])


def test_cpu_measure_counts_calls_and_measures_seconds():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    res = measure(fn, warmup=2, repeat=5, device="cpu")
    assert isinstance(res, TimingResult)
    assert len(calls) == 7 and len(res.samples_s) == 5
    assert all(0.0019 < s < 0.5 for s in res.samples_s)          # seconds, not ns or ms
    assert res.p20_s <= res.median_s <= res.p80_s


def test_cpu_measure_orders_a_slow_and_a_fast_function():
    fast = measure(lambda: None, warmup=1, repeat=9, device="cpu")
    slow = measure(lambda: time.sleep(0.003), warmup=0, repeat=3, device="cpu")
    assert fast.median_s < slow.median_s


@pytest.mark.parametrize("kwargs", [dict(warmup=0, repeat=0, device="cpu"),
                                    dict(warmup=-1, repeat=3, device="cpu"),
                                    dict(warmup=0, repeat=3, device="tpu")])
def test_measure_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        measure(lambda: None, **kwargs)


def test_floor_and_pct_of_floor_rate():
    c = Ceilings(copy_bytes_per_s=4e12, bf16_flops_per_s=800e12, source="test")
    assert floor_seconds(4e9, 1e9, c) == pytest.approx(1e-3)      # memory bound: 4 GB at 4 TB/s
    assert floor_seconds(1e6, 8e14, c) == pytest.approx(1.0)      # compute bound
    assert pct_of_floor_rate(1e-3, 4e-3) == pytest.approx(25.0)


def test_cpu_ceilings_are_positive_and_say_how(monkeypatch, tmp_path):
    monkeypatch.setenv("KDBENCH_CACHE_DIR", str(tmp_path))
    timing.ceilings.cache_clear()
    c = timing.ceilings("cpu")
    assert 1e8 < c.copy_bytes_per_s < 1e13           # 0.1 GB/s .. 10 TB/s: plausible for any machine
    assert 1e7 < c.bf16_flops_per_s < 1e14
    assert "float32 matmul" in c.source and "memcpy" in c.source
    assert timing.ceilings("cpu") is c               # measured once per process
    with pytest.raises(ValueError):
        timing.ceilings("tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA-event timing")
def test_cuda_timing_keeps_host_launch_latency_out():
    """A 30 us host delay (busy wait) before a tiny launch must not show in the device time: the launch shield
    keeps the GPU busy while the host enqueues (without it every sample would read >= 30 us)."""
    x = torch.zeros(1024, device="cuda")

    def slow_host_launch():
        t_end = time.perf_counter() + 30e-6
        while time.perf_counter() < t_end:
            pass
        x.add_(1)

    res = timing.measure(slow_host_launch, warmup=2, repeat=20, device="cuda", flush_l2=False)
    assert res.median_s < 15e-6, f"median {res.median_s * 1e6:.1f} us: host latency leaked into device time"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA-event timing")
def test_cuda_timing_without_shield_keeps_host_gaps():
    """shield=False (eager vs graph steps): a host gap between two launches inside fn is device idle time."""
    x = torch.zeros(1024, device="cuda")

    def gap_between_launches():
        x.add_(1)
        t_end = time.perf_counter() + 30e-6
        while time.perf_counter() < t_end:
            pass
        x.add_(1)

    res = timing.measure(gap_between_launches, warmup=2, repeat=20, device="cuda", flush_l2=False, shield=False)
    assert res.median_s > 25e-6, f"median {res.median_s * 1e6:.1f} us: the host gap must be timed"


def test_cpu_stamps_measure_seconds():
    """stamp / between_s (the engine's stage timer and the sharded timers): seconds, not ns or ms."""
    a = timing.stamp(False)
    time.sleep(0.02)
    b = timing.stamp(False)
    assert 0.02 <= timing.between_s(a, b) < 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph replays)")
def test_graph_replays_spread_the_launch_over_the_calls():
    """graph_replays_s: one sample per replay, per call; a graph of 8 calls of a ~10 us spin reads less per call
    than a graph of one, whose reading holds the graph's launch."""
    spin = lambda: torch.cuda._sleep(20_000)  # noqa: E731
    one, eight = timing.graph_replays_s(spin, reps=10), timing.graph_replays_s(spin, reps=10, inner=8)
    assert len(one) == len(eight) == 10 and min(one + eight) > 0
    assert np.median(eight) < np.median(one)
