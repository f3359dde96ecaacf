// Elementwise binary kernels with broadcasting: arithmetic, comparisons, logical ops and the unary
// ops' input gradients. Float16 computes in float32, as the reference engine does.
// A factory returns nullptr for dtypes it does not cover; the engine then falls back.
#include <cmath>
#include <limits>
#include <type_traits>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- binary -----------------------------------------------------------------------------------
// `R` decides the output type: the operand type (arithmetic) or bool (comparisons).
enum class Result { Same, Bool };

// (A template parameter, so each op compiles the one row loop it runs.)
template <Result R, class Op>
KernelFactory binary(Op op, bool ints_too) {
  return [op, ints_too](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer a_ = in(ins, bufs, 0), b_ = in(ins, bufs, 1), y = out(ins, bufs);
    if (a_.dtype != b_.dtype) return nullptr;
    unique_ptr<Kernel> k;
    auto make = [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      auto as = broadcast_strides(a_, y.shape), bs = broadcast_strides(b_, y.shape);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        nd_loop<3>(y.shape, {y.strides, as, bs}, {a + y.offset, a + a_.offset, a + b_.offset},
                   [&](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                     if constexpr (R == Result::Bool) {
                       for (int64_t i = 0; i < n; ++i)
                         at<bool>(p[0], i, s[0]) = op(W(at<T>(p[1], i, s[1])), W(at<T>(p[2], i, s[2])));
                     } else {
                       combine_rows<T, W>(p, s, n, op);
                     }
                   }, true, {0, int64_t(sizeof(T)), int64_t(sizeof(T))});
      });
    };
    if (ints_too) dispatch_numeric(a_.dtype, make); else dispatch_float(a_.dtype, make);
    return k;
  };
}

template <class W>
W floor_div(W a, W b) {
  if constexpr (std::is_floating_point_v<W>) return a / b;
  else if constexpr (std::is_same_v<W, bool>) return b ? a : false;
  else return int_div(a, b, true);
}

template <class W>
W c_fmod(W a, W b) {
  if constexpr (std::is_floating_point_v<W>) return std::fmod(a, b);
  else if constexpr (std::is_same_v<W, bool>) return false;
  else return int_rem(a, b);
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
    // by squaring, wrapping as NumPy's integer power does (the same value modulo 2**bits as
    // repeated products); a negative exponent gives 1, as the reference's max(b, 0)
    W r = 1;
    for (W e = b; e > W(0); e = static_cast<W>(e >> 1)) {
      if (e & W(1)) r = wrap_mul(r, a);
      a = wrap_mul(a, a);
    }
    return r;
  }
}

// Integer bit operations (the engine is only asked for integer operands: the ops' dtype checks);
// other instantiations of the dispatch return the operand unchanged.
template <class F>
auto int_bits(F f) {
  return [f](auto a, auto b) {
    using W = decltype(a);
    if constexpr (std::is_integral_v<W> && !std::is_same_v<W, bool>) return W(f(a, b));
    else return a;
  };
}

template <class W>
bool shift_in_range(W b) {
  if constexpr (std::is_signed_v<W>)
    if (b < 0) return false;
  return b < W(8 * sizeof(W));
}

