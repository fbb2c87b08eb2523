"""Builds the kdbench_cuda extension from csrc/ with torch's JIT loader. SOURCES and the flags here are the
only source list and flag set. CI (.ci/run) compiles every csrc/*.cu with CUDA_FLAGS and its own arch list
(sm_90a, plus sm_120 where nvcc knows it); compile_only() (`python -m kdbench.backends.cuda_build`) is the
same compile-only pass for one capability, run by hand. unavailable_reason() says why the extension cannot
be used on this machine (None when it can)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc"
FAMILIES = ("tree_build", "tree_verify_mla", "tree_accept", "kv_compact")
# bindings.cpp (m.def lines), then each family's torch layer (checks, allocation) and its kernels.
SOURCES = ("bindings.cpp", *(f"{f}_torch.cpp" for f in FAMILIES), *(f"{f}.cu" for f in FAMILIES))
# C++20: torch >= 2.11 headers are C++20, and a -std=c++17 override broke c10::Error (TORCH_CHECK segfaulted)
CXX_FLAGS = ("-O3", "-std=c++20")
CUDA_FLAGS = ("-O3", "-std=c++20", "-lineinfo")
EXTENSION_NAME = "kdbench_cuda"
_MAX_ERROR_CHARS = 4000

_state: dict[str, object] = {}  # "module" after a successful build, "error" after a failed one


class ExtensionUnavailable(RuntimeError):
    """The CUDA extension cannot be built or used here; the message says why."""


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """nvcc -gencode flags for a device's compute capability: sm_90a on Hopper (wgmma, setmaxnreg),
    sm_120 on RTX PRO 6000 Blackwell, plain sm_XY otherwise."""
    major, minor = capability
    if (major, minor) == (9, 0):
        return ["-gencode=arch=compute_90a,code=sm_90a"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def source_paths() -> list[Path]:
    return [CSRC / name for name in SOURCES]


def nvcc_path() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME  # noqa: PLC0415  (torch import is slow; only on use)
    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def build_directory(capability: tuple[int, int]) -> Path:
    """~/.cache/kdbench/<hash of sources, headers, flags, torch version, capability>: a new build whenever
    any of them changes, and a warm reuse otherwise."""
    import torch  # noqa: PLC0415
    h = hashlib.sha256()
    for path in sorted([*source_paths(), *CSRC.glob("*.h")]):
        h.update(path.name.encode())
        h.update(path.read_bytes() if path.exists() else b"<missing>")
    h.update(repr((CXX_FLAGS, CUDA_FLAGS, arch_flags(capability), torch.__version__)).encode())
    return Path.home() / ".cache" / "kdbench" / h.hexdigest()[:16]


def _environment_reason() -> str | None:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch has no CUDA build (torch {torch.__version__})"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if nvcc_path() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    missing = [p.name for p in source_paths() if not p.exists()]
    if missing:
        return f"missing sources in {CSRC}: {', '.join(missing)}"
    return None


def _build(verbose: bool):
    import torch  # noqa: PLC0415
    from torch.utils import cpp_extension  # noqa: PLC0415
    capability = torch.cuda.get_device_capability()
    build_dir = build_directory(capability)
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=EXTENSION_NAME, sources=[str(p) for p in source_paths()], extra_include_paths=[str(CSRC)],
        extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=[*CUDA_FLAGS, *arch_flags(capability)],
        build_directory=str(build_dir), verbose=verbose)


def load(verbose: bool = False):
    """The built extension module (built once per process, cached on disk by content hash).
    Raises ExtensionUnavailable with the reason when it cannot be built or used."""
    if "module" in _state:
        return _state["module"]
    reason = _environment_reason() or _state.get("error")
    if reason:
        raise ExtensionUnavailable(str(reason))
    try:
        module = _build(verbose)
    except Exception as exc:  # a compiler error: keep its text (the tail, where the error is) as the reason
        _state["error"] = f"build failed: {str(exc)[-_MAX_ERROR_CHARS:]}"
        raise ExtensionUnavailable(_state["error"]) from exc
    _state["module"] = module
    return module


def unavailable_reason() -> str | None:
    """None when the extension is usable; otherwise why not ("torch has no CUDA build", "no CUDA device",
    "nvcc not found ...", "build failed: <compiler output>")."""
    try:
        load()
    except ExtensionUnavailable as exc:
        return str(exc)
    return None


def nvcc_compile_command(cu_file: Path, out: Path, capability: tuple[int, int] = (9, 0)) -> list[str]:
    """The compile-only command for one kernel file (no torch headers needed), with the ptxas report."""
    nvcc = nvcc_path() or "nvcc"
    return [nvcc, *CUDA_FLAGS, *arch_flags(capability), "-Xptxas", "-v", "-c", str(cu_file), "-o", str(out)]


def build_host_program(source: str, out_dir: Path, name: str) -> Path:
    """Compile `source` (a C++ main that #includes csrc/*.cu files, whose __host__ __device__ code then runs on the
    host: the tests' harnesses) with nvcc into out_dir/name; returns the executable, or raises RuntimeError with
    the compiler's output."""
    src, exe = out_dir / f"{name}.cu", out_dir / name
    src.write_text(source)
    cmd = [nvcc_path() or "nvcc", *CUDA_FLAGS, *arch_flags((9, 0)), f"-I{CSRC}", str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{res.stdout}{res.stderr}")
    return exe


def compile_only(out_dir: Path, capability: tuple[int, int] = (9, 0)) -> int:
    """Compile every family .cu standalone (the kernels only: no torch glue, no bindings) for one capability;
    prints ptxas reports; returns the number of failures. CI runs the same nvcc pass from .ci/run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    for name in (s for s in SOURCES if s.endswith(".cu")):
        cmd = nvcc_compile_command(CSRC / name, out_dir / f"{name}.o", capability)
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        print(f"== {name}: {'ok' if res.returncode == 0 else 'FAILED'}\n{res.stdout}{res.stderr}")
        failures += res.returncode != 0
    return failures


if __name__ == "__main__":
    sys.exit(1 if compile_only(Path(os.environ.get("KDB_COMPILE_OUT", "build/nvcc"))) else 0)
