// tree_verify_mla's grid plans (host code): which units (request, M-tile of 64 rows) run whole or in KV splits or
// pieces, the workspace they need, and the kernels' parameters and grids. Included by csrc/tree_verify_mla.cu only:
// one translation unit, since its two public functions are not inline (tests/tree_verify_mla_plan_check.cu includes
// that file to check the plans on the CPU). plans/0004 ("Split-KV", "Session 8").
#pragma once
#include "common.h"  // env_switch_off
#include "tree_verify_mla.h"
#include "tree_verify_mla_tile.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>  // getenv: KDB_TVM_SPLITS

namespace kdb {
namespace tvm {

inline int row_tiles(const TreeVerifyMlaShape& s) { return row_tiles_of(s.nodes, s.heads); }

// Critical path of a plan in KV-tile steps per SM, every unit taken as `tiles` long (the host knows S only): waves x
// tiles per CTA, plus kSplitOverheadTiles for each wave of partials (Q load, pipeline fill, epilogue, combine).
inline int64_t uniform_cost(int64_t units, int tiles, int n, int num_sms) {
  const int64_t waves = (units * n + num_sms - 1) / num_sms;
  return waves * ((tiles + n - 1) / n + (n > 1 ? kSplitOverheadTiles : 0));
}
inline int64_t tail_cost(int64_t units, int tiles, int pieces, int num_sms) {
  return units / num_sms * tiles + (tiles + pieces - 1) / pieces + kSplitOverheadTiles;
}

inline bool tail_plan_allowed() { return !env_switch_off("KDB_TVM_TAIL"); }

// KDB_TVM_SPLITS=n (1..kMaxSplits) forces n uniform splits (capped at the KV tiles), no tail plan: the A/B knob of
// reports/h200/decode_splits.py, which measures the split cost model on decode shapes. 0 (unset): the cost model.
inline int forced_splits() {
  const char* knob = std::getenv("KDB_TVM_SPLITS");
  const int n = knob != nullptr ? std::atoi(knob) : 0;
  return n >= 1 && n <= kMaxSplits ? n : 0;
}

// Rows of each partial block a plan writes (0: no partials) and how many blocks: B x T x H rows per uniform split,
// or 64 rows per tail unit per tail piece. The launch parameters and the workspace size both come from here.
struct TvmParts {
  size_t rows;
  int blocks;
};
inline TvmParts plan_parts(const TreeVerifyMlaShape& s, const TvmPlan& plan) {
  if (plan.tail_pieces > 0)
    return {(static_cast<size_t>(s.batch) * row_tiles(s) - plan.tail_start) * kBlockM, plan.tail_pieces};
  if (plan.num_splits > 1) return {static_cast<size_t>(s.batch) * s.nodes * s.heads, plan.num_splits};
  return {0, 1};
}

// The kernels' parameters and grids for args (its pointers are only copied here, never read): the attention grid as
// the path's kernel decodes it, and the rows of each split's partial block that the combine merges (0: no combine).
struct TvmLaunch {
  Params p;
  dim3 grid;
  size_t part_rows;
};
inline TvmLaunch plan_launch(const TreeVerifyMlaArgs& a) {
  const TreeVerifyMlaShape& s = a.shape;
  const TvmPlan& plan = a.plan;
  const TvmParts parts = plan_parts(s, plan);
  const bool tail = plan.tail_pieces > 0, split = parts.rows > 0;
  const int tail_rows = tail ? static_cast<int>(parts.rows) : 0;
  const Params p{a.q, a.kv, a.past_lens, a.anc, a.o_lat, a.lse, split ? a.workspace : nullptr,
                 split ? a.workspace + static_cast<size_t>(parts.blocks) * parts.rows * kTvmDimV : nullptr,
                 s.batch, s.nodes, s.heads, s.cache_len, s.words, tail ? 1 : plan.num_splits,
                 static_cast<float>(a.scale * 1.4426950408889634), plan.tail_start, plan.tail_pieces, tail_rows};
  const dim3 grid = tail ? dim3(static_cast<unsigned>(plan.tail_start + static_cast<int64_t>(tail_rows / kBlockM) * plan.tail_pieces))
                         : dim3(row_tiles(s), plan.num_splits, s.batch);
  return {p, grid, parts.rows};
}
}  // namespace tvm

// Uniform: the split count minimizing uniform_cost, as FlashMLA's scheduler charges each split a fixed overhead.
// Tail plan (seesaw only): with W full waves and R < num_sms units left, the R units run in floor(num_sms / R) pieces
// (at most one per KV tile) beside each other in the last wave; taken when tail_cost beats the best uniform split.
// Uses the allocated length S, the only context bound known on the host.
TvmPlan tree_verify_mla_plan(const TreeVerifyMlaShape& s, int num_sms, TvmPath path) {  // not inline: the glue calls it
  using namespace tvm;
  const int64_t units = static_cast<int64_t>(s.batch) * row_tiles(s);
  const int tiles = std::max(1, (s.cache_len + kBlockN - 1) / kBlockN);
  TvmPlan plan;
  if (const int forced = forced_splits()) {
    plan.num_splits = std::min(forced, tiles);
    return plan;
  }
  int64_t best_cost = INT64_MAX;
  for (int n = 1; n <= std::min(kMaxSplits, tiles); ++n) {
    const int64_t cost = uniform_cost(units, tiles, n, num_sms);
    if (cost < best_cost) plan.num_splits = n, best_cost = cost;
  }
  const int64_t full = units / num_sms * num_sms, rest = units - full;
  // The tail plan's grid is one dimension of int CTA indices (blockIdx.x < 2^31).
  if (path != TvmPath::kSeesaw || full == 0 || rest == 0 || units > INT32_MAX / 2 || !tail_plan_allowed()) return plan;
  const int pieces = static_cast<int>(std::min<int64_t>(num_sms / rest, tiles));
  if (pieces >= 2 && tail_cost(units, tiles, pieces, num_sms) < best_cost)
    plan = TvmPlan{1, static_cast<int>(full), pieces};
  return plan;
}

size_t tree_verify_mla_workspace_floats(const TreeVerifyMlaShape& s, const TvmPlan& plan) {
  const tvm::TvmParts parts = tvm::plan_parts(s, plan);
  return static_cast<size_t>(parts.blocks) * parts.rows * (kTvmDimV + 1);  // o (512) and lse per partial row
}

}  // namespace kdb
