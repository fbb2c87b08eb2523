// The warp-local stream of the tree_build vocabulary pass, k <= ws::kMaxK (included by tree_build.cu only).
// Every warp of a (row, split) block streams its own 512-logit steps with no block barrier and keeps its candidates
// in a private slice of the key buffer, pruned by a warp radix select. The admission bound is shared: with P warps
// streaming and m = ceil(k / P), a warp whose read logits hold m keys >= b posts b (the value of its m-th held key),
// and the smallest posted b is a lower bound of the block's k-th logit (the P warps hold P m >= k keys above it),
// read without a barrier (a stale post is smaller, so still a bound). A warp also keeps its own top-k bound for
// capacity (a slice that would overflow is cut to its top k). At the end the slices are filtered by the final
// bound and gathered, and the block finishes as topk_kernel does. plans/0004 "tree_build", Session 19.
#pragma once
#include "tree_build_vocab.h"

namespace kdb {
namespace vocab {
namespace ws {

constexpr int kStep = 32 * kPer;       // 512 logits per warp step
constexpr int kSlice = kCap / kWarps;  // 768 keys per warp
constexpr int kMaxK = kSlice - kStep;  // 256: a slice cut to k keys takes a whole step
constexpr int kWBins = 128;            // 7-bit digits: eight warps' histograms fit beside the keys at 4 blocks/SM
constexpr int kMarkMin = 32;  // a warp cuts once it holds more than its mark (WarpStream::set_mark)
static_assert(kWBins % 32 == 0 && kMaxK % 32 == 0 && kMaxK >= 32, "ws layout");

struct WarpSmem {
  uint32_t hist[kWarps][kWBins];
  uint32_t bound[kWarps];  // order key of each warp's posted b (+inf: a warp with no steps)
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

// The block bound's order key: the smallest posted b (no barrier: posts only rise).
__device__ __forceinline__ uint32_t block_bound_key() {
  const volatile uint32_t* b = wsm.bound;
  uint32_t m = b[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = min(m, b[w]);
  return m;
}

// Lane 0 raises this warp's post to the order key of v.
__device__ __forceinline__ void post(float v) {
  volatile uint32_t* b = wsm.bound + (threadIdx.x >> 5);
  if ((threadIdx.x & 31) == 0) *b = max(*b, float_order_key(v));
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

// Keeps the keys >= keep of keys[0, n) (moved to the front, in order); returns how many.
__device__ __forceinline__ int warp_compact(uint64_t* keys, int n, uint64_t keep) {
  __syncwarp();  // the lanes' appends are visible
  const int lane = threadIdx.x & 31;
  int out = 0;
  for (int base = 0; base < n; base += 32) {  // a round writes below base + 32 and reads [base, base + 32)
    const int i = base + lane;
    const uint64_t v = i < n ? keys[i] : 0;
    const bool kept = i < n && v >= keep;
    const unsigned bal = __ballot_sync(kFullMask, kept);  // after every lane's read of this round
    if (kept) keys[out + __popc(bal & ((1u << lane) - 1u))] = v;
    out += __popc(bal);
  }
  __syncwarp();
  return out;
}

// held > the stream's mark: post the value of the m-th held key, then keep the keys >= max(own, the new block
// bound); returns how many. Outlined (as capacity_cut): rare, and the stream's registers stay its own.
__device__ __noinline__ int mark_cut(int held, int m, uint64_t own) {
  const Selection sel = warp_select_ge(slice(), held, m, held, warp_hist());  // any tie stop: a value <= the m-th
  post(value_of(sel.t >> 32));
  return warp_compact(slice(), held, max(own, uint64_t(block_bound_key()) << 32));
}

struct Cut {
  uint64_t t;  // keys >= t are the warp's top k (ties kept up to kMaxK)
  int held;
};
// held > kMaxK >= k: cut to this warp's top k, post the k-th value (k >= m held keys reach it).
__device__ __noinline__ Cut capacity_cut(int held, int k, uint64_t own) {
  const Selection sel = warp_select_ge(slice(), held, k, kMaxK - k, warp_hist());
  post(value_of(sel.t >> 32));
  const uint64_t t = max(own, sel.t);
  return {t, warp_compact(slice(), held, max(t, uint64_t(block_bound_key()) << 32))};
}

// One warp's streaming state; every member but st is warp-uniform. kAddMark: the next cut once 2m (or kMarkMin)
// more keys are held than after the last one (the bench's A/B); else once the held keys double (the launcher's).
template <bool kAddMark>
struct WarpStream {
  int k, m, mark;
  uint64_t own = 0;           // keys >= own hold this warp's top-k so far (from its capacity cuts)
  float own_thr = -INFINITY;  // admission after a capacity cut: above own's value (later ids are larger)
  int held = 0;
  LseState st;

  __device__ __forceinline__ void set_mark() {
    mark = kAddMark ? held + max(2 * m, kMarkMin) : max(max(2 * m, kMarkMin), 2 * held);
  }
  __device__ __forceinline__ void cut_to_k() {
    const Cut c = capacity_cut(held, k, own);
    own = c.t, held = c.held, own_thr = fmaxf(own_thr, nextafterf(value_of(c.t >> 32), INFINITY));
    set_mark();
  }

  template <int VW>
  __device__ __forceinline__ int count(const float (&x)[kPer], unsigned valid, float t) const {
    int n = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) n += (((valid >> j) & 1u) && x[j] >= t) ? 1 : 0;
    return n;
  }

  // One step g: LSE, then the lanes' candidates x >= max(own_thr, block bound) appended to the slice.
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int g) {
    const float mc = st.add(x);
    float t = fmaxf(own_thr, value_of(block_bound_key()));
    if (!__any_sync(kFullMask, mc >= t)) return;
    int n = count<VW>(x, valid, t), tot = __reduce_add_sync(kFullMask, unsigned(n));
    if (held + tot > kSlice) {
      cut_to_k();  // keeps <= kMaxK = kSlice - kStep: the step fits whatever it admits
      t = fmaxf(own_thr, value_of(block_bound_key()));
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
    if (held > mark) held = mark_cut(held, m, own), set_mark();
  }
};

// The first post of a warp with steps, m <= 32: the m-th largest lane maximum of its first step g (m lanes hold a
// logit >= it); -inf for m > 32. The stream reads the step again (from L2).
template <typename T, int VW>
__device__ __forceinline__ float first_post(const T* row, int V, int g, int nfull, int m) {
  float x[kPer];
  unsigned valid;
  if (VW > 1 && g < nfull) {
    Raw<T, VW, 32> r;
    r.load(row, g);
    r.to_float(x);
  } else {
    load_scalar<T, 32>(row, g, V, x, valid);
  }
  float mc = x[0];
#pragma unroll
  for (int j = 1; j < kPer; ++j) mc = fmaxf(mc, x[j]);
  return m <= 32 ? warp_kth_max(mc, m) : -INFINITY;
}

}  // namespace ws

// topk_kernel's contract (same outputs, same split partials) with the warp-local stream; k <= ws::kMaxK.
template <typename T, int VW, bool kAddMark>
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
  if (threadIdx.x == 0) sm.thr_val = -INFINITY, sm.strict = 0;

