// The warp-local stream of the tree_build vocabulary pass, k <= ws::kMaxK (included by tree_build.cu only).
// Every warp of a (row, split) block streams its own 512-logit steps with no block barrier, keeps its candidates
// in a private slice of the key buffer and prunes them alone (a warp radix select). A warp's top-k of what it has
// read is a superset of its share of the block's top-k, and the value of its k-th kept key is a lower bound of
// the block's k-th: posted by a shared atomicMax, the other warps read it without a barrier. At the end every
// warp cuts its slice to its top keys, the block gathers them and finishes as topk_kernel does.
// plans/0004 "tree_build", Session 19.
#pragma once
#include "tree_build_vocab.h"

namespace kdb {
namespace vocab {
namespace ws {

constexpr int kStep = 32 * kPer;       // 512 logits per warp step
constexpr int kSlice = kCap / kWarps;  // 768 keys per warp
constexpr int kMaxK = kSlice - kStep;  // 256: a slice cut to k keys takes a whole step
constexpr int kWBins = 128;            // 7-bit digits: eight warps' histograms fit beside the keys at 4 blocks/SM
constexpr int kMarkMin = 128;          // a warp prunes once it holds more than max(2k, kMarkMin) keys
static_assert(kWBins % 32 == 0 && kMaxK % 32 == 0 && kMaxK >= 32, "ws layout");

struct WarpSmem {
  uint32_t hist[kWarps][kWBins];
  uint32_t bound;  // order key of the largest posted warp bound; every block top-k logit is >= its value
};
// The block's warp state in shared memory (topk_warp_kernel only), and the caller warp's slice of the dynamic
// key buffer: addressed from the warp index rather than held in 64-bit pointers (registers the stream needs).
__shared__ WarpSmem wsm;
__device__ __forceinline__ uint64_t* slice() {
  extern __shared__ __align__(16) unsigned char topk_smem_raw[];
  return reinterpret_cast<uint64_t*>(topk_smem_raw) + (threadIdx.x >> 5) * kSlice;
}
__device__ __forceinline__ uint32_t* warp_hist() { return wsm.hist[threadIdx.x >> 5]; }

__device__ __forceinline__ float value_of(uint64_t key_hi_word) {
  const float v = float_from_order_key(uint32_t(key_hi_word));
  return isnan(v) ? -INFINITY : v;  // a cut inside the value word may zero low bits into a NaN pattern
}

// The digit (from the top) whose bin holds the krem-th largest matching key; lane l owns bins
// kWBins - 1 - (l * 4 + q), q = 0..3. Returns (digit, keys above its bin, keys in its bin), warp-uniform.
__device__ __forceinline__ int3 warp_find_digit(const uint32_t* hist, int krem) {
  constexpr int kPerLane = kWBins / 32;
  const int lane = threadIdx.x & 31;
  uint32_t c[kPerLane];
  int s = 0;
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) c[q] = hist[kWBins - 1 - (lane * kPerLane + q)], s += int(c[q]);
  const int incl = warp_inclusive_scan(s, lane);
  int3 r = make_int3(0, 0, 0);
  if (incl - s < krem && incl >= krem) {
    int run = incl - s;
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) {
      if (run < krem && run + int(c[q]) >= krem) r = make_int3(kWBins - 1 - (lane * kPerLane + q), run, int(c[q]));
      run += int(c[q]);
    }
  }
  const int src = __ffs(__ballot_sync(kFullMask, incl - s < krem && incl >= krem)) - 1;
  return make_int3(__shfl_sync(kFullMask, r.x, src), __shfl_sync(kFullMask, r.y, src),
                   __shfl_sync(kFullMask, r.z, src));
}

// radix_select_ge for one warp on its n distinct keys (1 <= k <= n), 7-bit digits, the same tie stop.
__device__ Selection warp_select_ge(const uint64_t* keys, int n, int k, int tie_slack, uint32_t* hist) {
  const int lane = threadIdx.x & 31;
  uint64_t o = 0, a = ~0ull;
  for (int i = lane; i < n; i += 32) o |= keys[i], a &= keys[i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    o |= __shfl_xor_sync(kFullMask, o, off), a &= __shfl_xor_sync(kFullMask, a, off);
  const uint64_t vary = o ^ a, common = a;
  uint64_t prefix = 0, mask = 0;
  int krem = k;
  while (vary & ~mask) {
    const int hi = 63 - __clzll(vary & ~mask);
    const int shift = max(hi - 6, hi >= 32 ? 32 : 0);  // digits never straddle the value / id words
    const uint64_t dmask = (2ull << (hi - shift)) - 1ull;
    for (int b = lane; b < kWBins; b += 32) hist[b] = 0;
    __syncwarp();
    for (int base = 0; base < n; base += 32) {
      const int i = base + lane;
      const uint64_t key = i < n ? keys[i] : 0;
      const int bin = i < n && (key & mask) == prefix ? int((key >> shift) & dmask) : -1;
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], unsigned(__popc(peers)));
    }
    __syncwarp();
    const int3 d = warp_find_digit(hist, krem);  // (digit, above, bin)
    __syncwarp();                                 // every lane has read hist before the next pass clears it
    prefix |= uint64_t(d.x) << shift;
    mask |= dmask << shift;
    krem -= d.y;
    if (d.z == krem) return {prefix | (common & ~vary & ~mask), k};
    if (tie_slack > 0 && shift >= 32 && ((vary & ~mask) >> 32) == 0 && d.z - krem <= tie_slack)
      return {(prefix | (common & ~vary & ~mask)) & 0xffffffff00000000ull, k - krem + d.z};
  }
  return {prefix | (common & ~vary), k};  // unreachable, as in radix_select_ge
}

