// Scalar arithmetic the kernels share: integer arithmetic that wraps as NumPy's does, and a
// branch-free float32 exp (and the tanh-form gelu gate built on it) that GCC vectorises. Included
// by loops.hpp; no dependency on the engine's types.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace popxl {

// ---- integer arithmetic that wraps -----------------------------------------------------------
// Integer results wrap modulo 2**bits (two's complement), as NumPy's integer ops give; signed
// overflow is undefined behaviour in C++ (INT_MIN negated, INT_MAX + 1), so signed values are
// computed as unsigned ones. The unsigned type is at least unsigned int: narrower ones promote to
// (signed) int, where uint16 * uint16 can overflow. Floats and bool: the plain operation.
template <class W>
constexpr bool is_wrapping_int = std::is_integral_v<W> && !std::is_same_v<W, bool>;

template <class W>
using WrapUnsigned = std::conditional_t<(sizeof(W) < sizeof(unsigned)), unsigned, std::make_unsigned_t<W>>;

template <class W>
W wrap_add(W a, W b) {
  if constexpr (is_wrapping_int<W>) return static_cast<W>(WrapUnsigned<W>(a) + WrapUnsigned<W>(b));
  else return a + b;
}
template <class W>
W wrap_sub(W a, W b) {
  if constexpr (is_wrapping_int<W>) return static_cast<W>(WrapUnsigned<W>(a) - WrapUnsigned<W>(b));
  else return a - b;
}
template <class W>
W wrap_mul(W a, W b) {
  if constexpr (is_wrapping_int<W>) return static_cast<W>(WrapUnsigned<W>(a) * WrapUnsigned<W>(b));
  else return a * b;
}
template <class W>
W wrap_neg(W a) {
  if constexpr (is_wrapping_int<W>) return static_cast<W>(WrapUnsigned<W>(0) - WrapUnsigned<W>(a));
  else return -a;
}
// |a|, the most negative integer staying itself (as np.abs gives); |-0.0| is +0.0.
template <class W>
W wrap_abs(W a) {
  if constexpr (std::is_floating_point_v<W>) return std::fabs(a);
  else if constexpr (std::is_unsigned_v<W>) return a;
  else return a < W(0) ? wrap_neg(a) : a;
}

// Integer division, defined for every operand pair: b == 0 gives 0 (NumPy's result, with the
// warning it prints), and the most negative value divided by -1 wraps to itself (the one quotient
// that overflows; the CPU's divide instruction traps on it). `floor`: round toward -infinity
// (popxl's `div`), else toward zero (C, ONNX's Div).
template <class W>
W int_div(W a, W b, bool floor) {
  if (b == W(0)) return W(0);
  if constexpr (std::is_signed_v<W>) {
    if (b == W(-1)) return wrap_neg(a);
    W q = static_cast<W>(a / b);
    if (floor && static_cast<W>(a % b) != W(0) && ((a < W(0)) != (b < W(0)))) --q;
    return q;
  } else {
    return static_cast<W>(a / b);
  }
}
// The remainder of int_div toward zero (C's %, the sign of a): 0 when b is 0 or -1.
template <class W>
W int_rem(W a, W b) {
  if constexpr (std::is_signed_v<W>)
    if (b == W(-1)) return W(0);
  return b == W(0) ? W(0) : static_cast<W>(a % b);
}

// ---- vectorisable float32 exp, and the gate of tanh-form gelu -------------------------------------
// libm's expf/tanhf are scalar calls, which made gelu and its gradient the slowest kernels of an MLP
// step. The code below is branch-free and written so that GCC maps every select to one instruction
// (`a > b ? a : b` is exactly maxps, NaN included), so loops over contiguous rows vectorise tightly.

// a * b + c, one fused instruction where the CPU has FMA (the build otherwise keeps products and
// sums apart, -ffp-contract=off, for kernels that must round as the NumPy reference does).
__attribute__((always_inline)) inline float madd(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(z) within ~2 ulp for z in [kExpLo, kExpHi]; the caller clamps (2**n must stay a normal float).
constexpr float kExpLo = -87.0f, kExpHi = 88.0f;
__attribute__((always_inline)) inline float exp_in_range(float z) {
  // z = n ln2 + r with |r| <= ln2/2 (ln2 split in two parts so n ln2 is exact to float precision)
  const float n = __builtin_nearbyintf(z * 1.44269504088896341f);
  const float r = madd(n, 2.12194440e-4f, madd(n, -0.693359375f, z));
  float p = 1.9875691500e-4f;  // Cephes expf polynomial
  p = madd(p, r, 1.3981999507e-3f);
  p = madd(p, r, 8.3334519073e-3f);
  p = madd(p, r, 4.1665795894e-2f);
  p = madd(p, r, 1.6666665459e-1f);
  p = madd(p, r, 5.0000001201e-1f);
  p = madd(p, r * r, r + 1.0f);
  // times 2**n by adding n to the exponent field: p is in [0.7, 1.5] and n in [-126, 127]
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) * (1 << 23);
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

// exp(z) for softmax's z = x - max (<= 0, or NaN): in float, what the eight-lane form in
// vec_math.hpp computes lane by lane (underflow to exactly 0 below e**-87, NaN kept), so a row's
// tail and other axes agree with its vectorised body.
template <class W>
__attribute__((always_inline)) inline W softmax_exp(W z) {
  if constexpr (std::is_same_v<W, float>) {
    if (std::isnan(z)) return z;
    return z < kExpLo ? 0.0f : exp_in_range(z < 0.0f ? z : 0.0f);
  } else {
    return std::exp(z);
  }
}

// 0.5 * (1 + tanh(u)), the gate of tanh-form gelu (gelu(x) = x * gate), computed as the equal
// 1 / (1 + exp(-2u)): no cancellation in 1 + tanh(u) for u << 0. A NaN u gives a finite gate
// (the callers multiply by x, which carries the NaN); the gate is exactly 0 once exp(-2u) would
// exceed e**88, as the true value has underflowed by then.
template <class W>
__attribute__((always_inline)) inline W gelu_gate(W u) {
  if constexpr (std::is_same_v<W, float>) {
    float z = -2.0f * u;
    z = z > kExpLo ? z : kExpLo;  // maxps: NaN becomes kExpLo
    const bool tail = z >= kExpHi;
    z = z < kExpHi ? z : kExpHi;
    const float g = 1.0f / (1.0f + exp_in_range(z));
    return tail ? 0.0f : g;
  } else {
    return W(0.5) * (W(1) + std::tanh(u));
  }
}

}  // namespace popxl
