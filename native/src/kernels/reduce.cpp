// Reductions over axes. Floats accumulate in double (the reference engine reduces float16 in
// float32 and float32 with NumPy's pairwise sums; double is at least as exact). Integers
// accumulate in int64 (uint64 in uint64) and wrap into the output type, as NumPy's int64
// reduction + cast does.
#include <cmath>
#include <limits>
#include <type_traits>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

enum class Red { Sum, Mean, Prod, Max, Min, L1, L2, LogSum, LogSumExp, SumSquare };

// Acc: double for floats, int64_t for integers; T: the element type (a template parameter rather
// than a std::function per element, so the accumulation loops inline and vectorise).
template <class Acc, class T>
struct Reduction : Kernel {
  Buffer x, y;
  Red kind;
  std::vector<int64_t> acc_strides;  // byte strides of the accumulator, 0 on reduced axes
  int64_t count = 1;                 // elements reduced into each output
  std::vector<Acc> acc, mx;
  static Acc load(const uint8_t* p) { return Acc(*reinterpret_cast<const T*>(p)); }
  static void store(uint8_t* p, Acc v) {  // integers wrap into T, as NumPy's int64 sum + cast
    if constexpr (std::is_floating_point_v<Acc>) *reinterpret_cast<T*>(p) = convert<T>(v);
    else *reinterpret_cast<T*>(p) = static_cast<T>(static_cast<uint64_t>(v));
  }

  void run(uint8_t* a) override {
    const int64_t m = static_cast<int64_t>(acc.size());
    const Extreme<true> max;
    const Extreme<false> min;
    const auto add = [](Acc s, Acc v) { return wrap(s, v, false); };
    const auto mul = [](Acc s, Acc v) { return wrap(s, v, true); };
    // the starts of max and min, which are also their results over an empty axis: -inf / +inf,
    // or the element type's limits (ONNX's ReduceMax / ReduceMin of an empty set)
    const Acc lowest = std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                              : Acc(std::numeric_limits<T>::lowest());
    const Acc highest = std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                               : Acc(std::numeric_limits<T>::max());
    if (kind == Red::LogSumExp) {  // pass 1: the max, for stability
      std::fill(mx.begin(), mx.end(), lowest);
      accumulate(a, mx.data(), max, max, lowest);
      for (auto& v : mx) if (!std::isfinite(double(v))) v = 0;
    }
    const Acc init = kind == Red::Prod ? Acc(1) : kind == Red::Max ? lowest : kind == Red::Min ? highest : Acc(0);
    std::fill(acc.begin(), acc.end(), init);
    switch (kind) {
      // Integer sums and products wrap modulo 2**64 (unsigned arithmetic: no signed overflow).
      case Red::Sum: case Red::Mean: case Red::LogSum: accumulate(a, acc.data(), add, add, init); break;
      case Red::Prod: accumulate(a, acc.data(), mul, mul, init); break;
      case Red::Max: accumulate(a, acc.data(), max, max, init); break;
      case Red::Min: accumulate(a, acc.data(), min, min, init); break;
      case Red::L1: accumulate(a, acc.data(), [](Acc s, Acc v) { return wrap(s, wrap_abs(v), false); }, add, init); break;
      case Red::L2: case Red::SumSquare:
        accumulate(a, acc.data(), [](Acc s, Acc v) { return wrap(s, wrap(v, v, true), false); }, add, init);
        break;
      case Red::LogSumExp: accumulate_lse(a); break;
    }
    uint8_t* out = a + y.offset;
    const int64_t item = static_cast<int64_t>(itemsize(y.dtype));
    for (int64_t j = 0; j < m; ++j) {
      if constexpr (std::is_floating_point_v<Acc>) {
        double v = acc[j];
        if (kind == Red::Mean) v /= double(count);
        if (kind == Red::L2) v = std::sqrt(v);
        if (kind == Red::LogSum) v = std::log(v);
        if (kind == Red::LogSumExp) v = std::log(v) + mx[j];
        store(out + j * item, v);
      } else {
        store(out + j * item, acc[j]);
      }
    }
  }

  static Acc wrap(Acc s, Acc v, bool mul) {
    if constexpr (std::is_floating_point_v<Acc>) {
      return mul ? s * v : s + v;
    } else {
      const uint64_t a = static_cast<uint64_t>(s), b = static_cast<uint64_t>(v);
      return static_cast<Acc>(mul ? a * b : a + b);
    }
  }

