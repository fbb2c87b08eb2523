// Message pieces for TORCH_CHECK, formatted to std::string without std::ostream number insertion.
// Why: on the H200 image, an integer streamed by c10::str inside this extension crashed
// (std::basic_ostream::_M_insert<long> instantiated in the .so called a mismatched locale facet:
// SIGSEGV in codecvt::do_unshift, seen with cuda-gdb). Strings stream safely, so every non-literal
// argument of a TORCH_CHECK in csrc/*_torch.cpp goes through kdb::fmt first.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace kdb {

inline std::string fmt(const char* s) { return s; }
inline std::string fmt(const std::string& s) { return s; }
inline std::string fmt(c10::ScalarType t) { return c10::toString(t); }
inline std::string fmt(const c10::Device& d) { return d.str(); }
inline std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline std::string fmt(T v) { return std::to_string(v); }
inline std::string fmt(c10::IntArrayRef dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace kdb
