"""Scenario files: YAML (safe_load only) -> frozen dataclasses -> expanded cases, each with its own seed.

A scenario has a kind (kernel | acceptance | e2e | topology | replay) and a list of cases. A case names its kernel
family (kernel kind), its backends, its `shape`, and optional `sweep` axes (dotted keys such as
`shape.budget` or `dtype`, each a list) that expand to the cartesian product of cases.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import math

import yaml

from kdbench import schema, yamlload
from kdbench.errors import ScenarioError, UserError
from kdbench.backends import registry
from kdbench.shapes import FAMILY_SHAPES, KIND_SHAPES

Kind = Literal["kernel", "acceptance", "e2e", "topology", "replay"]
Dtype = Literal["float32", "bfloat16", "float64"]

MAX_CASES = 5000                  # expanded cases per run unless --max-cases raises it (~hours on a GPU)
MAX_CASE_TIMEOUT_S = 86400.0


@dataclass(frozen=True)
class Tolerance:
    """|got - want| <= atol + rtol * |want| per element; at most max_outside_pct % may fail; relative L2
    (||got - want|| / ||want||) at most rel_l2 when given. rtol = atol = 0 means bit-exact."""
    rtol: float = 0.0
    atol: float = 0.0
    rel_l2: float | None = None
    max_outside_pct: float = 0.0

    def validate(self):
        for name in ("rtol", "atol", "rel_l2", "max_outside_pct"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < math.inf:
                return name, f"got {value}, expected a finite number >= 0"
        if self.max_outside_pct > 100:
            return "max_outside_pct", f"got {self.max_outside_pct}, expected a percentage in 0..100"
        return None


@dataclass(frozen=True)
class Timing:
    warmup: int = 3
    repeat: int = 20
    flush_l2: bool = True            # GPU: write a 2x-L2 buffer between samples (cold caches)

    def validate(self):
        if self.warmup < 0:
            return "warmup", f"got {self.warmup}, expected an integer >= 0"
        if self.repeat < 1:
            return "repeat", f"got {self.repeat}, expected an integer >= 1"
        return None


@dataclass(frozen=True)
class CaseSpec:
    name: str
    shape: dict[str, Any]
    family: str | None = None
    backends: tuple[str, ...] = ("torch",)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    dtype: Dtype = "float32"
    trials: int = 3
    tolerance: Tolerance = Tolerance()
    timing: Timing = Timing()

    def validate(self):
        if not self.backends:
            return "backends", "got an empty list, expected at least one backend"
        twice = [b for i, b in enumerate(self.backends) if b in self.backends[:i]]
        if twice:
            return "backends", f"{twice[0]!r} is listed twice; each backend gives one row per case"
        if self.trials < 1:
            return "trials", f"got {self.trials}, expected an integer >= 1"
        return None


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    kind: Kind
    cases: tuple[CaseSpec, ...]
    description: str = ""
    seed: int = 0
    case_timeout_s: float = 600.0    # wall-clock limit per case; past it the case is an error row "timed out"

    def validate(self):
        if not 0 < self.case_timeout_s <= MAX_CASE_TIMEOUT_S:
            return "case_timeout_s", f"got {self.case_timeout_s}, expected seconds in (0, {MAX_CASE_TIMEOUT_S:g}]"
        return None


@dataclass(frozen=True)
class Case:
    """One expanded case: what the runner executes and what every record of it is keyed by."""
    scenario: str
    kind: str
    name: str
    family: str
    backends: tuple[str, ...]
    shape: Any                       # a frozen shape dataclass from kdbench.shapes
    dtype: str
    seed: int
    trials: int
    tolerance: Tolerance
    timing: Timing
    file: str
    timeout_s: float = 600.0         # the scenario's case_timeout_s

    def shape_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.shape)


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    description: str
    seed: int
    file: str
    text: str
    cases: tuple[Case, ...]


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from the scenario seed and names (same inputs -> same seed on every machine)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load(path: str | Path, max_cases: int = MAX_CASES) -> Scenario:
    """Read, validate and expand one scenario file. Raises ScenarioError (a UserError) on bad input,
    including a file that would expand to more than `max_cases` cases (counted before any is built)."""
    file = str(path)
    text = _read(file)
    data = _parse(text, file)
    if data is None:
        raise ScenarioError(file, "", "the file is empty; expected a mapping with keys name, kind, cases")
    spec = schema.build(ScenarioSpec, data, file)
    if not spec.cases:
        raise ScenarioError(file, "cases", "got an empty list, expected at least one case")
    total = 0
    for i, cs in enumerate(spec.cases):
        total += math.prod(len(v) for v in cs.sweep.values() if isinstance(v, (list, tuple)))
        if total > max_cases:
            raise ScenarioError(file, f"cases[{i}].sweep", f"the cases up to here expand to {total} cases, more "
                                f"than the limit of {max_cases} per run (raise it with --max-cases)")
    cases = tuple(c for i, cs in enumerate(spec.cases) for c in _expand(spec, cs, i, file))
    seen: dict[str, int] = {}
    for case in cases:
        if case.name in seen:
            raise ScenarioError(file, "cases", f"duplicate case name {case.name!r}; names must be unique")
        seen[case.name] = 1
    return Scenario(spec.name, spec.kind, spec.description, spec.seed, file, text, cases)


def _read(file: str) -> str:
    p = Path(file)
    if not p.is_file():
        raise ScenarioError(file, "", "no such scenario file")
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ScenarioError(file, "", f"cannot read: {exc.strerror or exc}") from None


def _parse(text: str, file: str) -> Any:
    """YAML -> plain data; every parser-level failure is a ScenarioError with the line when known."""
    try:
        return yamlload.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        raise ScenarioError(file, "", f"not valid YAML ({where}): {getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, RecursionError) as exc:   # e.g. an integer of more than 4300 digits; nesting too deep
        raise ScenarioError(file, "", f"not valid YAML: {type(exc).__name__}: {str(exc)[:200]}") from None


def _expand(spec: ScenarioSpec, cs: CaseSpec, index: int, file: str) -> list[Case]:
    path = f"cases[{index}]"
    shape_cls = _shape_class(spec.kind, cs, path, file)
    valid = registry.for_family(cs.family) if spec.kind == "kernel" else registry.for_kind(spec.kind)
    for i, backend in enumerate(cs.backends):
        if backend not in valid:
            raise ScenarioError(file, f"{path}.backends[{i}]",
                                f"got {backend!r}, expected one of {', '.join(valid)}")
    if spec.kind == "topology" and len(cs.backends) != 1:
        # one sharded job per case, its attention from the one backend (kinds/topology._job)
        raise ScenarioError(file, f"{path}.backends", f"got {list(cs.backends)}, expected one backend (torch or "
                            "cuda): a topology case is one sharded job; write a case per backend")
    if spec.kind == "topology" and (cs.tolerance.rtol > 0 or cs.tolerance.max_outside_pct > 0):
        # parallel/rows._verdict judges the sharded logits by rel_l2 and max_abs only: an rtol would pass unseen
        raise ScenarioError(file, f"{path}.tolerance", "topology judges the logits by rel_l2 and atol only; got "
                            f"rtol {cs.tolerance.rtol}, max_outside_pct {cs.tolerance.max_outside_pct}, expected "
                            "rel_l2 and / or atol (or all 0: bit-equal)")
    for key in cs.sweep:
        if not (key == "dtype" or key.startswith("shape.")):
            raise ScenarioError(file, f"{path}.sweep.{key}",
                                "unknown sweep axis; expected 'dtype' or 'shape.<key>'")
        if not cs.sweep[key]:
            raise ScenarioError(file, f"{path}.sweep.{key}", "got an empty list, expected values")
    axes = list(cs.sweep.items())
    out = []
    for combo in itertools.product(*[values for _, values in axes]) if axes else [()]:
        shape = dict(cs.shape)
        dtype = cs.dtype
        for (key, _), value in zip(axes, combo):
            if key == "dtype":
                dtype = schema.convert(Dtype, value, file, f"{path}.sweep.dtype")
            else:
                shape[key.split(".", 1)[1]] = value
        shape_obj = _build_shape(shape_cls, shape, dict(zip([k for k, _ in axes], combo)), file, path)
        suffix = ",".join(f"{k.split('.')[-1]}={v}" for (k, _), v in zip(axes, combo))
        name = f"{cs.name}[{suffix}]" if suffix else cs.name
        family = cs.family or ""       # a kernel family; other kinds have none (records carry a policy)
        out.append(Case(spec.name, spec.kind, name, family, cs.backends, shape_obj, dtype,
                        derive_seed(spec.seed, spec.name, name), cs.trials, cs.tolerance, cs.timing, file,
                        spec.case_timeout_s))
    return out


def _build_shape(shape_cls, shape: dict, swept: dict[str, Any], file: str, path: str):
    """A shape error caused by a swept value names the sweep axis and the value, not the base key."""
    try:
        return schema.build(shape_cls, shape, file, f"{path}.shape")
    except ScenarioError as exc:
        key = exc.path.removeprefix(f"{path}.shape.").split(".")[0].split("[")[0]
        axis = f"shape.{key}"
        if axis not in swept:
            raise
        raise ScenarioError(file, f"{path}.sweep.{axis}", f"value {swept[axis]!r}: {exc.message}") from None


def _shape_class(kind: str, cs: CaseSpec, path: str, file: str):
    if kind == "kernel":
        if cs.family not in FAMILY_SHAPES:
            raise ScenarioError(file, f"{path}.family",
                                f"got {cs.family!r}, expected a kernel family: {', '.join(FAMILY_SHAPES)}")
        return FAMILY_SHAPES[cs.family]
    if cs.family is not None:
        raise ScenarioError(file, f"{path}.family", f"only kernel scenarios name a family (kind is {kind})")
    return KIND_SHAPES[kind]


def select(cases: list[Case], exprs: list[str] | None, where: str = "the scenarios") -> list[Case]:
    """--filter, given once or more: the cases any value selects, in file order. A value equal to a case name
    selects that case alone (repro commands); any other value goes through matches(). A value selecting
    nothing is a UserError naming it and `where` (a typo must not silently shrink a run)."""
    if not exprs:
        return list(cases)
    chosen: set[int] = set()   # positions, not names: names repeat across scenario files (`chain`)
    for expr in exprs:
        exact = [i for i, c in enumerate(cases) if c.name == expr]
        hits = exact or [i for i, c in enumerate(cases) if matches(c, expr)]
        if not hits:
            raise UserError(f"--filter {expr!r} matches no case in {where}")
        chosen.update(hits)
    return [c for i, c in enumerate(cases) if i in chosen]


def restrict_backends(cases: list[Case], names: list[str] | None, where: str = "the scenarios") -> list[Case]:
    """--backends: each case keeps the listed names of its own backends, in its order, and a case left with none
    is dropped. A name that no selected case lists is a UserError naming it (a typo must not shrink a run)."""
    if not names:
        return list(cases)
    listed = {b for c in cases for b in c.backends}
    unknown = [n for n in names if n not in listed]
    if unknown:
        raise UserError(f"--backends {','.join(unknown)}: no selected case in {where} lists "
                        f"{'it' if len(unknown) == 1 else 'them'} (they list: {', '.join(sorted(listed))})")
    kept = (dataclasses.replace(c, backends=tuple(b for b in c.backends if b in names)) for c in cases)
    return [c for c in kept if c.backends]


def matches(case: Case, expr: str | None) -> bool:
    """--filter: comma-separated terms, all must match. `key=value` compares a case field or shape key
    (family=tree_build, budget=64); any other term is a substring of the case name."""
    if not expr or expr == case.name:
        return True
    fields_ = {"family": case.family, "kind": case.kind, "dtype": case.dtype, "scenario": case.scenario,
               **{k: str(v) for k, v in case.shape_dict().items()}}
    for term in (t.strip() for t in expr.split(",") if t.strip()):
        if "=" in term:
            key, value = (s.strip() for s in term.split("=", 1))
            if str(fields_.get(key)) != value:
                return False
        elif term not in case.name:
            return False
    return True