  // body(shape, x byte offset, accumulator byte offset) over slabs of x cut along its longest kept
  // axis, in parallel when x is big: each accumulator entry then lives in one slab and sums its
  // values in the serial order, so results do not depend on the thread count.
  template <class F>
  void over_slabs(F&& body) {
    int ax = -1;
    for (size_t d = 0; d < x.shape.size(); ++d)
      if (acc_strides[d] != 0 && x.shape[d] > 1 && (ax < 0 || x.shape[d] > x.shape[ax])) ax = static_cast<int>(d);
    const int64_t team = threads::max_threads();
    if (ax < 0 || team < 2 || x.nelms <= kParallelElements) {
      body(x.shape, int64_t{0}, int64_t{0});
      return;
    }
    const int64_t len = x.shape[ax], pieces = std::min(len, team);
    threads::for_each(pieces, [&](int64_t p) {
      const int64_t lo = len * p / pieces, hi = len * (p + 1) / pieces;
      std::vector<int64_t> sh = x.shape;
      sh[ax] = hi - lo;
      body(sh, lo * x.strides[ax], lo * acc_strides[ax]);
    });
  }

  // body(x, i0, m) over a dense row of n values of T from p, as T, or for float16 as float a chunk
  // at a time (GCC converts _Float16 one value at a time; f16_to_f32 eight).
  template <class Body>
  static void dense_chunks(const uint8_t* p, int64_t n, Body&& body) {
    const T* x = reinterpret_cast<const T*>(p);
    if constexpr (std::is_same_v<T, f16>) {
      constexpr int64_t kChunk = 256;
      float xf[kChunk];
      for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t m = std::min(kChunk, n - i0);
        f16_to_f32(x + i0, xf, m);
        body(static_cast<const float*>(xf), i0, m);
      }
    } else {
      body(x, int64_t{0}, n);
    }
  }

  // max / min, NaN winning: as a function of two accumulators, and (float values) of eight lanes.
  template <bool is_max>
  struct Extreme {
    Acc operator()(Acc s, Acc v) const { return more_extreme<is_max>(v, s) ? v : s; }
#ifdef POPXL_VEC8
    static __m256 lanes(__m256 s, __m256 v) { return extreme_lanes<is_max>(s, v); }
#endif
  };
  template <class F>
  static constexpr bool is_extreme = std::is_same_v<F, Extreme<true>> || std::is_same_v<F, Extreme<false>>;

  // A dense row of n values into one accumulator `t`: eight independent lanes, merged at the end,
  // since a serial chain waits on each add's latency. Integer results are unchanged; a double sum
  // in this order differs from the serial one in its last bits, so float64 outputs can differ by
  // an ulp or so (as NumPy's pairwise sums do) and float32/float16 outputs very rarely.
  template <class F, class M>
  static void fold_row(const uint8_t* p, int64_t n, Acc& t, F f, M merge, Acc init) {
    Acc lanes[8];
    std::fill(lanes, lanes + 8, init);
#ifdef POPXL_VEC8
    // float values (float16 ones converted): the compiler keeps a select of doubles scalar and
    // branchy; a max or min is exact in float, so eight float lanes give the same result
    if constexpr (is_extreme<F> && (std::is_same_v<T, float> || std::is_same_v<T, f16>)) {
      __m256 v8 = _mm256_set1_ps(float(init));
      dense_chunks(p, n, [&](const float* x, int64_t, int64_t m) {
        int64_t i = 0;
        for (; i + 8 <= m; i += 8) v8 = F::lanes(v8, _mm256_loadu_ps(x + i));
        for (; i < m; ++i) lanes[i & 7] = f(lanes[i & 7], Acc(x[i]));
      });
      alignas(32) float out[8];
      _mm256_store_ps(out, v8);
      for (int j = 0; j < 8; ++j) lanes[j] = f(lanes[j], Acc(out[j]));
      for (const Acc l : lanes) t = merge(t, l);
      return;
    }
#endif
    dense_chunks(p, n, [&](const auto* x, int64_t, int64_t m) {
      int64_t i = 0;
      for (; i + 8 <= m; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] = f(lanes[j], Acc(x[i + j]));
      for (; i < m; ++i) lanes[i & 7] = f(lanes[i & 7], Acc(x[i]));
    });
    for (const Acc l : lanes) t = merge(t, l);
  }

  // acc = f(acc, value) over x; `merge` combines two partial results and `init` starts one.
  template <class F, class M>
  void accumulate(uint8_t* a, Acc* accp, F f, M merge, Acc init) {
    if (acc.size() == 1 && x.contiguous && x.nelms > kParallelElements) {
      // One result from a big dense x: chunks of a fixed size folded on all threads, their results
      // merged in chunk order, so that the result does not depend on the thread count.
      constexpr int64_t kChunk = int64_t(1) << 15;
      const int64_t chunks = (x.nelms + kChunk - 1) / kChunk;
      std::vector<Acc> part(static_cast<size_t>(chunks), init);
      const uint8_t* base = a + x.offset;
      threads::for_each(chunks, [&](int64_t c) {
        fold_row(base + c * kChunk * int64_t(sizeof(T)), std::min(kChunk, x.nelms - c * kChunk), part[c], f, merge,
                 init);
      });
      for (const Acc v : part) accp[0] = merge(accp[0], v);
      return;
    }
    over_slabs([&](const std::vector<int64_t>& sh, int64_t xo, int64_t ao) {
      nd_loop<2>(sh, {x.strides, acc_strides}, {a + x.offset + xo, reinterpret_cast<uint8_t*>(accp) + ao},
                 [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                   if (s[0] == int64_t(sizeof(T)) && s[1] == 0) {  // a row into one accumulator
                     fold_row(p[0], n, *reinterpret_cast<Acc*>(p[1]), f, merge, init);
                     return;
                   }
                   if (s[0] == int64_t(sizeof(T)) && s[1] == int64_t(sizeof(Acc))) {  // a row into a row of accumulators
                     Acc* t = reinterpret_cast<Acc*>(p[1]);
                     dense_chunks(p[0], n, [&](const auto* x, int64_t i0, int64_t m) {
                       for (int64_t i = 0; i < m; ++i) t[i0 + i] = f(t[i0 + i], Acc(x[i]));
                     });
                     return;
                   }
                   for (int64_t i = 0; i < n; ++i) {
                     Acc& t = *reinterpret_cast<Acc*>(p[1] + i * s[1]);
                     t = f(t, load(p[0] + i * s[0]));
                   }
                 }, /*parallel=*/false);
    });
  }

  void accumulate_lse(uint8_t* a) {
    uint8_t* mxp = reinterpret_cast<uint8_t*>(mx.data());
    over_slabs([&](const std::vector<int64_t>& sh, int64_t xo, int64_t ao) {
      nd_loop<3>(sh, {x.strides, acc_strides, acc_strides},
                 {a + x.offset + xo, reinterpret_cast<uint8_t*>(acc.data()) + ao, mxp + ao},
                 [&](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                   for (int64_t i = 0; i < n; ++i) {
                     Acc& t = *reinterpret_cast<Acc*>(p[1] + i * s[1]);
                     t += std::exp(load(p[0] + i * s[0]) - *reinterpret_cast<const Acc*>(p[2] + i * s[2]));
                   }
                 }, false);
    });
  }
};

