// placeholder until the KDTR extension lands (replaced in the same session)
#include <pybind11/pybind11.h>
PYBIND11_MODULE(_kdtr, m) {}
