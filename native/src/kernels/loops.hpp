// Shared loops for kernels: dtype dispatch and a broadcasting N-ary loop over strided views.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../engine.hpp"
#include "../threads.hpp"
#include "scalar_math.hpp"

namespace popxl {

using f16 = _Float16;

// An op's k-th input and its (first) output among the program's buffers.
inline const Buffer& in(const OpInstr& i, const std::vector<Buffer>& b, int k) { return b[i.inputs[k]]; }
inline const Buffer& out(const OpInstr& i, const std::vector<Buffer>& b) { return b[i.outputs[0]]; }

// Compute type: arithmetic on float16 happens in float32, as in the reference engine.
template <class T> struct Wide { using type = T; };
template <> struct Wide<f16> { using type = float; };

// Dense float16 <-> float32 rows. GCC 12 converts _Float16 one value at a time; F16C converts
// eight (rounding to nearest even, as static_cast does).
inline void f16_to_f32(const f16* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < n; ++i) y[i] = float(x[i]);
}
inline void f32_to_f16(const float* x, f16* y, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) y[i] = static_cast<f16>(x[i]);
}

// Byte strides of `b` broadcast (NumPy rules, right-aligned) to an output of `rank` dims.
inline std::vector<int64_t> broadcast_strides(const Buffer& b, const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  std::vector<int64_t> s(rank, 0);
  const size_t off = rank - b.shape.size();
  for (size_t i = 0; i < b.shape.size(); ++i) s[off + i] = b.shape[i] == 1 ? 0 : b.strides[i];
  return s;
}

// Elementwise loops with more elements than this are spread over the threads (threads.hpp).
constexpr int64_t kParallelElements = 32768;
// Library calls (oneDNN primitives, sgemm) with fewer multiply-adds (or similar) than this run on
// one thread: for them a parallel region costs more than it saves, and under load from other
// processes a 2-thread region can wait a whole scheduler time slice for its second thread.
constexpr int64_t kSingleThreadWork = int64_t(1) << 20;

