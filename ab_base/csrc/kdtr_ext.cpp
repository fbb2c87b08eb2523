// pybind11 module kdbench._kdtr: the C++ KDTR reader/writer (csrc/kdtr.h) seen from Python, so the
// tests can cross-check it against suite/kdtr.py. kdtr::Error surfaces as kdbench._kdtr.KdtrError,
// a subclass of kdbench.kdtr.KdtrError (itself a ValueError).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string_view>
#include <tuple>

#include "kdtr.h"

namespace py = pybind11;
namespace kt = kdb::kdtr;

namespace {

// name -> (dtype name, shape tuple, raw little-endian bytes), in file order.
py::dict read_py(const std::string& path) {
  kt::File f;
  {
    py::gil_scoped_release nogil;
    f = kt::read_file(path);
  }
  py::dict out;
  for (const kt::Entry& e : f.entries) {
    py::bytes data(reinterpret_cast<const char*>(f.data(e)), static_cast<py::ssize_t>(e.nbytes));
    out[py::str(e.name)] =
        py::make_tuple(kt::dtype_info(e.dtype)->name, py::tuple(py::cast(e.shape)), data);
  }
  return out;
}

// items: [(name, dtype name, shape, raw little-endian C-order bytes)], written in list order.
using Item = std::tuple<std::string, std::string, std::vector<uint64_t>, py::bytes>;
void write_py(const std::string& path, const std::vector<Item>& items) {
  std::vector<kt::TensorView> views;
  for (const auto& [name, dtype, shape, data] : items) {
    const std::string_view raw = data;
    const uint8_t code = kt::dtype_code(dtype, path + ": tensor '" + name + "'");
    views.push_back({name, code, shape, raw.data(), raw.size()});
  }
  py::gil_scoped_release nogil;  // views point into `items`, which the caller keeps alive
  kt::write_file(path, views);
}

// Reads `src` and writes its tensors to `dst`, all in C++ (no Python object in between).
void roundtrip_py(const std::string& src, const std::string& dst) {
  py::gil_scoped_release nogil;
  const kt::File f = kt::read_file(src);
  std::vector<kt::TensorView> views;
  for (const kt::Entry& e : f.entries)
    views.push_back({e.name, e.dtype, e.shape, f.data(e), e.nbytes});
  kt::write_file(dst, views);
}

uint32_t crc32_py(const py::bytes& data, uint32_t crc) {
  const std::string_view raw = data;
  return kt::crc32(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), crc);
}

}  // namespace

PYBIND11_MODULE(_kdtr, m) {
  py::object base = py::module_::import("kdbench.kdtr").attr("KdtrError");
  py::register_exception<kt::Error>(m, "KdtrError", base);
  m.def("read", &read_py, py::arg("path"), "read a KDTR file: {name: (dtype, shape, bytes)}");
  m.def("write", &write_py, py::arg("path"), py::arg("items"), "write [(name, dtype, shape, bytes)]");
  m.def("roundtrip", &roundtrip_py, py::arg("src"), py::arg("dst"), "read src, rewrite it as dst");
  m.def("crc32", &crc32_py, py::arg("data"), py::arg("crc") = 0, "KDTR's CRC-32 (zlib's)");
}
