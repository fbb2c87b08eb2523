"""The numpy references must never import torch: import every module of kdbench.references in a fresh
interpreter and check sys.modules."""
import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys
import kdbench.references as refs
names = sorted(m.name for m in pkgutil.iter_modules(refs.__path__))
for name in names:
    importlib.import_module(f"kdbench.references.{name}")
print(",".join(names))
print("torch" in sys.modules)
"""


def test_references_import_no_torch():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names, torch_loaded = proc.stdout.split()
    assert {"tree_build", "tree_accept", "kv_compact"} <= set(names.split(",")), names
    assert torch_loaded == "False", f"torch was imported by one of: {names}"
