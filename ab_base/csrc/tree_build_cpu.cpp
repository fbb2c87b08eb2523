// pybind11 module kdbench._cpu_heap: the C++ CPU heap (csrc/tree_build_cpu.h) on numpy arrays. The
// launcher checks dtype, layout and shape (naming the argument), allocates the padded outputs and runs
// the build with the GIL released. Every bad input is a ValueError (std::invalid_argument), never a crash.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "tree_build_cpu.h"

namespace py = pybind11;
namespace ch = kdb::cpu_heap;

namespace {

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

template <class T>
bool is(const py::array& a) {
  return a.dtype().is(py::dtype::of<T>());
}

void check_array(const py::array& a, const char* name, bool dtype_ok, const char* want_dtype, py::ssize_t ndim) {
  if (!dtype_ok)
    throw std::invalid_argument(std::string(name) + " must be " + want_dtype + ", got " +
                                std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(name) + " must be C-contiguous");
  if (a.ndim() != ndim)
    throw std::invalid_argument(std::string(name) + " must have " + std::to_string(ndim) + " dims, got shape " +
                                shape_str(a));
}

template <class T>
py::array_t<T> alloc(std::initializer_list<py::ssize_t> shape) {
  return py::array_t<T>(std::vector<py::ssize_t>(shape));
}

// top_lp [B, L, K] float32|float64 (rows sorted descending, <= 0), top_tok [B, L, K] int64, budgets [B]
// int64 in [0, n_max - 1], roots [B] int64 -> dict of pad_tree_arrays' keys (visibility excepted), each
// with a leading B axis: tokens, parents, depths, ranks, first_child, next_sibling [B, N] int64, scores
// [B, N] float64, bitmask [B, N, W] uint64, n_nodes [B] int64; N = n_max, W = ceil(N / 64).
py::dict build(const py::array& top_lp, const py::array& top_tok, const py::array& budgets,
               const py::array& roots, int64_t n_max, int n_threads) {
  check_array(top_lp, "top_lp", is<float>(top_lp) || is<double>(top_lp), "float32 or float64", 3);
  check_array(top_tok, "top_tok", is<int64_t>(top_tok), "int64", 3);
  check_array(budgets, "budgets", is<int64_t>(budgets), "int64", 1);
  check_array(roots, "roots", is<int64_t>(roots), "int64", 1);
  const py::ssize_t B = top_lp.shape(0), L = top_lp.shape(1), K = top_lp.shape(2);
  if (top_tok.shape(0) != B || top_tok.shape(1) != L || top_tok.shape(2) != K)
    throw std::invalid_argument("top_tok shape " + shape_str(top_tok) + " != top_lp shape " + shape_str(top_lp));
  if (budgets.shape(0) != B || roots.shape(0) != B)
    throw std::invalid_argument("budgets " + shape_str(budgets) + " and roots " + shape_str(roots) +
                                " must both have B = " + std::to_string(B) + " entries");
  if (n_max < 1 || n_max > ch::kMaxNodes)  // before allocating [B, n_max, W] outputs
    throw std::invalid_argument("n_max must be in [1, " + std::to_string(ch::kMaxNodes) + "], got " +
                                std::to_string(n_max));
  const ch::Dims d{B, L, K, n_max};
  const py::ssize_t N = n_max, W = d.words();
  auto tokens = alloc<int64_t>({B, N}), parents = alloc<int64_t>({B, N}), depths = alloc<int64_t>({B, N});
  auto ranks = alloc<int64_t>({B, N}), first = alloc<int64_t>({B, N}), next = alloc<int64_t>({B, N});
  auto scores = alloc<double>({B, N});
  auto bitmask = alloc<uint64_t>({B, N, W});
  auto n_nodes = alloc<int64_t>({B});
  const ch::Out o{tokens.mutable_data(), parents.mutable_data(), depths.mutable_data(), ranks.mutable_data(),
                  scores.mutable_data(),  first.mutable_data(),   next.mutable_data(),   bitmask.mutable_data(),
                  n_nodes.mutable_data()};
  const auto* tok = static_cast<const int64_t*>(top_tok.data());
  const auto* bud = static_cast<const int64_t*>(budgets.data());
  const auto* root = static_cast<const int64_t*>(roots.data());
  const void* lp = top_lp.data();
  const bool f32 = is<float>(top_lp);  // every Python object is touched before the GIL goes
  {
    py::gil_scoped_release nogil;  // the inputs stay alive: the caller holds them for this call
    if (f32) {
      ch::build_batch(static_cast<const float*>(lp), tok, bud, root, d, o, n_threads);
    } else {
      ch::build_batch(static_cast<const double*>(lp), tok, bud, root, d, o, n_threads);
    }
  }
  py::dict out;
  out["tokens"] = tokens, out["parents"] = parents, out["depths"] = depths, out["ranks"] = ranks;
  out["scores"] = scores, out["first_child"] = first, out["next_sibling"] = next, out["bitmask"] = bitmask;
  out["n_nodes"] = n_nodes;
  return out;
}

}  // namespace

PYBIND11_MODULE(_cpu_heap, m) {
  m.def("build", &build, py::arg("top_lp"), py::arg("top_tok"), py::arg("budgets"), py::arg("roots"),
        py::arg("n_max"), py::arg("n_threads") = 1, "Algorithm 1 per request -> padded tree arrays (dict)");
}