// mask (all ones or zero) ? a : b on the bits of any trivially copyable T of 1, 2, 4 or 8 bytes:
// compilers turn `c ? a : b` on values they load into a branch, which random masks mispredict.
template <class T>
T select_bits(int64_t mask, T a, T b) {
  using Bits = std::conditional_t<sizeof(T) == 1, uint8_t,
               std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  static_assert(sizeof(Bits) == sizeof(T), "select_bits: a 1, 2, 4 or 8 byte type");
  Bits x, y;
  std::memcpy(&x, &a, sizeof(T));
  std::memcpy(&y, &b, sizeof(T));
  const Bits m = static_cast<Bits>(mask), r = static_cast<Bits>((x & m) | (y & ~m));
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

// Copies a rows x cols block of es-byte values, value (r, c) at src + r * es + c * along (a
// transposed view: its values adjacent down the columns), into dense rows `pitch` bytes apart.
// 4-byte values go eight by eight through register transposes: each of the eight source lines is
// read 32 bytes at a time, not 4 (a transposed view's lines are a power of two apart, so they
// share an L1 set and are evicted before the next value on them is read).
// (Not inlined: it is called once per tile, from every nd_loop instantiation.)
__attribute__((noinline)) inline void stage_transposed(uint8_t* dst, int64_t pitch, const uint8_t* src, int64_t rows,
                                                       int64_t cols, int64_t es, int64_t along) {
  int64_t r8 = 0, c8 = 0;
#ifdef __AVX2__
  if (es == 4) {
    r8 = rows / 8 * 8;
    c8 = cols / 8 * 8;
    for (int64_t c = 0; c < c8; c += 8)
      for (int64_t r = 0; r < r8; r += 8) {
        __m256 v[8], t[8];
        for (int j = 0; j < 8; ++j)
          v[j] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + (c + j) * along + r * 4));
        // 8x8 transpose: pairs of rows interleaved, then pairs of pairs, then the 128-bit halves
        for (int j = 0; j < 8; j += 2) {
          t[j] = _mm256_unpacklo_ps(v[j], v[j + 1]);
          t[j + 1] = _mm256_unpackhi_ps(v[j], v[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
          v[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
          v[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
          v[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
          v[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
        }
        for (int j = 0; j < 4; ++j) {
          t[j] = _mm256_permute2f128_ps(v[j], v[j + 4], 0x20);
          t[j + 4] = _mm256_permute2f128_ps(v[j], v[j + 4], 0x31);
        }
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (r + j) * pitch + c * 4), t[j]);
      }
  }
#endif
  auto rest = [&](auto value) {  // what the blocks left, value by value
    using V = decltype(value);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c)
        std::memcpy(dst + r * pitch + c * es, src + r * es + c * along, sizeof(V));
  };
  switch (es) {
    case 1: return rest(uint8_t{});
    case 2: return rest(uint16_t{});
    case 4: return rest(uint32_t{});
    default: return rest(uint64_t{});
  }
}

// Loop over `shape` with N operands; `inner(ptrs, strides, n)` handles the innermost dimension.
// Adjacent dimensions that are contiguous for every operand are merged first, and the outer
// iterations are spread over the engine's threads when there is enough work.
//
// `sizes` (bytes of one value of each operand; 0: not given) lets an input read as a transposed
// view be staged (see nd_loop_run).
//
// nd_loop is instantiated for every kernel and dtype (hundreds of times in the elementwise
// families), so it is split in two: the planning and the ways of sharing out the work (merging
// dimensions, tiles, parallel regions) are nd_loop_run, compiled once per operand count N, which
// calls back into two small functions made for each `inner`: nd_loop_rows (whole rows, `inner`
// inlined into the row loop) and nd_loop_at (one piece of a row). A call through a pointer per
// thread's share of rows or per tile row, where a direct call was before, is all that costs at
// run time; compiling the kernels takes a fraction of the time.
template <size_t N>
struct NdLoop {
  std::vector<int64_t> sh;  // the merged dimensions
  std::array<std::vector<int64_t>, N> st;
  std::array<uint8_t*, N> base;
  std::array<int64_t, N> inner_st;
  size_t rank = 0;
  int64_t n_inner = 0;
  std::array<uint8_t*, N> place(int64_t o, int64_t lo) const {  // the operands' element lo of row o
    std::array<uint8_t*, N> p = base;
    int64_t rem = o;
    for (size_t d = rank - 1; d-- > 0;) {
      const int64_t idx = rem % sh[d];
      rem /= sh[d];
      for (size_t k = 0; k < N; ++k) p[k] += idx * st[k][d];
    }
    for (size_t k = 0; k < N; ++k) p[k] += lo * inner_st[k];
    return p;
  }
};
template <size_t N>
using NdRowsFn = void (*)(const void* inner, const NdLoop<N>& loop, int64_t o0, int64_t o1);
template <size_t N>
using NdAtFn = void (*)(const void* inner, const std::array<uint8_t*, N>& p, const std::array<int64_t, N>& s,
                        int64_t n);

// Whole rows [o0, o1): the first row's place from its index, the next ones' by stepping the
// outer indices like an odometer (no division per row: short rows would pay it per few elements).
template <size_t N, class F>
void nd_loop_rows(const void* fn, const NdLoop<N>& L, int64_t o0, int64_t o1) {
  if (o0 >= o1) return;
  F& inner = *const_cast<F*>(static_cast<const F*>(fn));
  const size_t rank = L.rank;
  std::array<uint8_t*, N> p = L.base;
  std::vector<int64_t> idx(rank - 1);
  int64_t rem = o0;
  for (size_t d = rank - 1; d-- > 0;) {
    idx[d] = rem % L.sh[d];
    rem /= L.sh[d];
    for (size_t k = 0; k < N; ++k) p[k] += idx[d] * L.st[k][d];
  }
  for (int64_t o = o0;;) {
    inner(p, L.inner_st, L.n_inner);
    if (++o == o1) return;
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < L.sh[d]) {
        for (size_t k = 0; k < N; ++k) p[k] += L.st[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) p[k] -= (L.sh[d] - 1) * L.st[k][d];
      idx[d] = 0;
    }
  }
}

template <size_t N, class F>
void nd_loop_at(const void* fn, const std::array<uint8_t*, N>& p, const std::array<int64_t, N>& s, int64_t n) {
  (*const_cast<F*>(static_cast<const F*>(fn)))(p, s, n);
}

template <size_t N>
__attribute__((noinline)) void nd_loop_run(const std::vector<int64_t>& shape,
                                           const std::array<std::vector<int64_t>, N>& strides,
                                           const std::array<uint8_t*, N>& base, const void* fn, NdRowsFn<N> run_rows,
                                           NdAtFn<N> run_at, bool parallel, const std::array<int64_t, N>& sizes) {
  // drop size-1 dims, then merge mergeable neighbours
  NdLoop<N> L;
  L.base = base;
  auto& sh = L.sh;
  auto& st = L.st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sh.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sh.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sh.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  int64_t total = 1;
  for (auto d : shape) total *= d;
  if (total == 0) return;
  if (sh.empty()) {
    std::array<int64_t, N> s{};
    run_at(fn, base, s, int64_t{1});
    return;
  }
  const size_t rank = L.rank = sh.size();
  const int64_t n_inner = L.n_inner = sh[rank - 1];
  std::array<int64_t, N>& inner_st = L.inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = st[k][rank - 1];
  const int64_t outer = total / n_inner;
  // Small loops stay on the calling thread: starting a region costs more than their work.
  if (!parallel || total <= kParallelElements) {
    run_rows(fn, L, 0, outer);
    return;
  }
  // An operand read across its layout (a transposed view: a long stride along the rows, a short
  // one down the columns) misses the cache on every element of a row: the rows are then walked in
  // tiles. An input whose values are adjacent down the columns (its `sizes` entry given) is first
  // copied into a dense kTile x kTile tile on the stack (stage_transposed), which `inner` then
  // reads as rows; other such operands are read in place, the tile's next rows using the lines
  // they bring in, in tiles of few columns (with a power-of-two stride those lines share one L1
  // set). A (1024, 1024) float32 add of a transposed view: 2.5 ms untiled, 1.7 ms in 16 x 64 tiles
  // read in place, 1.2 ms in 32 x 16, 0.3-0.6 ms staged in 32 x 32.
  constexpr int64_t kTile = 32;
  bool across = false;
  std::array<bool, N> staged{};
  if (rank >= 2 && sh[rank - 2] >= kTile && n_inner >= kTile)
    for (size_t k = 0; k < N; ++k) {
      const int64_t along = std::abs(inner_st[k]), down = st[k][rank - 2];
      if (along > 64 && down != 0 && std::abs(down) < along) {
        across = true;
        staged[k] = k > 0 && down == sizes[k] && sizes[k] <= 8;
      }
    }
  if (across) {
    const int64_t tile_c = std::find(staged.begin(), staged.end(), true) != staged.end() ? kTile : kTile / 2;
    const int64_t R = sh[rank - 2], tiles_r = (R + kTile - 1) / kTile, tiles_c = (n_inner + tile_c - 1) / tile_c,
                  planes = outer / R;
    std::array<int64_t, N> s = inner_st;
    for (size_t k = 0; k < N; ++k)
      if (staged[k]) s[k] = sizes[k];
    threads::for_each(planes * tiles_r * tiles_c, [&](int64_t w) {
      const int64_t tc = w % tiles_c, tr = w / tiles_c % tiles_r, plane = w / (tiles_c * tiles_r);
      const int64_t r0 = tr * kTile, c0 = tc * tile_c, rows = std::min(kTile, R - r0),
                    cols = std::min(tile_c, n_inner - c0);
      alignas(32) uint8_t tiles[N][kTile * kTile * 8];
      const std::array<uint8_t*, N> p0 = L.place(plane * R + r0, c0);
      for (size_t k = 0; k < N; ++k)
        if (staged[k]) stage_transposed(tiles[k], kTile * sizes[k], p0[k], rows, cols, sizes[k], inner_st[k]);
      for (int64_t r = 0; r < rows; ++r) {
        std::array<uint8_t*, N> p;
        for (size_t k = 0; k < N; ++k)
          p[k] = staged[k] ? tiles[k] + r * kTile * sizes[k] : p0[k] + r * st[k][rank - 2];
        run_at(fn, p, s, cols);
      }
    });
    return;
  }
  // Rows are cut into pieces when there are too few of them to share out (a contiguous tensor
  // merges into one row); a piece is a multiple of 64 elements, so threads never share a cache line
  // of a dense float32 output.
  const int64_t want = 4 * static_cast<int64_t>(threads::max_threads());
  if (outer >= want) {  // whole rows, an even share of them each thread
    threads::region([&](int t, int team) {
      const threads::Share sh = threads::share(outer, t, team);
      run_rows(fn, L, sh.first, sh.last);
    });
    return;
  }
  const int64_t pieces = std::min((want + outer - 1) / outer, (n_inner + 63) / 64);
  const int64_t piece = ((n_inner + pieces - 1) / pieces + 63) / 64 * 64;
  threads::for_each(outer * pieces, [&](int64_t w) {
    const int64_t lo = (w % pieces) * piece;
    if (lo < n_inner) run_at(fn, L.place(w / pieces, lo), inner_st, std::min(piece, n_inner - lo));
  });
}

template <size_t N, class F>
void nd_loop(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, N>& strides,
             std::array<uint8_t*, N> base, F&& inner, bool parallel = true, const std::array<int64_t, N>& sizes = {}) {
  using Fn = std::remove_reference_t<F>;
  nd_loop_run<N>(shape, strides, base, static_cast<const void*>(std::addressof(inner)), &nd_loop_rows<N, Fn>,
                 &nd_loop_at<N, Fn>, parallel, sizes);
}

template <class T> struct Tag { using type = T; };

// The sum of term(i) for i in [0, n): W lanes over blocks of 1024 values, so the loop vectorises,
// with the block sums added in double, which keeps the result about as exact as a pairwise sum.
template <class W, class F>
double lane_sum(int64_t n, F&& term) {
  constexpr int kLanes = 16;
  double total = 0;
  for (int64_t lo = 0; lo < n; lo += 1024) {
    const int64_t hi = std::min(n, lo + 1024);
    W acc[kLanes] = {};
    int64_t i = lo;
    for (; i + kLanes <= hi; i += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += term(i + k);
    double block = 0;
    for (; i < hi; ++i) block += double(term(i));
    for (int k = 0; k < kLanes; ++k) block += double(acc[k]);
    total += block;
  }
  return total;
}

// Whether elements of dtype `d` are stored as the C++ type W (for the compute types map_rows uses).
template <class W>
constexpr bool stored_as(DType d) {
  if constexpr (std::is_same_v<W, float>) return d == DType::F32;
  else if constexpr (std::is_same_v<W, double>) return d == DType::F64;
  else if constexpr (std::is_same_v<W, int64_t>) return d == DType::I64;
  else return false;
}

// Whether every operand of an nd_loop inner row steps by sizeof(T): dense rows, for which a plain
// indexed loop (one the compiler vectorises) can replace the strided one.
template <class T, size_t N>
bool dense_rows(const std::array<int64_t, N>& strides) {
  for (int64_t s : strides)
    if (s != static_cast<int64_t>(sizeof(T))) return false;
  return true;
}

// Call f(Tag<T>{}) for the C++ type T of a float dtype; false if the dtype is not one.
template <class F>
bool dispatch_float(DType d, F&& f) {
  switch (d) {
    case DType::F32: f(Tag<float>{}); return true;
    case DType::F64: f(Tag<double>{}); return true;
    case DType::F16: f(Tag<f16>{}); return true;
    default: return false;
  }
}

// Calls f(Tag<W>{}) with the compute type of a float16/32/64 dtype.
template <class F>
bool dispatch_wide(DType d, F&& f) {
  return dispatch_float(d, [&](auto tag) { f(Tag<typename Wide<typename decltype(tag)::type>::type>{}); });
}

// Integers and floats (no bool).
template <class F>
bool dispatch_arith(DType d, F&& f) {
  switch (d) {
    case DType::I8: f(Tag<int8_t>{}); return true;
    case DType::I16: f(Tag<int16_t>{}); return true;
    case DType::I32: f(Tag<int32_t>{}); return true;
    case DType::I64: f(Tag<int64_t>{}); return true;
    case DType::U8: f(Tag<uint8_t>{}); return true;
    case DType::U16: f(Tag<uint16_t>{}); return true;
    case DType::U32: f(Tag<uint32_t>{}); return true;
    case DType::U64: f(Tag<uint64_t>{}); return true;
    default: return dispatch_float(d, f);
  }
}

// Every numeric dtype, bool included.
template <class F>
bool dispatch_numeric(DType d, F&& f) {
  if (d == DType::Bool) {
    f(Tag<bool>{});
    return true;
  }
  return dispatch_arith(d, f);
}

// A kernel that is one function of the arena.
struct FnKernel : Kernel {
  std::function<void(uint8_t*)> fn;
  explicit FnKernel(std::function<void(uint8_t*)> f) : fn(std::move(f)) {}
  void run(uint8_t* arena) override { fn(arena); }
};

template <class T>
inline T& at(uint8_t* p, int64_t i, int64_t stride) { return *reinterpret_cast<T*>(p + i * stride); }

// y = fn over n float16 values computed in float, a chunk at a time: each of the K operands is a
// dense row (stride 2 bytes) or one value repeated (stride 0); fn(float* y, const float* const*
// x, m) sees float rows. Vectorised conversions, and a float loop GCC can vectorise.
template <size_t K, class F>
void f16_rows_in_float(f16* y, const std::array<const f16*, K>& x, const std::array<int64_t, K>& stride, int64_t n,
                       F&& fn) {
  constexpr int64_t kChunk = 256;
  float in[K][kChunk], out[kChunk];
  const float* ptrs[K];
  for (size_t k = 0; k < K; ++k) {
    ptrs[k] = in[k];
    if (stride[k] == 0) std::fill(in[k], in[k] + std::min(kChunk, n), float(*x[k]));
  }
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(kChunk, n - i0);
    for (size_t k = 0; k < K; ++k)
      if (stride[k] != 0) f16_to_f32(x[k] + i0, in[k], m);
    fn(out, ptrs, m);
    f32_to_f16(out, y + i0, m);
  }
}

// One nd_loop row of y = op(l, r) for operands of type T computed in W: a vectorisable loop when
// the rows are dense, or when one operand is a single value per row (a per-channel scale or bias
// broadcast over a tensor); the strided loop otherwise.
template <class T, class W, class Op>
void combine_rows(const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n, Op&& op) {
  T* y = reinterpret_cast<T*>(p[0]);
  const T *l = reinterpret_cast<const T*>(p[1]), *r = reinterpret_cast<const T*>(p[2]);
  if constexpr (std::is_same_v<T, f16>) {
    const auto dense_or_one = [](int64_t st) { return st == 0 || st == int64_t(sizeof(T)); };
    if (s[0] == int64_t(sizeof(T)) && dense_or_one(s[1]) && dense_or_one(s[2])) {
      f16_rows_in_float<2>(y, {l, r}, {s[1], s[2]}, n, [&](float* out, const float* const* in, int64_t m) {
        for (int64_t i = 0; i < m; ++i) out[i] = op(in[0][i], in[1][i]);
      });
      return;
    }
  }
  if (dense_rows<T>(s)) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(op(W(l[i]), W(r[i])));
  } else if (dense_rows<T>(std::array<int64_t, 2>{s[0], s[1]}) && s[2] == 0) {
    const W rv = W(*r);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(op(W(l[i]), rv));
  } else if (dense_rows<T>(std::array<int64_t, 2>{s[0], s[2]}) && s[1] == 0) {
    const W lv = W(*l);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(op(lv, W(r[i])));
  } else {
    for (int64_t i = 0; i < n; ++i)
      at<T>(p[0], i, s[0]) = static_cast<T>(op(W(at<T>(p[1], i, s[1])), W(at<T>(p[2], i, s[2]))));
  }
}

