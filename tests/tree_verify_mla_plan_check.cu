// Host-only check of tree_verify_mla's grid plans (csrc/tree_verify_mla.cu, plans/0004 "Session 8"), run by
// tests/test_tree_verify_mla_plan.py on machines without a GPU: for many shapes and SM counts, the plan's invariants,
// the seesaw tail plan's CTA decode (ss_tail_unit) covering every unit once whole or once per piece, the partial rows
// each piece writes, the combine's reading of them (combine_out_row) and the workspace size; and the seesaw's final O
// tile layout (stmatrix fragments against the TMA store's swizzled boxes). Prints one line per failure (at most 20)
// and the count of shapes; exit status 1 on any failure. No CUDA API call is made.
#include "../csrc/tree_verify_mla.cu"
#include "../reports/h200/bench_env.h"  // with_env: a knob set for one check, then restored

#include <cstdio>
#include <random>
#include <set>
#include <vector>

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                             \
  do {                                                                \
    if (!(cond)) {                                                    \
      if (++failures <= 20) std::printf("FAIL %s: ", #cond), std::printf(__VA_ARGS__), std::printf("\n"); \
      return;                                                         \
    }                                                                 \
  } while (0)

// The tail plan's grid: every CTA's unit and piece, every piece's partial rows and the combine's view of them.
void check_tail(const kdb::TreeVerifyMlaShape& s, const kdb::TvmPlan& plan, const kdb::tvm::TvmLaunch& l, int sms) {
  const int rows = s.nodes * s.heads, rt = kdb::tvm::row_tiles(s);
  const int64_t units = int64_t(s.batch) * rt, tail_units = units - plan.tail_start;
  EXPECT(plan.tail_start % sms == 0 && plan.tail_start >= sms && tail_units > 0 && tail_units < sms,
         "B %d T %d H %d: tail_start %d of %lld units on %d SMs", s.batch, s.nodes, s.heads, plan.tail_start,
         (long long)units, sms);
  EXPECT(plan.tail_pieces >= 2 && tail_units * plan.tail_pieces <= sms, "pieces %d x %lld tail units on %d SMs",
         plan.tail_pieces, (long long)tail_units, sms);
  EXPECT(int64_t(l.grid.x) == plan.tail_start + tail_units * plan.tail_pieces && l.grid.y == 1 && l.grid.z == 1,
         "grid %u x %u x %u", l.grid.x, l.grid.y, l.grid.z);
  EXPECT(l.part_rows == size_t(tail_units) * 64 && l.p.tail_rows == int(l.part_rows), "part rows %zu", l.part_rows);
  EXPECT(kdb::tree_verify_mla_workspace_floats(s, plan) == size_t(plan.tail_pieces) * l.part_rows * 513,
         "workspace %zu floats", kdb::tree_verify_mla_workspace_floats(s, plan));
  std::vector<int> seen(units, 0);
  std::vector<int64_t> out_of_part(size_t(plan.tail_pieces) * l.part_rows, -2);  // output row of each partial row
  for (int c = 0; c < int(l.grid.x); ++c) {
    const kdb::tvm::SsUnit u = kdb::tvm::ss_tail_unit(l.p, c);
    const int64_t unit = int64_t(u.b) * rt + u.m0 / 64;
    EXPECT(u.b >= 0 && u.b < s.batch && u.m0 % 64 == 0 && u.m0 < rows, "CTA %d: b %d m0 %d", c, u.b, u.m0);
    const bool whole = unit < plan.tail_start;
    EXPECT(whole == (u.part_base < 0) && u.splits == (whole ? 1 : plan.tail_pieces) && u.split == (whole ? 0 : seen[unit]),
           "CTA %d: unit %lld split %d of %d, part_base %lld", c, (long long)unit, u.split, u.splits, (long long)u.part_base);
    ++seen[unit];
    for (int r = 0; !whole && r < 64 && u.m0 + r < rows; ++r) {
      const int64_t prow = u.part_base + r;
      EXPECT(prow >= 0 && prow < int64_t(out_of_part.size()) && out_of_part[prow] == -2, "CTA %d row %d: prow %lld", c, r,
             (long long)prow);
      out_of_part[prow] = int64_t(u.b) * rows + u.m0 + r;
    }
  }
  for (int64_t unit = 0; unit < units; ++unit)
    EXPECT(seen[unit] == (unit < plan.tail_start ? 1 : plan.tail_pieces), "unit %lld run %d times", (long long)unit, seen[unit]);
  std::set<int64_t> merged;
  for (size_t r = 0; r < l.part_rows + 64; ++r) {  // past the block too: those must be skipped
    const int row = kdb::tvm::combine_out_row(l.p, int(r));
    for (int piece = 0; piece < plan.tail_pieces && r < l.part_rows; ++piece) {
      const int64_t want = out_of_part[size_t(piece) * l.part_rows + r];
      EXPECT(row == (want == -2 ? -1 : want), "combine row %zu piece %d: reads output row %d, piece wrote %lld", r, piece,
             row, (long long)want);
    }
    EXPECT(r < l.part_rows || row == -1, "combine row %zu past the block gives %d", r, row);
    if (row >= 0) EXPECT(merged.insert(row).second, "output row %d merged twice", row);
  }
}

void check_shape(int b, int t, int h, int s_len, int sms) {
  const kdb::TreeVerifyMlaShape s{b, t, h, s_len, (t + 63) / 64};
  for (kdb::TvmPath path : {kdb::TvmPath::kSeesaw, kdb::TvmPath::kPingPong}) {
    const kdb::TvmPlan plan = kdb::tree_verify_mla_plan(s, sms, path);
    EXPECT(plan.num_splits >= 1 && plan.num_splits <= 64, "B %d T %d H %d S %d: %d splits", b, t, h, s_len, plan.num_splits);
    EXPECT(path == kdb::TvmPath::kSeesaw || plan.tail_pieces == 0, "a tail plan for a path that cannot decode it");
    EXPECT(plan.tail_pieces == 0 || plan.num_splits == 1, "tail plan with %d uniform splits", plan.num_splits);
    kdb::TreeVerifyMlaArgs a{};
    a.shape = s, a.plan = plan, a.path = path, a.scale = 0.13;
    a.workspace = reinterpret_cast<float*>(uintptr_t{1} << 40);  // never dereferenced: the partial blocks' offsets only
    const kdb::tvm::TvmLaunch l = kdb::tvm::plan_launch(a);
    if (plan.tail_pieces > 0) {
      check_tail(s, plan, l, sms);
      continue;
    }
    const size_t rows_total = size_t(b) * t * h;
    EXPECT(int(l.grid.x) == kdb::tvm::row_tiles(s) && int(l.grid.y) == plan.num_splits && int(l.grid.z) == b,
           "uniform grid %u x %u x %u", l.grid.x, l.grid.y, l.grid.z);
    EXPECT(l.part_rows == (plan.num_splits > 1 ? rows_total : 0), "uniform part rows %zu", l.part_rows);
    EXPECT(kdb::tree_verify_mla_workspace_floats(s, plan) == (plan.num_splits > 1 ? plan.num_splits * rows_total * 513 : 0),
           "uniform workspace");
    if (plan.num_splits > 1)
      for (size_t r : {size_t(0), rows_total - 1, rows_total})
        EXPECT(kdb::tvm::combine_out_row(l.p, int(r)) == (r < rows_total ? int(r) : -1), "uniform combine row %zu", r);
  }
}

// v4's final O tile (ss_store_final): every accumulator element (row 16 rg + g (+ 8), column 256 ch + 8 n + 2 c (+ 1),
// n the n-tile; lane = 4 g + c) goes through stmatrix (lane l addresses row l % 8 of 8 x 8 block l / 8; register q of
// lane t holds that block's row t / 4, columns 2 (t % 4), + 1) to the byte the TMA store of box j = column / 64 reads
// for it under the 128-byte swizzle (16-byte chunk k of box row r at chunk k ^ (r % 8)), and the 64 x 512 tile is
// covered once.
void check_o_tile() {
  using namespace kdb::tvm;
  std::vector<int> hits(64 * 512, 0);
  for (int ch = 0; ch < 2; ++ch)
    for (int rg = 0; rg < 4; ++rg)
      for (int kk = 0; kk < 16; ++kk)
        for (int t = 0; t < 32; ++t)
          for (int q = 0; q < 4; ++q)
            for (int e = 0; e < 2; ++e) {
              const int row = 16 * rg + t / 4 + 8 * (q & 1), col = 256 * ch + 8 * ss_o_ntile(kk, q) + 2 * (t % 4) + e;
              const uint32_t byte = ss_o_frag_off(rg, ch, 8 * q + t / 4, kk) + 4 * (t % 4) + 2 * e;
              const int j = byte / kColBlockBytes, r = byte % kColBlockBytes / 128, k = (byte % 128 / 16) ^ (r % 8);
              const int tma_col = 64 * j + 8 * k + byte % 16 / 2;
              EXPECT(r == row && tma_col == col, "ch %d rg %d kk %d lane %d q %d: element (%d, %d) lands on (%d, %d)", ch, rg,
                     kk, t, q, row, col, r, tma_col);
              ++hits[row * 512 + col];
            }
  for (int i = 0; i < 64 * 512; ++i) EXPECT(hits[i] == 1, "O element (%d, %d) written %d times", i / 512, i % 512, hits[i]);
}

// KDB_TVM_SPLITS (reports/h200/decode_splits.py's knob): n uniform splits capped at the KV tiles, no tail plan, every
// unit and partial row covered as in the model's plans; values outside 1..kMaxSplits leave the cost model's plan.
void check_forced_splits() {
  const kdb::TreeVerifyMlaShape ar{1, 1, 64, 1025, 1}, small{2, 9, 16, 100, 1};
  const kdb::TvmPlan model = kdb::tree_verify_mla_plan(ar, 132, kdb::TvmPath::kSeesaw);
  with_env("KDB_TVM_SPLITS", "3", [&] {
    const kdb::TvmPlan p3 = kdb::tree_verify_mla_plan(ar, 132, kdb::TvmPath::kSeesaw);
    EXPECT(p3.num_splits == 3 && p3.tail_pieces == 0, "forced 3: %d splits, %d tail pieces", p3.num_splits, p3.tail_pieces);
    check_shape(ar.batch, ar.nodes, ar.heads, ar.cache_len, 132);
  });
  with_env("KDB_TVM_SPLITS", "64", [&] {
    const kdb::TvmPlan pcap = kdb::tree_verify_mla_plan(small, 132, kdb::TvmPath::kSeesaw);
    EXPECT(pcap.num_splits == 2, "forced 64 on 2 KV tiles: %d splits", pcap.num_splits);
    check_shape(small.batch, small.nodes, small.heads, small.cache_len, 132);
  });
  with_env("KDB_TVM_SPLITS", "65", [&] {
    const kdb::TvmPlan bad = kdb::tree_verify_mla_plan(ar, 132, kdb::TvmPath::kSeesaw);
    EXPECT(bad.num_splits == model.num_splits && bad.tail_pieces == model.tail_pieces, "KDB_TVM_SPLITS=65 not ignored");
  });
}

}  // namespace

