"""Signals and time limits: SIGINT, SIGTERM and SIGHUP all stop a run the same way (an Interrupted
exception, so the runner keeps finished records, marks the run interrupted and renders the report), and a
SIGALRM watchdog stops a case that runs past its wall-clock limit (plans/0013-reliability.md)."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_state = {"finishing": False}


class Interrupted(KeyboardInterrupt):
    """A stop signal; `signum` says which (exit code 128 + signum, as shells report it)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class CaseTimeout(BaseException):
    """Raised into a case past its limit. A BaseException, so a kind's `except Exception` cannot swallow it."""

    def __init__(self, seconds: float):
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds


def _on_signal(signum, frame):
    if _state["finishing"]:    # already stopping: writing meta.json and the report takes a moment
        print(f"\n{signal.Signals(signum).name}: still saving the run; it stops on its own in a moment",
              file=sys.stderr, flush=True)
        return
    raise Interrupted(signum)


def install() -> dict:
    """Route every stop signal through Interrupted (main thread only; a no-op elsewhere). Returns the
    previous handlers for restore()."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}


def restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def finishing():
    """While the run is being saved, further stop signals print a line instead of raising."""
    before = _state["finishing"]
    _state["finishing"] = True
    try:
        yield
    finally:
        _state["finishing"] = before


RETRY_S = 0.25   # seconds between repeated alarms once a case is past its limit


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise CaseTimeout in the main thread after `seconds` of wall-clock time. Python code is stopped at its
    next bytecode; a single C call (one torch op) is stopped when it returns."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    active = [True]

    def _expired(signum, frame):
        if active[0]:
            raise CaseTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, _expired)
    # The alarm re-fires every RETRY_S after the first: a CaseTimeout raised inside a weakref / __del__
    # callback is swallowed by the interpreter ("Exception ignored in ..."), and the case would run on.
    signal.setitimer(signal.ITIMER_REAL, seconds, RETRY_S)
    try:
        yield
    finally:
        active[0] = False              # an alarm landing from here on raises nothing
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