// double -> float16, rounded once as a direct conversion is, without libgcc's per-value software
// routine (~40 cycles): to float by truncation with the discarded bits kept as a sticky low bit
// ("round to odd"; float has 13 more bits than float16), then float -> float16 in hardware.
inline f16 f16_of_double(double d) {
  float f = static_cast<float>(d);
  if (double(f) != d && std::isfinite(f)) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if (std::fabs(double(f)) > std::fabs(d)) --bits;  // rounded away from zero: one step back (f != 0 here)
    bits |= 1;
    std::memcpy(&f, &bits, sizeof bits);
  }
  return static_cast<f16>(f);
}

// Value conversion as NumPy's astype does it for values in range (integers to narrower integers
// wrap, as there). Float -> int truncates toward zero and saturates: values beyond the integer
// type's range give its limits, NaN gives 0 (C++ leaves these undefined, NumPy's results are the
// CPU's); popxl.ops.utils.convert is the reference's form of this rule.
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, f16> && std::is_same_v<From, double>) {
    return f16_of_double(v);
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && !std::is_integral_v<From>) {
    const double t = std::trunc(double(v));
    // [lowest, 2**digits) holds exactly the truncated values To can represent; both bounds are exact
    const double lowest = double(std::numeric_limits<To>::lowest());
    const double beyond = 2.0 * double(uint64_t(1) << (std::numeric_limits<To>::digits - 1));
    if (t >= beyond) return std::numeric_limits<To>::max();
    if (t < lowest) return std::numeric_limits<To>::lowest();
    return t == t ? static_cast<To>(t) : To(0);  // NaN fails every comparison
  } else {
    return static_cast<To>(v);
  }
}

