"""The trained pair's corpus, without downloads: CPython 3.11.7 stdlib sources (code), the Python reference
topics in pydoc_data (prose) and matplotlib's data files (structured text), fixed by a shipped manifest
(file list + sha256). Built once into one compressed file; every load re-checks the sha256s (plans/0007).
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import lzma
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kdbench.errors import UserError

DATA = Path(__file__).parent / "data"
MANIFEST = DATA / "corpus_manifest.json"
PYTHON = "3.11.7"      # the interpreter whose stdlib the manifest pins (the GPU machine's 3.12 differs)
CATEGORIES = ("code", "prose", "structured")
HELDOUT = {"code": 0.05, "prose": 0.2, "structured": 0.2}   # fraction of documents held out (by path hash)
MAX_FILE = 200_000     # bytes: generated tables and giant modules would dominate the corpus
_SKIP_DIRS = ("test", "tests", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip",
              "pydoc_data", "__pycache__", "config-3.11-x86_64-linux-gnu")
_STRUCTURED = ("*.csv", "*.mplstyle", "*.afm", "matplotlibrc", "*.json")


@dataclass(frozen=True)
class Document:
    id: str          # root:relative/path[#topic]
    category: str    # code | prose | structured
    split: str       # train | heldout
    text: str


def roots() -> dict[str, Path]:
    """Where each manifest root lives on this machine."""
    spec = importlib.util.find_spec("matplotlib")
    out = {"stdlib": Path(sysconfig.get_paths()["stdlib"])}
    if spec and spec.origin:
        out["matplotlib"] = Path(spec.origin).parent / "mpl-data"
    return out


def _split(doc_id: str, category: str) -> str:
    h = int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16) / 16 ** 8
    return "heldout" if h < HELDOUT[category] else "train"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scan() -> list[dict]:
    """The file list a manifest is made from (this machine's interpreter must be CPython 3.11.7)."""
    import platform
    if platform.python_version() != PYTHON:
        raise UserError(f"corpus manifest: needs CPython {PYTHON} to scan, this is {platform.python_version()}")
    r = roots()
    files = []
    for p in sorted(r["stdlib"].rglob("*.py")):
        rel = p.relative_to(r["stdlib"])
        if any(part in _SKIP_DIRS for part in rel.parts[:-1]) or p.stat().st_size > MAX_FILE:
            continue
        files.append(("stdlib", rel, "code"))
    files.append(("stdlib", Path("pydoc_data/topics.py"), "prose"))
    if "matplotlib" in r:
        for pat in _STRUCTURED:
            for p in sorted(r["matplotlib"].rglob(pat)):
                if p.stat().st_size <= MAX_FILE:
                    files.append(("matplotlib", p.relative_to(r["matplotlib"]), "structured"))
    out = []
    for root, rel, cat in files:
        data = (r[root] / rel).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue   # the corpus is text: a file that is not UTF-8 is left out
        out.append({"root": root, "path": str(rel), "category": cat, "sha256": _sha(data), "bytes": len(data)})
    return out


def write_manifest(path: Path = MANIFEST) -> dict:
    import matplotlib
    man = {"python": PYTHON, "matplotlib": matplotlib.__version__, "heldout": HELDOUT, "files": scan()}
    path.write_text(json.dumps(man, indent=0) + "\n")
    return man


def load_manifest(path: Path = MANIFEST) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read the corpus manifest ({exc})") from None


def documents_of(entry: dict, data: bytes) -> list[Document]:
    """One file -> its documents: a source file is one; pydoc topics split into one per topic."""
    text = data.decode("utf-8")
    base = f"{entry['root']}:{entry['path']}"
    if entry["category"] == "prose":
        topics = ast.literal_eval(text.split("topics = ", 1)[1])   # {name: reference text}
        return [Document(f"{base}#{k}", "prose", _split(f"{base}#{k}", "prose"), v) for k, v in sorted(topics.items())]
    return [Document(base, entry["category"], _split(base, entry["category"]), text)]


def build(out: Path, manifest: Path = MANIFEST) -> Path:
    """Read every manifest file from this machine, check its sha256, write out (one JSON line per file, xz)."""
    man, r = load_manifest(manifest), roots()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt", encoding="utf-8", preset=6) as f:
        for e in man["files"]:
            if e["root"] not in r:
                raise UserError(f"{manifest}: root {e['root']!r} is not installed on this machine")
            p = r[e["root"]] / e["path"]
            data = p.read_bytes() if p.exists() else b""
            if _sha(data) != e["sha256"]:
                raise UserError(f"{p}: sha256 differs from {manifest} (expected {e['sha256'][:12]}..., "
                                f"{'changed' if p.exists() else 'missing'}); build the corpus with CPython {PYTHON}")
            f.write(json.dumps({"root": e["root"], "path": e["path"], "text": data.decode("utf-8")}) + "\n")
    return out


def load(path: Path, manifest: Path = MANIFEST) -> list[Document]:
    """The built corpus as documents, after checking every file's sha256 (and the file list) against the manifest."""
    man = load_manifest(manifest)
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            rows = {(row["root"], row["path"]): row["text"] for row in map(json.loads, f)}
    except (OSError, lzma.LZMAError, json.JSONDecodeError, KeyError) as exc:
        raise UserError(f"{path}: cannot read the built corpus ({exc}); rebuild it with `kdbench corpus`") from None
    if len(rows) != len(man["files"]):
        raise UserError(f"{path}: {len(rows)} files in the corpus, the manifest {manifest} lists {len(man['files'])}")
    docs = []
    for e in man["files"]:
        text = rows.get((e["root"], e["path"]))
        if text is None or _sha(text.encode("utf-8")) != e["sha256"]:
            why = "is missing" if text is None else "does not match its manifest sha256"
            raise UserError(f"{path}: file {e['root']}:{e['path']} {why}")
        docs.extend(documents_of(e, text.encode("utf-8")))
    return docs
