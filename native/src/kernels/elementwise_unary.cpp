// Elementwise unary kernels: math functions (libmvec's eight-lane forms where the build has them),
// predicates and clip. Float16 computes in float32, as the reference engine does.
// A factory returns nullptr for dtypes it does not cover; the engine then falls back.
#include <cmath>
#include <limits>
#include <type_traits>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- unary ------------------------------------------------------------------------------------
// `float_row`, when given, computes dense float32 rows (a vectorised form of `op`, same results).
// Dense float16 rows are computed in float a chunk at a time.
using FloatRow = void (*)(float*, const float*, int64_t);

template <class Op>
KernelFactory unary(Op op, bool ints_too = false, FloatRow float_row = nullptr) {
  return [op, ints_too, float_row](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = in(ins, bufs, 0), y = out(ins, bufs);
    if (x.dtype != y.dtype) return nullptr;
    unique_ptr<Kernel> k;
    auto make = [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      auto xs = broadcast_strides(x, y.shape);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<2>(y.shape, {y.strides, xs}, {a + y.offset, a + x.offset},
                   [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                     if (dense_rows<T>(s)) {
                       T* y = reinterpret_cast<T*>(p[0]);
                       const T* x = reinterpret_cast<const T*>(p[1]);
                       // float rows: the vectorised form when there is one, else op value by value
                       const auto float_rows = [&](float* out, const float* in, int64_t m) {
                         if (float_row) float_row(out, in, m);
                         else for (int64_t i = 0; i < m; ++i) out[i] = op(in[i]);
                       };
                       if constexpr (std::is_same_v<T, float>) {
                         float_rows(y, x, n);
                         return;
                       } else if constexpr (std::is_same_v<T, f16>) {  // through float chunks
                         f16_rows_in_float<1>(y, {x}, {int64_t(sizeof(T))}, n,
                                              [&](float* out, const float* const* in, int64_t m) { float_rows(out, in[0], m); });
                         return;
                       }
                       for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(op(W(x[i])));
                       return;
                     }
                     if constexpr (std::is_same_v<T, float>) {
                       if (float_row) {  // strided float32 (a transposed view): the vector form, staged
                         constexpr int64_t kStage = 64;
                         float in[kStage], out[kStage];
                         for (int64_t i0 = 0; i0 < n; i0 += kStage) {
                           const int64_t m = std::min(kStage, n - i0);
                           for (int64_t i = 0; i < m; ++i) in[i] = at<float>(p[1], i0 + i, s[1]);
                           float_row(out, in, m);
                           for (int64_t i = 0; i < m; ++i) at<float>(p[0], i0 + i, s[0]) = out[i];
                         }
                         return;
                       }
                     }
                     for (int64_t i = 0; i < n; ++i) at<T>(p[0], i, s[0]) = static_cast<T>(op(W(at<T>(p[1], i, s[1]))));
                   }, true, {0, int64_t(sizeof(T))});
      });
    };
    if (ints_too) dispatch_arith(x.dtype, make); else dispatch_float(x.dtype, make);
    return k;
  };
}

// A unary op computed by one libm function (see Libm): float32 and float16 values go through
// libmvec's eight-lane form when the build has it, float64 through `op`.
template <Libm F, class Op>
KernelFactory libm_unary(Op op) {
#ifdef POPXL_LIBM8
  return unary(
      [op](auto x) {
        if constexpr (std::is_same_v<decltype(x), float>) return libm_one<F>(x);
        else return op(x);
      },
      false, libm_row<F>);
#else
  return unary(op);
#endif
}

template <class Op>
KernelFactory predicate(Op op) {  // float -> bool, in the value's own precision (a float64 above
                                  // float32's range is not infinite)
  return [op](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = in(ins, bufs, 0), y = out(ins, bufs);
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<2>(y.shape, {y.strides, x.strides}, {a + y.offset, a + x.offset},
                   [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                     for (int64_t i = 0; i < n; ++i) at<bool>(p[0], i, s[0]) = op(W(at<T>(p[1], i, s[1])));
                   }, true, {0, int64_t(sizeof(T))});
      });
    });
    return k;
  };
}

