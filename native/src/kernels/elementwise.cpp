// Elementwise kernels: unary math, binary arithmetic and comparisons with broadcasting, where,
// cast, clip and scaled_add. Float16 computes in float32, as the reference engine does.
// A factory returns nullptr for dtypes it does not cover; the engine then falls back.
#include <cmath>
#include <limits>
#include <type_traits>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

const Buffer& in(const OpInstr& i, const std::vector<Buffer>& b, int k) { return b[i.inputs[k]]; }
const Buffer& out(const OpInstr& i, const std::vector<Buffer>& b) { return b[i.outputs[0]]; }

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
                   });
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
KernelFactory predicate(Op op) {  // float -> bool
  return [op](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = in(ins, bufs, 0), y = out(ins, bufs);
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<2>(y.shape, {y.strides, x.strides}, {a + y.offset, a + x.offset},
                   [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                     for (int64_t i = 0; i < n; ++i) at<bool>(p[0], i, s[0]) = op(float(at<T>(p[1], i, s[1])));
                   });
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
    {{"negate"}, unary([](auto x) { return -x; }, true)},
    {{"abs"}, unary([](auto x) { return x < 0 ? -x : x; }, true)},
    {{"relu", "relu_"}, unary([](auto x) { return x < 0 ? decltype(x)(0) : x; }, true)},  // NaN stays NaN
    {{"sign"}, unary([](auto x) { return decltype(x)((x > 0) - (x < 0)); }, true)},
    {{"isnan"}, predicate([](float x) { return std::isnan(x); })},
    {{"isinf"}, predicate([](float x) { return std::isinf(x); })},
    {{"isfinite"}, predicate([](float x) { return std::isfinite(x); })},
};

// ---- binary -----------------------------------------------------------------------------------
// `Out` decides the output type: the operand type (arithmetic) or bool (comparisons).
enum class Result { Same, Bool };

template <class Op>
KernelFactory binary(Op op, Result result, bool ints_too) {
  return [op, result, ints_too](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer a_ = in(ins, bufs, 0), b_ = in(ins, bufs, 1), y = out(ins, bufs);
    if (a_.dtype != b_.dtype) return nullptr;
    unique_ptr<Kernel> k;
    auto make = [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      auto as = broadcast_strides(a_, y.shape), bs = broadcast_strides(b_, y.shape);
      const bool to_bool = result == Result::Bool;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<3>(y.shape, {y.strides, as, bs}, {a + y.offset, a + a_.offset, a + b_.offset},
                   [&](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                     if (to_bool) {
                       for (int64_t i = 0; i < n; ++i)
                         at<bool>(p[0], i, s[0]) = op(W(at<T>(p[1], i, s[1])), W(at<T>(p[2], i, s[2])));
                     } else {
                       combine_rows<T, W>(p, s, n, op);
                     }
                   });
      });
    };
    if (ints_too) dispatch_numeric(a_.dtype, make); else dispatch_float(a_.dtype, make);
    return k;
  };
}

template <class W>
W floor_div(W a, W b) {
  if constexpr (std::is_floating_point_v<W>) {
    return a / b;
  } else if constexpr (std::is_same_v<W, bool>) {
    return b ? a : false;
  } else {
    if (b == 0) return 0;
    W q = a / b;
    if constexpr (std::is_signed_v<W>)
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  }
}

template <class W>
W c_fmod(W a, W b) {
  if constexpr (std::is_floating_point_v<W>) return std::fmod(a, b);
  else if constexpr (std::is_same_v<W, bool>) return false;
  else return b == 0 ? W(0) : W(a % b);
}

template <class W>
W power(W a, W b) {
  if constexpr (std::is_floating_point_v<W>) {
    // x ** 2 (variances, squared errors) as a multiply, at a fraction of a pow call's cost: glibc's
    // pow gives exactly x * x there (checked over every float and 2e8 random doubles)
    return b == W(2) ? a * a : std::pow(a, b);
  } else if constexpr (std::is_same_v<W, bool>) {
    return b ? a : true;
  } else {
    W r = 1;
    for (W e = 0; e < b; ++e) r *= a;
    return r;
  }
}