// One strided row of any numeric dtype converted to/from a packed row of W. The dtype switch is
// per row, so each typed loop stays simple enough to vectorise.
template <class W>
void load_row(const uint8_t* p, int64_t stride, DType d, W* out, int64_t n) {
  const bool ok = dispatch_numeric(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (stride == static_cast<int64_t>(sizeof(T))) {  // contiguous: a loop the compiler vectorises
      const T* q = reinterpret_cast<const T*>(p);
      if constexpr (std::is_same_v<T, f16> && std::is_same_v<W, float>) return f16_to_f32(q, out, n);
      for (int64_t i = 0; i < n; ++i) out[i] = convert<W>(q[i]);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = convert<W>(*reinterpret_cast<const T*>(p + i * stride));
  });
  if (!ok) throw std::runtime_error(std::string("unsupported dtype ") + dtype_name(d));
}

template <class W>
void store_row(uint8_t* p, int64_t stride, DType d, const W* in, int64_t n) {
  const bool ok = dispatch_numeric(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (stride == static_cast<int64_t>(sizeof(T))) {
      T* q = reinterpret_cast<T*>(p);
      if constexpr (std::is_same_v<T, f16> && std::is_same_v<W, float>) return f32_to_f16(in, q, n);
      for (int64_t i = 0; i < n; ++i) q[i] = convert<T>(in[i]);
      return;
    }
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p + i * stride) = convert<T>(in[i]);
  });
  if (!ok) throw std::runtime_error(std::string("unsupported dtype ") + dtype_name(d));
}

