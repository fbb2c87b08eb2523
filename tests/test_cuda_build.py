"""CPU-side tests of the CUDA build path: the one source list, arch flags, the unavailable reason, clear
errors from the cuda_ext wrappers, and (when nvcc exists) that a kernel file compiles with these flags."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from kdbench.backends import cuda_build, cuda_ext


def test_sources_are_every_kernel_and_torch_layer_file():
    on_disk = {p.name for p in cuda_build.CSRC.glob("*.cu")} | {p.name for p in cuda_build.CSRC.glob("*_torch.cpp")}
    assert set(cuda_build.SOURCES) == on_disk | {"bindings.cpp"}
    assert len(cuda_build.SOURCES) == len(set(cuda_build.SOURCES))
    assert all(p.exists() for p in cuda_build.source_paths())


def test_every_family_has_kernel_and_torch_layer():
    for family in cuda_build.FAMILIES:
        assert f"{family}.cu" in cuda_build.SOURCES and f"{family}_torch.cpp" in cuda_build.SOURCES


@pytest.mark.parametrize("capability, want", [
    ((9, 0), ["-gencode=arch=compute_90a,code=sm_90a"]),
    ((12, 0), ["-gencode=arch=compute_120,code=sm_120"]),
    ((8, 9), ["-gencode=arch=compute_89,code=sm_89"]),
    ((10, 0), ["-gencode=arch=compute_100,code=sm_100"]),
])
def test_arch_flags(capability, want):
    assert cuda_build.arch_flags(capability) == want


def test_cuda_flags():
    assert {"-O3", "-std=c++20", "-lineinfo"} <= set(cuda_build.CUDA_FLAGS)
    assert "--use_fast_math" not in cuda_build.CUDA_FLAGS  # kernels pick their fast intrinsics explicitly


def test_build_directory_is_content_addressed():
    a, b = cuda_build.build_directory((9, 0)), cuda_build.build_directory((12, 0))
    assert a.parent == b.parent and a.parent.name == "kdbench" and a != b
    assert cuda_build.build_directory((9, 0)) == a


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer; this machine has a GPU")
def test_unavailable_reason_on_cpu():
    reason = cuda_build.unavailable_reason()
    assert isinstance(reason, str) and reason
    if torch.version.cuda is None:
        assert reason.startswith("torch has no CUDA build")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer; this machine has a GPU")
def test_wrappers_raise_a_clear_error_on_cpu():
    reason = cuda_build.unavailable_reason()
    calls = [
        lambda: cuda_ext.tree_build(torch.zeros(1, 2, 8), torch.ones(1, dtype=torch.int32),
                                    torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32), 4),
        lambda: cuda_ext.tree_build_topk(torch.zeros(1, 2, 8), 2),
        lambda: cuda_ext.tree_accept_greedy(*[torch.zeros(1, 3, dtype=torch.int64)] * 4, torch.zeros(1, 3), 2),
        lambda: cuda_ext.kv_compact(torch.zeros(1, 1, 4, 4), *[torch.zeros(1, dtype=torch.int32)] * 3),
    ]
    for call in calls:
        with pytest.raises(cuda_ext.ExtensionUnavailable, match="no CUDA|no CUDA device|nvcc") as info:
            call()
        assert str(info.value) == reason
        assert isinstance(info.value, RuntimeError)


def test_compile_command_has_the_arch_and_ptxas_report(tmp_path):
    cmd = cuda_build.nvcc_compile_command(cuda_build.CSRC / "kv_compact.cu", tmp_path / "k.o")
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "-c" in cmd and cmd[-1].endswith("k.o")
    assert cmd[cmd.index("-Xptxas") + 1] == "-v"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_file_compiles_standalone(tmp_path):
    cmd = cuda_build.nvcc_compile_command(cuda_build.CSRC / "kv_compact.cu", tmp_path / "k.o")
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores" in res.stdout + res.stderr
