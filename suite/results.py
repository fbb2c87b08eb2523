"""One Record schema for every result row, and the run directory that holds them.

A run directory holds `records.jsonl` (appended and fsynced one record at a time, so a killed run keeps
every finished case), `results.csv` (rewritten atomically after each case), `meta.json` (git sha, versions,
machine fingerprint, scenario texts, the repro command) and `report.html`. Field order = column order.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kdbench.errors import DamagedRun

KEY_COLUMNS = ("scenario", "kind", "case", "family", "backend", "dtype", "device", "link", "policy", "phase")
POLICY_KINDS = ("acceptance", "e2e", "replay")   # rows keyed by a generation policy, not a kernel family
STATUSES = ("pass", "fail", "error", "skipped", "info")


@dataclass
class Record:
    # keys
    scenario: str
    kind: str
    case: str
    family: str                      # the kernel family (kernel rows only; "" for other kinds)
    backend: str
    dtype: str = ""
    device: str = ""                 # GPU name or "cpu"
    link: str = ""                   # topology: nvlink | pcie | "" for one device
    policy: str = ""                 # acceptance / e2e / replay: the generation policy, e.g. "ddtree(B=64)"
    phase: str = ""                  # topology: prefill | decode | verify | moe, or comm:<op>:<bytes> (a collective)
    shape: str = ""                  # the case's shape as compact JSON
    seed: int = 0
    # verdict
    status: str = "info"             # pass | fail | error | skipped | info (measured, nothing to check)
    reason: str = ""
    # correctness (kernel cases: worst over trials)
    trials: int = 0
    n_nan: int = 0
    max_abs: float = math.nan
    max_rel: float = math.nan
    rel_l2: float = math.nan
    pct_outside: float = math.nan
    worst: str = ""                  # "index (got, want)" of the worst element
    # timing: seconds; samples kept raw for compare
    time_median_s: float = math.nan
    time_p20_s: float = math.nan
    time_p80_s: float = math.nan
    n_samples: int = 0
    samples_s: list[float] = field(default_factory=list)
    # roofline
    bytes_moved: float = math.nan
    flops: float = math.nan
    floor_s: float = math.nan
    pct_of_floor_rate: float = math.nan   # 100 * floor_s / time_median_s
    # generation (acceptance, e2e)
    tau: float = math.nan            # tokens committed per verify step, counting the bonus token
    tokens_per_s: float = math.nan
    speedup_vs_ar: float = math.nan
    predicted_speedup: float = math.nan
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    energy_j_per_token: float = math.nan
    lossless: str = ""               # "yes" | "no (prompt 3, position 17)" | ""
    # telemetry during the case
    sm_clock_mhz: float = math.nan
    mem_clock_mhz: float = math.nan
    power_w: float = math.nan
    temp_c: float = math.nan
    throttle: str = ""
    # kind-specific details (histograms, per-depth rates, per-stage times) and how to reproduce the row
    extra: dict[str, Any] = field(default_factory=dict)
    repro: str = ""

    def key(self) -> tuple:
        return tuple(getattr(self, k) for k in KEY_COLUMNS)


COLUMNS = [f.name for f in dataclasses.fields(Record)]


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def record_to_json(rec: Record) -> str:
    return json.dumps(_clean(dataclasses.asdict(rec)), sort_keys=False, default=str)


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and os.replace: readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; results are for reviewers to read
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class RunWriter:
    """Appends records to a run directory as they finish; each append leaves a readable run."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.records: list[Record] = []

    def add(self, rec: Record) -> None:
        self.records.append(rec)
        with open(self.run_dir / "records.jsonl", "a", encoding="utf-8") as fh:
            fh.write(record_to_json(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        atomic_write_text(self.run_dir / "results.csv", to_frame(self.records).to_csv(index=False))

    def write_meta(self, meta: dict[str, Any]) -> None:
        atomic_write_text(self.run_dir / "meta.json", json.dumps(_clean(meta), indent=2, default=str))


def to_frame(records: list[Record]) -> pd.DataFrame:
    rows = [dataclasses.asdict(r) for r in records]
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("samples_s", "extra"):
        df[col] = df[col].map(lambda v: json.dumps(_clean(v)))
    return df


@dataclass(frozen=True)
class LoadedRecords:
    records: list[Record]
    torn_last_line: bool          # the last line was cut mid-write (a killed run): dropped, and said


_HINTS = typing.get_type_hints(Record)
_REQUIRED = ("scenario", "kind", "case", "backend")


def _check_value(name: str, value: Any) -> str:
    """'' when `value` may go into field `name`, else what was expected."""
    tp = _HINTS[name]
    if tp is float:
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif name == "samples_s":
        ok = isinstance(value, list) and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                             for v in value)
    else:   # extra
        ok = isinstance(value, dict)
    return "" if ok else {float: "a number or null", int: "an integer", str: "a string"}.get(
        tp, "a list of numbers" if name == "samples_s" else "a mapping")


def parse_record(line: str) -> Record:
    """One records.jsonl line -> a Record; ValueError saying what was wrong."""
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing key {missing[0]!r}")
    for k, v in data.items():
        why = _check_value(k, v) if k in _HINTS else ""
        if why:
            raise ValueError(f"{k}: got {str(json.dumps(v))[:40]}, expected {why}")
    clean = {k: (math.nan if v is None and _HINTS[k] is float else v) for k, v in data.items() if k in _HINTS}
    if "samples_s" in clean:     # NaN samples were written as null (JSON has no NaN)
        clean["samples_s"] = [math.nan if v is None else v for v in clean["samples_s"]]
    return Record(**_upgrade(clean))


def load_run_records(run_dir: Path) -> LoadedRecords:
    """Every line of records.jsonl as a Record. A line that is not a valid record is a DamagedRun naming the
    file and line, except a torn last line (no trailing newline: the write the process died in). Two records
    with the same key are a DamagedRun too: compare would silently keep one."""
    path = Path(run_dir) / "records.jsonl"
    if not path.exists():
        return LoadedRecords([], False)
    text = _read_text(path)
    lines = text.split("\n")
    torn = False
    out: list[Record] = []
    seen: dict[tuple, int] = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = parse_record(line)
        except (ValueError, TypeError, RecursionError) as exc:
            if i == len(lines):          # no newline after it: cut mid-write
                torn = True
                continue
            raise DamagedRun(f"{path}: line {i} is not a valid record ({str(exc)[:120]}); the run is damaged") from None
        if rec.key() in seen:
            raise DamagedRun(f"{path}: line {i} repeats the key of line {seen[rec.key()]} "
                             f"({', '.join(map(str, rec.key()[:5]))}); the run is damaged")
        seen[rec.key()] = i
        out.append(rec)
    return LoadedRecords(out, torn)


def load_records(run_dir: Path) -> list[Record]:
    """Records of a run, tolerating a torn last line (a run killed mid-write); see load_run_records."""
    return load_run_records(run_dir).records


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedRun(f"{path}: not UTF-8 text (byte {exc.start}); the run is damaged") from None
    except OSError as exc:
        raise DamagedRun(f"{path}: cannot read ({exc.strerror or exc})") from None


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Records written before the policy / phase columns kept an acceptance / e2e / replay row's policy, or a
    topology row's phase, in `family` (acceptance / e2e: or the kind there): move it, so old runs and baselines
    join new ones on the same keys. `family` is only ever a kernel family on those kinds, so a non-empty one
    with an empty target column is an old record (replay and topology rows had a policy key already)."""
    kind, family = data.get("kind"), data.get("family", "")
    target = "policy" if kind in POLICY_KINDS else "phase" if kind == "topology" else ""
    if target and family and not data.get(target):
        data = {**data, target: family if family != kind else "", "family": ""}
    return data


def load_meta(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "meta.json"
    if not path.exists():
        return {}
    try:
        meta = json.loads(_read_text(path))
    except (ValueError, RecursionError) as exc:
        raise DamagedRun(f"{path}: not valid JSON ({str(exc)[:120]}); the run is damaged") from None
    if not isinstance(meta, dict):
        raise DamagedRun(f"{path}: expected a JSON object, got {type(meta).__name__}; the run is damaged")
    return meta