// A numeric scalar tensor (any dtype, shape () or (1,)) read as W.
template <class W>
W load_scalar(const uint8_t* arena, const Buffer& b) {
  W v;
  load_row<W>(arena + b.offset, 0, b.dtype, &v, 1);
  return v;
}

inline bool is_int(DType d) {
  return d == DType::I8 || d == DType::I16 || d == DType::I32 || d == DType::I64 || d == DType::U8 ||
         d == DType::U16 || d == DType::U32 || d == DType::U64;
}

inline bool is_numeric(DType d) {
  return d != DType::F8_143 && d != DType::F8_152 && d != DType::C64 && d != DType::C128;
}

// Elementwise map in compute type W over the shape of `y`: K operands of any numeric dtypes
// (each of y's shape or broadcastable to it) are converted to W a chunk of a row at a time,
// `fn(W* y, const W* const* x, n)` computes the chunk and it is rounded once into y's dtype.
template <class W, size_t K, class F>
void map_rows(uint8_t* arena, const Buffer& y, const std::array<Buffer, K>& xs, F&& fn) {
  std::array<std::vector<int64_t>, K + 1> strides;
  std::array<uint8_t*, K + 1> base;
  strides[0] = y.strides;
  base[0] = arena + y.offset;
  for (size_t k = 0; k < K; ++k) {
    strides[k + 1] = broadcast_strides(xs[k], y.shape);
    base[k + 1] = arena + xs[k].offset;
  }
  // Operands already stored as W: dense rows are handed to fn in place, without staging.
  bool stored_as_w = stored_as<W>(y.dtype);
  for (size_t k = 0; k < K; ++k) stored_as_w = stored_as_w && stored_as<W>(xs[k].dtype);
  nd_loop<K + 1>(y.shape, strides, base,
                 [&](const std::array<uint8_t*, K + 1>& p, const std::array<int64_t, K + 1>& s, int64_t n) {
                   if (stored_as_w && dense_rows<W>(s)) {
                     const W* direct[K == 0 ? 1 : K];
                     for (size_t k = 0; k < K; ++k) direct[k] = reinterpret_cast<const W*>(p[k + 1]);
                     fn(reinterpret_cast<W*>(p[0]), direct, n);
                     return;
                   }
                   constexpr int64_t kChunk = 256;
                   W in[K == 0 ? 1 : K][kChunk], out[kChunk];
                   const W* ptrs[K == 0 ? 1 : K];
                   for (size_t k = 0; k < K; ++k) ptrs[k] = in[k];
                   for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
                     const int64_t m = std::min(kChunk, n - i0);
                     for (size_t k = 0; k < K; ++k)
                       load_row<W>(p[k + 1] + i0 * s[k + 1], s[k + 1], xs[k].dtype, in[k], m);
                     fn(out, ptrs, m);
                     store_row<W>(p[0] + i0 * s[0], s[0], y.dtype, out, m);
                   }
                 });
}

