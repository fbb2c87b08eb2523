"""Run directories: a portable slug for the default name, atomic creation, and an exclusive lock held for
the whole run, so two processes can never write one directory (plans/0013-reliability.md)."""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import re
import unicodedata
from pathlib import Path

from kdbench.errors import UserError

LOCK_NAME = ".kdbench.lock"
SLUG_MAX = 48          # characters of scenario names in a default directory name (NAME_MAX is 255 bytes)
RUN_FILES = ("meta.json", "records.jsonl", "results.csv")


def slug(name: str, limit: int = SLUG_MAX) -> str:
    """A file-name-safe rendering of a scenario name: ASCII letters, digits, '.', '_', '-' only, no leading
    dot, at most `limit` characters, never empty. The real name stays in the records and meta.json."""
    text = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")
    return re.sub(r"-{2,}", "-", text)[:limit].rstrip(".-") or "scenario"


def default_path(names: list[str], root: str = "runs") -> Path:
    """runs/<time>-<slugs>-<pid>: the PID separates processes started in the same second."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    joined = slug("+".join(slug(n) for n in names).replace("+", "_"))
    return Path(root) / f"{stamp}-{joined}-p{os.getpid()}"


class RunLock:
    """An exclusive flock on <run_dir>/.kdbench.lock, held until the process exits or release()."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"--out {run_dir}: another kdbench run (pid {holder}) is writing there") from None
            raise
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _make(out_dir: str | None, names: list[str]) -> Path:
    """mkdir the run directory: `--out` may name an existing empty directory; a default name never is
    reused (a second run in the same process and second gets -2, -3, ...)."""
    if out_dir is not None:
        path = Path(out_dir)
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {path}: exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        return path
    first = default_path(names)
    first.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = first if n == 1 else first.with_name(f"{first.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"{first}: 999 run directories of this name already exist")


def create(out_dir: str | None, names: list[str]) -> tuple[Path, RunLock]:
    """Make (or take an empty) run directory and lock it before anything is written into it."""
    where = f"--out {out_dir}" if out_dir is not None else "runs/ (the default run directory root)"
    try:
        path = _make(out_dir, names)
        lock = RunLock(path)
    except OSError as exc:
        raise UserError(f"{where}: cannot write there ({exc.strerror or exc})") from None
    held = [f for f in RUN_FILES if (path / f).exists()]
    if held:
        lock.release()
        raise UserError(f"--out {path}: already holds a run ({held[0]}); choose another directory or delete it "
                        "first")
    return path, lock