const RegisterKernel binary_ops[] = {
    {{"add", "add_"}, binary([](auto a, auto b) { return a + b; }, Result::Same, true)},
    {{"sub"}, binary([](auto a, auto b) { return a - b; }, Result::Same, true)},
    {{"mul"}, binary([](auto a, auto b) { return a * b; }, Result::Same, true)},
    {{"div"}, binary([](auto a, auto b) { return floor_div(a, b); }, Result::Same, true)},
    {{"fmod"}, binary([](auto a, auto b) { return c_fmod(a, b); }, Result::Same, true)},
    {{"pow"}, binary([](auto a, auto b) { return power(a, b); }, Result::Same, true)},
    {{"equal"}, binary([](auto a, auto b) { return a == b; }, Result::Bool, true)},
    {{"greater"}, binary([](auto a, auto b) { return a > b; }, Result::Bool, true)},
    // unary ops' input gradients from (g, x) or (g, y), in the order of the reference's formulas;
    // relu_grad is g * (x > 0) as a product: an infinite or NaN g gives NaN where x <= 0
    {{"relu_grad"},
     binary([](auto g, auto x) { return x > decltype(x)(0) ? g : g * decltype(g)(0); }, Result::Same, true)},
    {{"tanh_grad"}, binary([](auto g, auto y) { return g * (decltype(y)(1) - y * y); }, Result::Same, false)},
    {{"sigmoid_grad"}, binary([](auto g, auto y) { return g * (y * (decltype(y)(1) - y)); }, Result::Same, false)},
    {{"logical_and"}, binary([](auto a, auto b) { return bool(a) && bool(b); }, Result::Bool, true)},
    {{"logical_or"}, binary([](auto a, auto b) { return bool(a) || bool(b); }, Result::Bool, true)},
};

// maximum with exactly two operands (NaN propagates, as np.maximum)
const RegisterKernel maximum_op{{"maximum"}, [](const OpInstr& ins, const std::vector<Buffer>& b) -> unique_ptr<Kernel> {
  if (ins.inputs.size() != 2) return nullptr;
  return binary([](auto a, auto c) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(c)) return a + c;
    return a > c ? a : c;
  }, Result::Same, true)(ins, b);
}};

// ---- where, cast, clip, scaled_add --------------------------------------------------------------
const RegisterKernel where_op{{"where"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer c = in(ins, bufs, 0), x = in(ins, bufs, 1), z = in(ins, bufs, 2), y = out(ins, bufs);
  if (c.dtype != DType::Bool || x.dtype != z.dtype) return nullptr;
  unique_ptr<Kernel> k;
  dispatch_numeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto cs = broadcast_strides(c, y.shape), xs = broadcast_strides(x, y.shape), zs = broadcast_strides(z, y.shape);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      nd_loop<4>(y.shape, {y.strides, cs, xs, zs}, {a + y.offset, a + c.offset, a + x.offset, a + z.offset},
                 [&](const std::array<uint8_t*, 4>& p, const std::array<int64_t, 4>& s, int64_t n) {
                   constexpr int64_t t = sizeof(T);
                   if (s[0] == t && s[1] == 1 && s[2] == t && s[3] == t) {  // dense: a loop the compiler vectorises
                     T* out = reinterpret_cast<T*>(p[0]);
                     const bool* cond = reinterpret_cast<const bool*>(p[1]);
                     const T *xv = reinterpret_cast<const T*>(p[2]), *zv = reinterpret_cast<const T*>(p[3]);
                     for (int64_t i = 0; i < n; ++i) out[i] = select_bits(-int64_t(cond[i]), xv[i], zv[i]);
                     return;
                   }
                   for (int64_t i = 0; i < n; ++i)
                     at<T>(p[0], i, s[0]) = at<bool>(p[1], i, s[1]) ? at<T>(p[2], i, s[2]) : at<T>(p[3], i, s[3]);
                 });
    });
  });
  return k;
}};