// Byte strides of a C-contiguous array of `shape` with `item`-byte elements.
inline std::vector<int64_t> packed_strides(const std::vector<int64_t>& shape, int64_t item) {
  std::vector<int64_t> s(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = item;
    item *= shape[i];
  }
  return s;
}

// A buffer seen as packed C-order bytes: the arena itself when the buffer is contiguous, else a
// scratch copy. Kernels run one replica at a time, so one scratch per kernel suffices.
struct Packed {
  Buffer buf;
  std::vector<uint8_t> scratch;
  Packed() = default;
  explicit Packed(const Buffer& b) : buf(b) {}
  const uint8_t* read(uint8_t* arena) {
    if (buf.contiguous) return arena + buf.offset;
    scratch.resize(buf.nbytes());
    copy_buffer(scratch.data(), packed_like(buf), arena, buf);
    return scratch.data();
  }
  uint8_t* write(uint8_t* arena) {
    if (buf.contiguous) return arena + buf.offset;
    scratch.resize(buf.nbytes());
    return scratch.data();
  }
  void commit(uint8_t* arena) {  // after write(): move the result into a strided buffer
    if (!buf.contiguous) copy_buffer(arena, buf, scratch.data(), packed_like(buf));
  }
  // The elements (C order) as int64 (integer index tensors). uint64 values beyond int64's range
  // become its largest value, out of range for any axis, instead of wrapping to negative indices
  // (which count from the end).
  void read_ints(uint8_t* arena, std::vector<int64_t>& out) {
    out.resize(buf.nelms);
    const uint8_t* p = read(arena);
    if (buf.dtype == DType::U64) {
      for (int64_t i = 0; i < buf.nelms; ++i) {
        uint64_t v;
        std::memcpy(&v, p + i * 8, 8);
        out[i] = static_cast<int64_t>(std::min<uint64_t>(v, uint64_t(std::numeric_limits<int64_t>::max())));
      }
      return;
    }
    load_row<int64_t>(p, static_cast<int64_t>(itemsize(buf.dtype)), buf.dtype, out.data(), buf.nelms);
  }
};

