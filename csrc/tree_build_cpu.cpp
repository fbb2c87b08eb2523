// placeholder: the C++ CPU heap lands in the same session (kdbench._cpu_heap)
#include <pybind11/pybind11.h>
PYBIND11_MODULE(_cpu_heap, m) {}
