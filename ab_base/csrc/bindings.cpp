// pybind11 module kdbench_cuda: m.def lines only; checks live in csrc/<family>_torch.cpp.
#include "torch_ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tree_build", &kdb::tree_build, "DDTree build on the GPU (Algorithm 1 per request)");
  m.def("tree_build_topk", &kdb::tree_build_topk, "fused top-K + logsumexp vocabulary pass",
        pybind11::arg("draft_logits"), pybind11::arg("k"), pybind11::arg("splits") = 0);
  m.def("tree_verify_mla", &kdb::tree_verify_mla, "absorbed MLA attention under the ancestor mask",
        pybind11::arg("q"), pybind11::arg("kv"), pybind11::arg("past_lens"), pybind11::arg("anc"),
        pybind11::arg("scale"), pybind11::arg("impl") = "auto");
  m.def("tree_verify_mla_plan",
        static_cast<std::vector<int64_t> (*)(int64_t, int64_t, int64_t, int64_t, const std::string&)>(
            &kdb::tree_verify_mla_plan),  // the torch op, not the raw launcher's overload of csrc/tree_verify_mla.h
        "tree_verify_mla's grid plan on the current device",
        pybind11::arg("batch"), pybind11::arg("nodes"), pybind11::arg("heads"), pybind11::arg("cache_len"),
        pybind11::arg("impl") = "auto");
  m.def("tree_accept_greedy", &kdb::tree_accept_greedy, "greedy tree acceptance, whole batch");
  m.def("tree_accept_sampled", &kdb::tree_accept_sampled, "sampled tree acceptance (inverse CDF)");
  m.def("kv_compact", &kdb::kv_compact, "move accepted tree rows to committed positions, in place");
}