  // Steps of 512 logits: the split's chunks [c0, c1) are steps [c0 * kWarps, c1 * kWarps) of the row; warp w takes
  // g0 + w + kWarps i, so the first P warps have steps.
  const int nsteps = ceil_div(V, ws::kStep), nfull = VW > 1 ? V / ws::kStep : 0;
  const int g0 = split * a.chunks_per_split * kWarps, g1 = min(g0 + a.chunks_per_split * kWarps, nsteps);
  const int gv = max(g0, min(g1, nfull)), P = min(kWarps, g1 - g0), m = ceil_div(k, P);
  const float first = warp < P ? ws::first_post<T, VW>(row, V, g0 + warp, nfull, m) : INFINITY;
  if (lane == 0) wsm.bound[warp] = float_order_key(first);
  __syncthreads();
  ws::WarpStream<kAddMark> s{k, m, 0};
  s.set_mark();
  stream_chunks<T, VW, 32>(s, row, V, g0, gv, g1);
  __syncthreads();  // every post is in: the final bound
  s.held = ws::warp_compact(ws::slice(), s.held, max(s.own, uint64_t(ws::block_bound_key()) << 32));
  if (s.held > ws::kMaxK) s.cut_to_k();  // <= kMaxK keys a warp: 8 a lane

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