// Keeps the sel.kept keys >= the selected t of keys[0, n) (moved to the front, in order); returns their count and
// sets thr_val to t's value. Outlined: rare, and the stream's registers stay its own.
__device__ __noinline__ int warp_cut(uint64_t* keys, int n, int k, int tie_slack, uint32_t* hist, float& thr_val) {
  __syncwarp();  // the lanes' appends are visible
  const Selection sel = warp_select_ge(keys, n, k, tie_slack, hist);
  const int lane = threadIdx.x & 31;
  int out = 0;
  for (int base = 0; base < n; base += 32) {  // a round writes below base + 32 and reads [base, base + 32)
    const int i = base + lane;
    const uint64_t v = i < n ? keys[i] : 0;
    const bool keep = i < n && v >= sel.t;
    const unsigned bal = __ballot_sync(kFullMask, keep);  // after every lane's read of this round
    if (keep) keys[out + __popc(bal & ((1u << lane) - 1u))] = v;
    out += __popc(bal);
  }
  __syncwarp();
  thr_val = value_of(sel.t >> 32);
  return out;
}

// One warp's streaming state; every member but st is warp-uniform.
struct WarpStream {
  int k, mark;
  bool first = true;
  float thr = -INFINITY;  // admit x >= thr: the warp's own bound (strict after a cut: later ids are larger)
  int held = 0;
  LseState st;

  __device__ __forceinline__ float posted() const {  // no barrier: a stale (smaller) bound only admits more
    return value_of(*reinterpret_cast<volatile uint32_t*>(&wsm.bound));
  }

  // Cut to the top k (+ ties up to slack), raise thr, post the k-th value; only when held > k.
  __device__ __forceinline__ void cut(int slack) {
    float v;
    held = warp_cut(slice(), held, k, slack, warp_hist(), v);
    thr = fmaxf(thr, nextafterf(v, INFINITY));
    if ((threadIdx.x & 31) == 0) atomicMax(&wsm.bound, float_order_key(v));
  }