int main() {
  int shapes = 0, tails = 0;
  const int anchors[][4] = {{16, 65, 64, 8192 + 65}, {32, 9, 64, 16384 + 9}, {64, 9, 8, 32768 + 9}, {64, 65, 16, 4096 + 65},
                            {8, 257, 128, 8192 + 257}, {4, 1025, 64, 2048 + 1025}, {3, 65, 64, 4102}, {15, 9, 64, 1405}};
  for (int sms : {132, 114, 78, 16, 1})
    for (const auto& a : anchors) check_shape(a[0], a[1], a[2], a[3], sms), ++shapes;
  for (int b : {1, 8, 32})
    for (int h : {8, 16, 64, 128})
      for (int t : {16, 64, 256})
        for (int past : {1024, 8192, 32768}) check_shape(b, t, h, past + t + 7, 132), ++shapes;
  check_o_tile();
  std::mt19937 rng(20261201);
  for (int i = 0; i < 3000; ++i) {  // random shapes of up to ~20,000 units
    const int t = 1 + int(rng() % 1025), h = 1 + int(rng() % 128), rt = (t * h + 63) / 64;
    const int b = 1 + int(rng() % std::max(1, std::min(300, 20000 / rt)));
    const int s_len = t + int(rng() % 40000), sms = 1 + int(rng() % 160);
    check_shape(b, t, h, s_len, sms), ++shapes;
    tails += kdb::tree_verify_mla_plan({b, t, h, s_len, (t + 63) / 64}, sms, kdb::TvmPath::kSeesaw).tail_pieces > 0;
  }
  check_forced_splits(), shapes += 2;
  std::printf("%d shapes, %d random ones with a tail plan, %d failures\n", shapes, tails, failures);
  return failures == 0 && tails > 100 ? 0 : 1;
}