const RegisterKernel unary_ops[] = {
    {{"exp", "exp_"}, libm_unary<Libm::Exp>([](auto x) { return std::exp(x); })},
    {{"log"}, libm_unary<Libm::Log>([](auto x) { return std::log(x); })},
    {{"log2"}, libm_unary<Libm::Log2>([](auto x) { return std::log2(x); })},
    {{"sqrt"}, unary([](auto x) { return std::sqrt(x); }, false, sqrt_row)},
    {{"tanh"}, libm_unary<Libm::Tanh>([](auto x) { return std::tanh(x); })},
    {{"cos"}, libm_unary<Libm::Cos>([](auto x) { return std::cos(x); })},
    {{"sin"}, libm_unary<Libm::Sin>([](auto x) { return std::sin(x); })},
    {{"floor"}, unary([](auto x) { return std::floor(x); })},
    {{"ceil"}, unary([](auto x) { return std::ceil(x); })},
    {{"sigmoid"}, libm_unary<Libm::Sigmoid>([](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); })},
    {{"swish", "swish_"}, libm_unary<Libm::Swish>([](auto x) { return x / (decltype(x)(1) + std::exp(-x)); })},
    {{"gelu", "gelu_"}, unary([](auto x) { return gelu_value(x); }, false, gelu_row)},
    {{"geluerf", "geluerf_"}, libm_unary<Libm::GeluErf>([](auto x) {
       using W = decltype(x);
       return W(0.5) * x * (W(1) + std::erf(x * W(kInvSqrt2)));
     })},
    {{"erf"}, unary([](auto x) { return std::erf(x); })},
    {{"negate"}, unary([](auto x) { return wrap_neg(x); }, true)},  // integers wrap: -INT_MIN is INT_MIN
    {{"abs"}, unary([](auto x) { return wrap_abs(x); }, true)},
    {{"relu", "relu_"}, unary([](auto x) { return x < 0 ? decltype(x)(0) : x; }, true)},  // NaN stays NaN
    {{"sign"}, unary([](auto x) { return decltype(x)((x > 0) - (x < 0)); }, true)},
    {{"bitwise_not"}, unary([](auto x) {  // integers only (the op's dtype check)
       using W = decltype(x);
       if constexpr (std::is_integral_v<W> && !std::is_same_v<W, bool>) return W(~x);
       else return x;
     }, true)},
    {{"isnan"}, predicate([](auto x) { return std::isnan(x); })},
    {{"isinf"}, predicate([](auto x) { return std::isinf(x); })},
    {{"isfinite"}, predicate([](auto x) { return std::isfinite(x); })},
};

// clip: a unary op of its bounds (NaN stays NaN: neither comparison holds). Integers are clipped to
// the integers within [lo, hi] (bounds rounded inward, then limited to the dtype's range), as the
// reference does.
const RegisterKernel clip_op{{"clip"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const double lo = ins.attr_float("min"), hi = ins.attr_float("max");
  return unary([lo, hi](auto v) {
    using W = decltype(v);
    W l, h;
    if constexpr (std::is_integral_v<W>) {
      l = convert<W>(std::ceil(lo));
      h = convert<W>(std::floor(hi));
    } else {
      l = W(lo);
      h = W(hi);
    }
    if (v < l) v = l;
    if (v > h) v = h;
    return v;
  }, true)(ins, bufs);
}};

// ---- logical_not: the input read as bool (any nonzero value, NaN included, is true) -------------
const RegisterKernel logical_not_op{{"logical_not"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(x.dtype) || y.dtype != DType::Bool) return nullptr;
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    map_rows<double, 1>(a, y, {x}, [](double* out, const double* const* in, int64_t n) {
      for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] == 0;  // NaN is true, so its negation is false
    });
  });
}};

}  // namespace
}  // namespace popxl
