"""User-facing errors: the CLI prints them in one line and exits 2, with no traceback; `clip` keeps stored reasons
to whole words."""
from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input (a scenario file, a CLI argument, a path): exit code 2."""

    def __init__(self, message: str):
        # one line whatever the input held (a newline in a name would split what tools read)
        super().__init__(" ".join(str(message).split("\n")))


class ScenarioError(UserError):
    """A scenario file failed validation: names the file, the key path, the bad value, what was expected."""

    def __init__(self, file: str, path: str, message: str):
        self.file, self.path, self.message = file, path, message
        where = f"{file}: {path}" if path else file
        super().__init__(f"{where}: {message}")


class DamagedRun(UserError):
    """A run directory whose records.jsonl or meta.json cannot be read as kdbench wrote it: exit code 2."""


def clip(text: str, limit: int = 500) -> str:
    """A reason stored on a record, at most `limit` characters and cut between words ('…' marks the cut):
    a report must never show half a word."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    cut = head.rfind(" ")
    return (head[:cut] if cut > limit // 2 else head).rstrip(" ,;:") + "…"