template <class Acc, class T>
std::unique_ptr<Kernel> make_reduction(Red kind, const OpInstr& ins, const Buffer& x, const Buffer& y) {
  auto k = std::make_unique<Reduction<Acc, T>>();
  std::vector<int64_t> axes = ins.attr_ints("axis");
  std::vector<bool> reduced(x.shape.size(), false);
  for (auto ax : axes) reduced[ax] = true;
  // accumulator laid out like the output (C order over kept axes)
  k->acc_strides.assign(x.shape.size(), 0);
  int64_t acc = sizeof(Acc), m = 1;
  for (size_t d = x.shape.size(); d-- > 0;) {
    if (reduced[d]) { k->count *= x.shape[d]; continue; }
    k->acc_strides[d] = acc;
    acc *= x.shape[d];
    m *= x.shape[d];
  }
  k->x = x;
  k->y = y;
  k->kind = kind;
  k->acc.assign(m, Acc(0));
  k->mx.assign(m, Acc(0));
  return k;
}

// Sum or mean of a dense float32 or float16 (rows, cols) view over its rows: the reduction of
// leading axes onto trailing ones (a bias gradient). Each output's sum runs in row order and does
// not depend on the thread count (threads take columns). float32 rows are added in float in
// blocks of 8 and each block's sums added to a double accumulator, which is then touched once per
// block, not per row; float16 rows (converted eight values at a time) go straight into the double
// accumulator, so each output is rounded once, as the general path rounds it.
struct RowSum : Kernel {
  Buffer x, y;
  int64_t rows = 0, cols = 0;
  bool mean = false;

