"""Builds the pybind11 CPU extensions (kdbench._kdtr, kdbench._cpu_heap); the rest is in pyproject.toml.

The CUDA kernels are not built here: they need a CUDA build of torch and are JIT-built on the GPU
machine by `kdbench build` (suite/backends/cuda_build.py), so a CPU-only install stays CPU-only.
"""
from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "kdbench._kdtr",
            ["csrc/kdtr_ext.cpp"],
            include_dirs=["csrc"],
            cxx_std=17,
        ),
        # The C++ CPU heap (Algorithm 1): the tree_build baseline a serving stack could run on the host.
        Pybind11Extension(
            "kdbench._cpu_heap",
            ["csrc/tree_build_cpu.cpp"],
            include_dirs=["csrc"],
            cxx_std=17,
            extra_compile_args=["-O3"],
        ),
    ]
)