const RegisterKernel binary_ops[] = {
    {{"add", "add_"}, binary<Result::Same>([](auto a, auto b) { return wrap_add(a, b); }, true)},
    {{"sub"}, binary<Result::Same>([](auto a, auto b) { return wrap_sub(a, b); }, true)},
    {{"mul"}, binary<Result::Same>([](auto a, auto b) { return wrap_mul(a, b); }, true)},
    {{"div"}, binary<Result::Same>([](auto a, auto b) { return floor_div(a, b); }, true)},
    {{"fmod"}, binary<Result::Same>([](auto a, auto b) { return c_fmod(a, b); }, true)},
    {{"pow"}, binary<Result::Same>([](auto a, auto b) { return power(a, b); }, true)},
    {{"equal"}, binary<Result::Bool>([](auto a, auto b) { return a == b; }, true)},
    {{"greater"}, binary<Result::Bool>([](auto a, auto b) { return a > b; }, true)},
    // unary ops' input gradients from (g, x) or (g, y), in the order of the reference's formulas;
    // relu_grad is g * (x > 0) as a product: an infinite or NaN g gives NaN where x <= 0
    {{"relu_grad"},
     binary<Result::Same>([](auto g, auto x) { return x > decltype(x)(0) ? g : g * decltype(g)(0); }, true)},
    {{"tanh_grad"}, binary<Result::Same>([](auto g, auto y) { return g * (decltype(y)(1) - y * y); }, false)},
    {{"sigmoid_grad"}, binary<Result::Same>([](auto g, auto y) { return g * (y * (decltype(y)(1) - y)); }, false)},
    {{"logical_and"}, binary<Result::Bool>([](auto a, auto b) { return bool(a) && bool(b); }, true)},
    {{"logical_or"}, binary<Result::Bool>([](auto a, auto b) { return bool(a) || bool(b); }, true)},
    {{"bitwise_and"}, binary<Result::Same>(int_bits([](auto a, auto b) { return a & b; }), true)},
    {{"bitwise_or"}, binary<Result::Same>(int_bits([](auto a, auto b) { return a | b; }), true)},
    {{"bitwise_xor"}, binary<Result::Same>(int_bits([](auto a, auto b) { return a ^ b; }), true)},
    // ONNX's rules: left shifts in unsigned arithmetic (no overflow); right shifts of signed values
    // sign-extend; a negative shift or one by the width or more leaves only the sign fill (C++
    // leaves those undefined)
    {{"bitshift_left"}, binary<Result::Same>(int_bits([](auto a, auto b) {
       using W = decltype(a);
       if (!shift_in_range(b)) return W(0);
       return W(std::make_unsigned_t<W>(a) << b);
     }), true)},
    {{"bitshift_right"}, binary<Result::Same>(int_bits([](auto a, auto b) {
       using W = decltype(a);
       if (!shift_in_range(b)) return W(a < 0 ? -1 : 0);
       return W(a >> b);
     }), true)},
};

// maximum with exactly two operands (NaN propagates, as np.maximum)
const RegisterKernel maximum_op{{"maximum"}, [](const OpInstr& ins, const std::vector<Buffer>& b) -> unique_ptr<Kernel> {
  if (ins.inputs.size() != 2) return nullptr;
  return binary<Result::Same>([](auto a, auto c) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(c)) return a + c;
    return a > c ? a : c;
  }, true)(ins, b);
}};

// ---- gelu gradients ---------------------------------------------------------------------------
// g * d/dx gelu(x), in float32 (float64 for float64), rounded once to x's dtype. When given,
// `given_row` computes float32 rows from the third input, gelu(x) (gelu_grad_row), and `x_row`
// float rows from x alone (float16's for gelu_grad, gelu_grad_row_of_x; all of geluerf_grad's):
// vectorised forms of `form`.
using GivenRow = void (*)(float*, const float*, const float*, const float*, int64_t);
using XRow = void (*)(float*, const float*, const float*, int64_t);

template <class Form>
KernelFactory gelu_grad(Form form, GivenRow given_row = nullptr, XRow x_row = nullptr) {
  return [form, given_row, x_row](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &g = bufs[ins.inputs[0]], &x = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    if (given_row && x.dtype == DType::F32 && ins.inputs.size() == 3) {
      const Buffer& gelu_x = bufs[ins.inputs[2]];
      return std::make_unique<FnKernel>([=](uint8_t* a) {
        map_rows<float, 3>(a, y, {g, x, gelu_x}, [&](float* out, const float* const* in, int64_t n) {
          given_row(out, in[0], in[1], in[2], n);
        });
      });
    }
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using W = typename Wide<typename decltype(tag)::type>::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        map_rows<W, 2>(a, y, {g, x}, [&](W* out, const W* const* in, int64_t n) {
          if constexpr (std::is_same_v<W, float>) {
            if (x_row) {
              x_row(out, in[0], in[1], n);
              return;
            }
          }
          for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] * form(in[1][i]);
        });
      });
    });
    return k;
  };
}

const RegisterKernel gelu_grad_ops[] = {
    {{"gelu_grad"}, gelu_grad([](auto x) { return gelu_slope(x); }, gelu_grad_row, gelu_grad_row_of_x)},
    {{"geluerf_grad"}, gelu_grad([](auto x) { return geluerf_slope(x); }, nullptr, geluerf_grad_row)},
};

}  // namespace
}  // namespace popxl