  void run(uint8_t* a) override {
    if (x.dtype == DType::F16) sum<f16>(a); else sum<float>(a);
  }

  template <class T>
  void sum(uint8_t* a) {
    const T* xs = reinterpret_cast<const T*>(a + x.offset);
    T* ys = reinterpret_cast<T*>(a + y.offset);
    // rows per float block; columns per task (1 KiB of each row, which the prefetcher streams well)
    constexpr int64_t kBlock = 8, kPiece = 1024 / sizeof(T);
    const int64_t pieces = (cols + kPiece - 1) / kPiece;
    threads::for_each(pieces, [&](int64_t p) {
      const int64_t c0 = p * kPiece, n = std::min(kPiece, cols - c0);
      double t[kPiece] = {};
      float block[kPiece];
      for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
        const T* row = xs + r0 * cols + c0;
        const int64_t block_rows = std::min(kBlock, rows - r0);
        if constexpr (std::is_same_v<T, f16>) {
          for (int64_t r = 0; r < block_rows; ++r) {
            f16_to_f32(row + r * cols, block, n);
            for (int64_t j = 0; j < n; ++j) t[j] += double(block[j]);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) block[j] = row[j];
          for (int64_t r = 1; r < block_rows; ++r)
            for (int64_t j = 0; j < n; ++j) block[j] += row[r * cols + j];
          for (int64_t j = 0; j < n; ++j) t[j] += double(block[j]);
        }
      }
      for (int64_t j = 0; j < n; ++j) ys[c0 + j] = convert<T>(mean ? t[j] / double(rows) : t[j]);
    }, rows * cols > kParallelElements && pieces > 1);
  }
};

// The RowSum view of a reduction, when it is one: float32 or float16, contiguous, the reduced axes
// leading, columns enough to share among threads (fewer, a whole reduction: the general path).
std::unique_ptr<Kernel> row_sum(Red kind, const OpInstr& ins, const Buffer& x, const Buffer& y) {
  if ((kind != Red::Sum && kind != Red::Mean) || !(x.dtype == DType::F32 || x.dtype == DType::F16) ||
      y.dtype != x.dtype || !x.contiguous)
    return nullptr;
  std::vector<bool> reduced(x.shape.size(), false);
  for (auto ax : ins.attr_ints("axis")) reduced[ax] = true;
  size_t lead = 0;
  while (lead < reduced.size() && reduced[lead]) ++lead;
  for (size_t d = lead; d < reduced.size(); ++d)
    if (reduced[d] && x.shape[d] != 1) return nullptr;  // a reduced axis after a kept one
  auto k = std::make_unique<RowSum>();
  k->x = x;
  k->y = y;
  k->rows = prod(x.shape, 0, lead);
  k->cols = prod(x.shape, lead);
  k->mean = kind == Red::Mean;
  if (k->rows == 0 || k->cols < 16) return nullptr;  // the general path (which writes 0 / NaN for none)
  return k;
}

KernelFactory reduction(Red kind) {
  return [kind](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
    const Buffer& x = bufs[ins.inputs[0]];
    const Buffer& y = bufs[ins.outputs[0]];
    if (!y.contiguous) return nullptr;
    if (auto k = row_sum(kind, ins, x, y)) return k;
    std::unique_ptr<Kernel> k;
    if (is_int(x.dtype)) {
      if (kind != Red::Sum && kind != Red::Prod && kind != Red::Max && kind != Red::Min) return nullptr;
      dispatch_arith(x.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        // uint64 values beyond int64's range must compare as unsigned (max, min)
        k = make_reduction<std::conditional_t<std::is_same_v<T, uint64_t>, uint64_t, int64_t>, T>(kind, ins, x, y);
      });
      return k;
    }
    dispatch_float(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = make_reduction<double, T>(kind, ins, x, y);
    });
    return k;
  };
}

const RegisterKernel reductions[] = {
    {{"sum"}, reduction(Red::Sum)},       {{"mean"}, reduction(Red::Mean)},
    {{"prod"}, reduction(Red::Prod)},     {{"max"}, reduction(Red::Max)},
    {{"min"}, reduction(Red::Min)},       {{"l1"}, reduction(Red::L1)},
    {{"l2"}, reduction(Red::L2)},         {{"logsum"}, reduction(Red::LogSum)},
    {{"logsumexp"}, reduction(Red::LogSumExp)}, {{"sumsquare"}, reduction(Red::SumSquare)},
};

}  // namespace
}  // namespace popxl