// Product of v[from:to] (clamped to v's length).
inline int64_t prod(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX) {
  const auto end = v.begin() + static_cast<std::ptrdiff_t>(std::min(to, v.size()));
  int64_t n = 1;
  for (auto it = v.begin() + static_cast<std::ptrdiff_t>(std::min(from, v.size())); it < end; ++it) n *= *it;
  return n;
}

// Recompute the derived fields of a buffer whose shape or strides were edited.
inline void refresh(Buffer& b) {
  b.nelms = prod(b.shape);
  int64_t expect = static_cast<int64_t>(itemsize(b.dtype));
  b.contiguous = true;
  for (size_t i = b.shape.size(); i-- > 0;) {
    if (b.shape[i] != 1 && b.strides[i] != expect) b.contiguous = false;
    expect *= b.shape[i];
  }
}

// The part [start, start + len) of `b` along `axis`, as a view.
inline Buffer window(const Buffer& b, size_t axis, int64_t start, int64_t len) {
  Buffer v = b;
  v.offset += start * b.strides[axis];
  v.shape[axis] = len;
  refresh(v);
  return v;
}

// The compute type rule of var updates and scatter-adds: float32 when every operand is
// float16/float32, else float64 (float64 and integer operands).
inline bool needs_double(std::initializer_list<const Buffer*> bs) {
  for (const Buffer* b : bs) {
    const DType d = b->dtype;
    if (!(d == DType::F16 || d == DType::F32)) return true;  // float64, integers and bool
  }
  return false;
}