const RegisterKernel cast_op{{"cast"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer x = in(ins, bufs, 0), y = out(ins, bufs);
  unique_ptr<Kernel> k;
  dispatch_numeric(x.dtype, [&](auto from) {
    dispatch_numeric(y.dtype, [&](auto to) {
      using F = typename decltype(from)::type;
      using T = typename decltype(to)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<2>(y.shape, {y.strides, x.strides}, {a + y.offset, a + x.offset},
                   [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
                     // float16 <-> float32 rows (mixed precision's casts): eight values at a time
                     if constexpr (std::is_same_v<F, f16> && std::is_same_v<T, float>) {
                       if (s[1] == int64_t(sizeof(F)) && s[0] == int64_t(sizeof(T)))
                         return f16_to_f32(reinterpret_cast<const F*>(p[1]), reinterpret_cast<T*>(p[0]), n);
                     } else if constexpr (std::is_same_v<F, float> && std::is_same_v<T, f16>) {
                       if (s[1] == int64_t(sizeof(F)) && s[0] == int64_t(sizeof(T)))
                         return f32_to_f16(reinterpret_cast<const F*>(p[1]), reinterpret_cast<T*>(p[0]), n);
                     }
                     for (int64_t i = 0; i < n; ++i) at<T>(p[0], i, s[0]) = convert<T>(at<F>(p[1], i, s[1]));
                   });
      });
    });
  });
  return k;
}};

// clip: a unary op of its bounds (NaN stays NaN: neither comparison holds).
const RegisterKernel clip_op{{"clip"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const double lo = ins.attrs.at("min").f(), hi = ins.attrs.at("max").f();
  return unary([lo, hi](auto v) {
    using W = decltype(v);
    if (v < W(lo)) v = W(lo);
    if (v > W(hi)) v = W(hi);
    return v;
  })(ins, bufs);
}};

// Read a scalar tensor of any float dtype as double.
double read_scalar(const uint8_t* p, DType d) {
  switch (d) {
    case DType::F32: return *reinterpret_cast<const float*>(p);
    case DType::F64: return *reinterpret_cast<const double*>(p);
    case DType::F16: return double(*reinterpret_cast<const f16*>(p));
    default: throw std::runtime_error("scaled_add: scale must be a float tensor");
  }
}

const RegisterKernel scaled_add_op{{"scaled_add", "scaled_add_"},
  [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = in(ins, bufs, 0), z = in(ins, bufs, 1), y = out(ins, bufs);
    if (x.dtype != z.dtype) return nullptr;
    const bool a_t = ins.attrs.at("a").is_none(), b_t = ins.attrs.at("b").is_none();
    const double a_c = a_t ? 0 : ins.attrs.at("a").f(), b_c = b_t ? 0 : ins.attrs.at("b").f();
    Buffer sa, sb;
    int next = 2;
    if (a_t) sa = in(ins, bufs, next++);
    if (b_t) sb = in(ins, bufs, next++);
    for (const Buffer* s : {&sa, &sb})
      if (s->nelms > 0 && !(s->dtype == DType::F32 || s->dtype == DType::F64 || s->dtype == DType::F16)) return nullptr;
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const W ka = W(a_t ? read_scalar(a + sa.offset, sa.dtype) : a_c);
        const W kb = W(b_t ? read_scalar(a + sb.offset, sb.dtype) : b_c);
        nd_loop<3>(y.shape, {y.strides, x.strides, z.strides}, {a + y.offset, a + x.offset, a + z.offset},
                   [&](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                     combine_rows<T, W>(p, s, n, [ka, kb](W u, W v) { return ka * u + kb * v; });
                   });
      });
    });
    return k;
  }};

}  // namespace
}  // namespace popxl
