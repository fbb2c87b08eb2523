"""One engine step (AR decode, or draft -> build -> verify -> accept -> compact -> commit for DDTree and chain)
captured as a CUDA graph for a fixed batch, tree budget and kv_limit bucket; each replay advances the
EngineState in place. Also the step time eager vs graph and the verify forward's share of it. Design and
limits: plans/0003-engine.md, "CUDA graphs"; whole graph-mode generations: graph_run.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdbench.backends import registry
from kdbench.timing import measure, summarize

from . import engine
from .records import StageTimer
from .stages import DEVICE_BUILT, Policy, device_built
from .state import EngineState

# Eager steps on the capture stream before the capture: lazy initialisation (cuBLAS handles and workspaces of
# that stream, kernel attributes, the grouped-GEMM probe) must not happen while the stream is capturing.
WARMUP_STEPS = 3
_STATE_FIELDS = ("bonus", "gen", "n_gen", "done")       # EngineState tensors a step rewrites
_DRAFTER_FIELDS = ("ctx_k", "ctx_v", "ctx_len")         # BlockDrafter context cache, rewritten by commit


class GraphUnavailable(RuntimeError):
    """The step cannot be captured on this machine (no CUDA device, a torch without generator registration)."""


class _NoTimer:
    """The StageTimer interface without events: timing events cannot be recorded inside a capture."""

    def mark(self, name: str) -> None:
        del name


@dataclass
class StepGraph:
    """A captured step and the state it advances. replay() runs the step once for every request (a finished
    request commits nothing), reads nothing back to the host and leaves tau / tree_size on the device.
    eager_step() runs the same step without the graph on the same buffers (for comparisons and timing).
    steps_left counts the steps (replayed or eager) that surely fit kv_limit; None: any number (the bucket is
    the whole cache). The drafter and its context cache belong to this object while it is in use."""
    run: engine.Plan                 # model, drafter, stages, sampler, depth, rows, max_len
    state: EngineState
    kv_limit: int                    # keys the drafter's attention scans, fixed in the graph
    graph: object                    # torch.cuda.CUDAGraph
    tau: torch.Tensor                # [B] int32, static output: tokens committed by the last replay
    tree_size: torch.Tensor          # [B] int32, static output: tree nodes incl. the root
    steps_left: int | None
    generators: tuple = ()           # torch.Generators registered with the graph (drafter's, sampler's)

    def replay(self) -> None:
        self._take_step()
        self.graph.replay()

    def eager_step(self, timer=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One eager step from the current state (a StageTimer may mark its stages); returns (tau, tree size)."""
        self._take_step()
        with torch.no_grad():
            return engine.step(self.run, self.state, timer or _NoTimer(), self.kv_limit)

    def _take_step(self) -> None:
        if self.steps_left is None:
            return
        if self.steps_left <= 0:
            raise RuntimeError(f"the kv_limit bucket ({self.kv_limit} keys) is used up: the longest request may "
                               f"now exceed it; capture a larger bucket (kv_limit=None with steps=None covers "
                               f"the whole cache)")
        self.steps_left -= 1

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every device tensor a step rewrites in place: the KV cache and lengths, the outputs, the drafter's
        context cache (a BlockDrafter's)."""
        return _tensors(self.run, self.state)

    def snapshot(self) -> dict:
        """Copies of tensors(), the generators' states and steps_left, for restore()."""
        return _snapshot(self.run, self.state, self.generators, self.steps_left)

    def restore(self, snap: dict) -> None:
        """Put a snapshot back into the same buffers (the graph keeps reading them)."""
        _restore(self.run, self.state, self.generators, snap)
        self.steps_left = snap["steps_left"]

    def tokens(self) -> list[list[int]]:
        """The first max_new generated tokens per request (host copy; synchronizes)."""
        return self.state.tokens()


def _tensors(run, st: EngineState) -> dict[str, torch.Tensor]:
    out = {"kv": st.cache.kv, "lengths": st.cache.lengths, **{f: getattr(st, f) for f in _STATE_FIELDS}}
    for f in _DRAFTER_FIELDS:
        if isinstance(getattr(run.drafter, f, None), torch.Tensor):
            out[f] = getattr(run.drafter, f)
    return out


def _snapshot(run, st: EngineState, gens: tuple, steps_left) -> dict:
    return {"tensors": {k: v.clone() for k, v in _tensors(run, st).items()},
            "generators": [g.get_state() for g in gens], "steps_left": steps_left}


def _restore(run, st: EngineState, gens: tuple, snap: dict) -> None:
    for k, v in _tensors(run, st).items():
        v.copy_(snap["tensors"][k])
    for g, state in zip(gens, snap["generators"]):
        g.set_state(state)


# ------------------------------------------------------------------------------------------------ capture

GRAPH_POLICIES = ("ar",) + DEVICE_BUILT   # steps with no host read: AR decode, the GPU-built trees


def capture_reason(model, policy: Policy, backend: str) -> str | None:
    """Why a step of `policy` on `backend` cannot be captured here (the message capture_step would raise),
    or None when it can be tried (a capture can still fail, e.g. for a generator it cannot register)."""
    try:
        _check_capturable(model, policy, backend, 1, None)
    except (ValueError, GraphUnavailable) as exc:
        return str(exc)
    return None


def capture_step(model, drafter, prompts: list[list[int]], policy: Policy, backend: str = "cuda",
                 kv_limit: int | None = None, *, max_new_tokens: int = 64, temperature: float = 0.0,
                 seed: int = 0, steps: int | None = None, rewind: bool = False) -> StepGraph:
    """Prefill `prompts`, run WARMUP_STEPS eager steps on a side stream, then capture one step (AR decode, or a
    speculative step) on that stream into a torch.cuda.CUDAGraph. The state after the warm-up is the graph's
    starting point; rewind=True puts the post-prefill state back after the capture (the warm-up's tokens are
    undone: replays then make the whole generation, graph_run.generate_graphed).

    kv_limit: keys the drafter scans (the CUDA attention reads past_len + T itself); None = the smallest
    multiple of engine.KV_BUCKET that fits `steps` more steps after the warm-up, or the whole cache (any
    number of steps) when steps is None. Raises ValueError for what no machine can capture (a tree policy on
    backend "torch", a policy other than ar / ddtree / chain: they build trees in a host heap; a kv_limit too
    small for the warm-up) and GraphUnavailable (a RuntimeError) where CUDA or generator registration is
    missing.
    """
    _check_capturable(model, policy, backend, max_new_tokens, steps)
    with torch.no_grad():
        run, st = engine.prepare(engine.Request(model, drafter, prompts, max_new_tokens, policy, temperature, seed,
                                                backend))
        gens = _generators(run)
        limit = _kv_limit(run, st, kv_limit, steps)
        start = _snapshot(run, st, gens, None) if rewind else None
        stream = torch.cuda.Stream(device=model.device)
        _warm_up(run, st, limit, stream)
        graph = torch.cuda.CUDAGraph()
        for g in gens:  # before capture_begin, so each replay advances their Philox offsets as eager steps do
            graph.register_generator_state(g)
        with torch.cuda.graph(graph, stream=stream):
            tau, size = engine.step(run, st, _NoTimer(), limit)
        if rewind:
            _restore(run, st, gens, start)
        steps_left = _steps_left(run, st, limit)
    return StepGraph(run, st, limit, graph, tau, size, steps_left, gens)


def _check_capturable(model, policy: Policy, backend: str, max_new_tokens: int, steps) -> None:
    """Argument errors first (they hold on every machine), then the device."""
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy, got {type(policy).__name__}")
    if policy.kind not in GRAPH_POLICIES:
        raise ValueError(f"capture_step captures AR, DDTree and chain steps only, got {policy.label}: other "
                         f"policies build their trees in the torch host heap (not capturable)")
    if policy.kind != "ar" and not device_built(policy.kind, backend):
        raise ValueError(f"capture_step needs a GPU stage backend for {policy.label}, got {backend!r}: the torch "
                         f"tree_build runs a host heap (reads the draft on the host), which a graph cannot capture")
    dispatch = getattr(model, "moe_dispatch", "auto")
    sync = registry.get("moe_" + dispatch).host_sync if dispatch != "auto" else ""
    if sync:
        raise ValueError(f"the target's MoE dispatch {dispatch!r} cannot be captured in a CUDA graph: {sync} on every "
                         f"MoE layer")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be None or an int >= 1, got {steps!r}")
    if not torch.cuda.is_available():
        raise GraphUnavailable("capture_step needs a CUDA GPU: torch.cuda.is_available() is False "
                               f"(torch {torch.__version__})")
    if torch.device(model.device).type != "cuda":
        raise GraphUnavailable(f"capture_step needs the model on a CUDA device, got {model.device}")


def _generators(run) -> tuple:
    """The non-default generators a step draws from: the drafter's (a SyntheticDrafter's .gen, made by
    reset() in the prefill) and the sampler's (T > 0). The default CUDA generator needs no registration."""
    gens = []
    if isinstance(getattr(run.drafter, "gen", None), torch.Generator):
        gens.append(run.drafter.gen)
    if not run.sampler.greedy:
        gens.append(run.sampler.gen)
    if gens and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        raise GraphUnavailable(f"this step draws from a torch.Generator, and torch {torch.__version__} cannot "
                               f"register one with a CUDA graph (CUDAGraph.register_generator_state): run it "
                               f"eagerly, or use the BlockDrafter at temperature 0")
    return tuple(gens)


def _kv_limit(run, st: EngineState, kv_limit, steps) -> int:
    """The bucket. Step k (from 0) after the prefill reaches at most longest + k (L + 1) + rows keys."""
    longest = int(st.cache.lengths.max())  # host read before the capture (allowed there)
    reach = lambda k: longest + k * (run.depth + 1) + run.rows  # noqa: E731
    if kv_limit is None:
        if steps is None:
            return run.max_len
        return engine.bucketed_kv_limit(run, reach(WARMUP_STEPS + steps - 1))
    need = reach(WARMUP_STEPS - 1)
    if not isinstance(kv_limit, int) or not need <= kv_limit <= run.max_len:
        raise ValueError(f"kv_limit must be an int in [{need}, {run.max_len}] (the warm-up's reach, the cache "
                         f"rows), got {kv_limit!r}")
    return kv_limit


def _steps_left(run, st: EngineState, limit: int) -> int | None:
    """Steps that surely fit the bucket from the post-warm-up lengths (host read, before the capture)."""
    if limit >= run.max_len:
        return None  # the cache is sized for the whole run and frozen requests stop growing
    longest = int(st.cache.lengths.max())
    return max(0, (limit - run.rows - longest) // (run.depth + 1) + 1)


def _warm_up(run, st: EngineState, limit: int, stream) -> None:
    """WARMUP_STEPS eager steps on the capture stream, ordered after the prefill and before what follows."""
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_STEPS):
            engine.step(run, st, _NoTimer(), limit)
    current.wait_stream(stream)


# ------------------------------------------------------------------------------------------------- timing

def time_step_eager_vs_graph(model, drafter, prompts: list[list[int]], policy: Policy, n_steps: int, *,
                             max_new_tokens: int | None = None, kv_limit: int | None = None,
                             temperature: float = 0.0, seed: int = 0) -> dict:
    """The step time eager vs graph over the same n_steps steps (one capture; the state is restored between
    the runs), and the verify forward's share of the eager step.

    eager_step_s / graph_step_s: raw samples in seconds, CUDA events around each step (kdbench.timing.measure:
    one untimed step first, steps back to back, no L2 flush: steady decoding). verify_s: the verify forward
    alone (StageTimer events in eager steps over the same steps). verify_share = median(verify_s) /
    median(eager_step_s); outside_verify_s = median(eager) - median(verify): draft, build, accept, compact,
    commit and the launch gaps between them. graph_outside_verify_s = median(graph) - median(verify): an
    estimate, since a graph is one launch and its verify forward is not timed apart (the eager verify time
    includes its own launch gaps, so this can underestimate and even go negative for small models).
    max_new_tokens None: enough that no request finishes while timed.
    """
    if not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
    steps = n_steps + 1  # the untimed first step, then n_steps timed
    if max_new_tokens is None:
        max_new_tokens = (WARMUP_STEPS + steps) * (getattr(drafter, "depth", 0) + 1) + 1
    sg = capture_step(model, drafter, prompts, policy, kv_limit=kv_limit, max_new_tokens=max_new_tokens,
                      temperature=temperature, seed=seed, steps=steps if kv_limit is None else None)
    start, dev = sg.snapshot(), str(model.device)
    # no launch shield: the host's launch overhead is what a graph removes, so both sides must pay it
    eager = measure(sg.eager_step, warmup=1, repeat=n_steps, device=dev, flush_l2=False, shield=False)
    sg.restore(start)
    graph = measure(sg.replay, warmup=1, repeat=n_steps, device=dev, flush_l2=False, shield=False)
    sg.restore(start)
    verify = _verify_seconds(sg, steps)[1:]
    v = summarize(verify).median_s
    return dict(eager_step_s=eager.samples_s, graph_step_s=graph.samples_s, verify_s=verify,
                verify_share=v / eager.median_s, outside_verify_s=eager.median_s - v,
                graph_outside_verify_s=graph.median_s - v, kv_limit=sg.kv_limit, batch=len(prompts),
                rows=sg.run.rows)


def _verify_seconds(sg: StepGraph, n: int) -> list[float]:
    """The verify forward's time in each of n eager steps (StageTimer events; finish() syncs once per step)."""
    out = []
    for _ in range(n):
        timer = StageTimer(sg.run.model.device)
        sg.eager_step(timer)
        out.append(timer.finish()["verify"] * 1e-9)  # ns -> s
    return out