// A scalar parameter: a float attribute, or (attribute None) the next scalar tensor input.
struct ScalarArg {
  bool tensor = false;
  double value = 0;
  Buffer buf;
  template <class W>
  W get(const uint8_t* arena) const { return tensor ? load_scalar<W>(arena, buf) : W(value); }
};

inline ScalarArg scalar_arg(const OpInstr& ins, const std::vector<Buffer>& bufs, const char* name, size_t& next) {
  ScalarArg s;
  if (ins.attr_is_none(name)) {
    s.tensor = true;
    s.buf = bufs[ins.inputs.at(next++)];
  } else {
    s.value = ins.attr_float(name);
  }
  return s;
}

// Calls f(Tag<W>{}) with W = double when `wide`, else float.
template <class F>
void with_wide(bool wide, F&& f) {
  if (wide) f(Tag<double>{}); else f(Tag<float>{});
}

// A packed buffer read into / written from a vector of W.
template <class W>
void read_all(uint8_t* arena, Packed& p, std::vector<W>& out) {
  out.resize(p.buf.nelms);
  load_row<W>(p.read(arena), static_cast<int64_t>(itemsize(p.buf.dtype)), p.buf.dtype, out.data(), p.buf.nelms);
}

template <class W>
void write_all(uint8_t* arena, Packed& p, const std::vector<W>& v) {
  store_row<W>(p.write(arena), static_cast<int64_t>(itemsize(p.buf.dtype)), p.buf.dtype, v.data(), p.buf.nelms);
  p.commit(arena);
}

// Scatter-add of rows along an axis, as np.add.at does it (contributions to one place in index
// order): acc[g, p, idx[g, j], :] += scale * src[g, p, j, :], with acc (groups, pre, D, post) and
// src (groups, pre, K, post). Negative indices count from the end when `wrap`; others outside
// [0, D) are dropped.
struct RowScatter {
  int64_t groups, pre, D, K, post;
  bool wrap;
  template <class W>
  void run(W* acc, const W* src, const int64_t* idx, W scale) const {
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t p = 0; p < pre; ++p)
        for (int64_t j = 0; j < K; ++j) {
          int64_t i = idx[g * K + j];
          if (wrap && i < 0) i += D;
          if (i < 0 || i >= D) continue;
          W* dst = acc + ((g * pre + p) * D + i) * post;
          const W* row = src + ((g * pre + p) * K + j) * post;
          for (int64_t e = 0; e < post; ++e) dst[e] += row[e] * scale;
        }
  }
};

}  // namespace popxl