  template <int VW>
  __device__ __forceinline__ int count(const float (&x)[kPer], unsigned valid, float t) const {
    int n = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) n += (((valid >> j) & 1u) && x[j] >= t) ? 1 : 0;
    return n;
  }

  // One step g: LSE, then the lanes' candidates appended to the slice. A step whose candidates would not fit
  // cuts first (the cut's threshold comes from the keys already held, so it is valid for this step too).
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int g) {
    const float mc = st.add(x);
    if (first) {  // k <= 32: every lane holds a logit >= its max, so 32 >= k logits are >= the smallest max
      first = false;
      if (k <= 32) thr = value_of(__reduce_min_sync(kFullMask, float_order_key(isnan(mc) ? -INFINITY : mc)));
    }
    float t = fmaxf(thr, posted());
    if (!__any_sync(kFullMask, mc >= t)) return;
    int n = count<VW>(x, valid, t), tot = __reduce_add_sync(kFullMask, unsigned(n));
    if (held + tot > kSlice) {
      cut(kMaxK - k);  // keeps <= kMaxK = kSlice - kStep: the step fits whatever it admits
      t = fmaxf(thr, posted());
      n = count<VW>(x, valid, t), tot = __reduce_add_sync(kFullMask, unsigned(n));
    }
    int slot = held + warp_inclusive_scan(n, threadIdx.x & 31) - n;  // all lanes: the scan's shuffles need them
    if (n > 0) {
      uint64_t* keys = slice();
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (((valid >> j) & 1u) && x[j] >= t) keys[slot++] = make_key(x[j], uint32_t(chunk_index<VW, 32>(g, j)));
      }
    }
    held += tot;
    if (held > mark) cut(k / 2);
  }
};

}  // namespace ws

// topk_kernel's contract (same outputs, same split partials) with the warp-local stream; k <= ws::kMaxK.
template <typename T, int VW>
__global__ void __launch_bounds__(kThreads, 4) topk_warp_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char topk_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(topk_smem_raw);  // [kCap]: warp w's slice at w * kSlice
  __shared__ TopkSmem sm;
  ws::WarpSmem& wsm = ws::wsm;
  const int64_t r = blockIdx.x / a.splits;
  const int split = int(blockIdx.x % a.splits), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int V = a.vocab, k = a.k;
  const T* row = static_cast<const T*>(a.logits) + r * V;
  pdl_launch_dependents();
  if (threadIdx.x == 0) wsm.bound = float_order_key(-INFINITY), sm.thr_val = -INFINITY, sm.strict = 0;
  __syncthreads();

  // Steps of 512 logits: the split's chunks [c0, c1) are steps [c0 * kWarps, c1 * kWarps) of the row.
  const int nsteps = ceil_div(V, ws::kStep), nfull = VW > 1 ? V / ws::kStep : 0;
  const int g0 = split * a.chunks_per_split * kWarps, g1 = min(g0 + a.chunks_per_split * kWarps, nsteps);
  const int gv = max(g0, min(g1, nfull));
  ws::WarpStream s{k, max(2 * k, ws::kMarkMin)};
  stream_chunks<T, VW, 32>(s, row, V, g0, gv, g1);
  if (s.held > k) s.cut(ws::kMaxK - k);  // <= kMaxK keys a warp: 8 a lane

  // Gather the slices to the front (through registers: a warp's destination may overlap another's slice).
  constexpr int kRegs = ws::kMaxK / 32;
  uint64_t v[kRegs];
#pragma unroll
  for (int q = 0; q < kRegs; ++q) v[q] = q * 32 + lane < s.held ? ws::slice()[q * 32 + lane] : 0;
  if (lane == 0) sm.warp_tot[warp] = s.held;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) before += w < warp ? sm.warp_tot[w] : 0, total += sm.warp_tot[w];
#pragma unroll
  for (int q = 0; q < kRegs; ++q)
    if (q * 32 + lane < s.held) keys[before + q * 32 + lane] = v[q];
  if (threadIdx.x == 0) sm.count = total;
  block_outputs(keys, s.st, sm, a, r);  // starts with a barrier
}

}  // namespace vocab
}  // namespace kdb
