"""Diagnose the TORCH_CHECK segfault: a minimal inline extension vs kdbench_cuda, same process."""
import sys, torch
from torch.utils.cpp_extension import load_inline
src = r'''
#include <torch/extension.h>
void f(const at::Tensor& x) { TORCH_CHECK(x.scalar_type() == at::kInt, "x must be int32, got ", x.scalar_type()); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
'''
flags = sys.argv[1:] 
m = load_inline("chk_" + str(abs(hash(tuple(flags))) % 10**6), cpp_sources=[src], extra_cflags=flags, verbose=False)
try:
    m.f(torch.zeros(2))
except RuntimeError as e:
    print("minimal extension", flags, "-> RuntimeError ok:", str(e)[:50], flush=True)
import pybind11, torch.utils.cpp_extension as ce
print("pybind11 pip", pybind11.__version__, "torch include has pybind11:",
      any(__import__('os').path.isdir(p + '/pybind11') for p in ce.include_paths()), flush=True)
