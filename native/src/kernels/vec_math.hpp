// Rows of float32 exp-based functions eight values at a time (AVX2 + FMA builds), for the kernels
// that are mostly transcendental work: tanh-form gelu and its gradient, softmax's exponentials.
//
// GCC does vectorise the scalar forms in loops.hpp, but turns their clamps and tail selects into
// long compare-and-blend chains (~45 instructions per eight values for gelu); written with
// intrinsics the same operations take ~25. Each function computes exactly what its scalar form
// computes, operation for operation (same constants, same fused multiply-adds), so results are
// bit-identical whichever path a value takes: the scalar form handles row tails and builds
// without AVX2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "loops.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define POPXL_VEC8 1
#endif

namespace popxl {

constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluCubic = 0.044715, kInvSqrt2 = 0.7071067811865476;

// max / min with NaN winning (as NumPy's): whether v takes the place of `best`, and (float32) the
// same on eight lanes at once.
template <bool kMax, class T>
bool more_extreme(T v, T best) { return (kMax ? v > best : v < best) || v != v; }
#ifdef POPXL_VEC8
template <bool kMax>
__m256 extreme_lanes(__m256 best, __m256 v) {
  const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, best, kMax ? _CMP_GT_OQ : _CMP_LT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_ps(best, v, take);
}
#endif

// tanh-form gelu of one value and its derivative, in the compute type W (the scalar forms the
// float32 vector code mirrors).
template <class W>
W gelu_value(W x) {
  return x * gelu_gate(W(kSqrt2OverPi) * (x + W(kGeluCubic) * x * x * x));
}
// gelu'(x) from x and its gate g = 0.5 (1 + tanh(u)): with t = tanh(u), 0.5 (1 + t) = g and
// 0.5 (1 - t^2) = 2 g (1 - g).
template <class W>
W gelu_slope_of_gate(W x, W g) {
  return g + W(2) * x * g * (W(1) - g) * W(kSqrt2OverPi) * (W(1) + W(3 * kGeluCubic) * x * x);
}
template <class W>
W gelu_slope(W x) {
  return gelu_slope_of_gate(x, gelu_gate(W(kSqrt2OverPi) * (x + W(kGeluCubic) * x * x * x)));
}

// Below this |x| the gate is taken as 0.5 + 0.5 sqrt(2/pi) x (its next term is ~x^3, far below a
// float's precision there) rather than as gelu(x) / x, which loses digits once gelu(x) is subnormal.
constexpr float kGeluTinyArg = 9.5367431640625e-07f;  // 2**-20

// gelu'(x) given y = gelu(x) = x * gate: the gate is y / x, so no exponential is needed.
inline float gelu_slope_given(float x, float y) {
  const float gate = std::fabs(x) < kGeluTinyArg ? madd(float(0.5 * kSqrt2OverPi), x, 0.5f) : y / x;
  return gelu_slope_of_gate(x, gate);
}

#ifdef POPXL_VEC8
namespace vec8 {

inline __m256 set(float v) { return _mm256_set1_ps(v); }

// exp_in_range (loops.hpp) of eight values already clamped to [kExpLo, kExpHi].
inline __m256 exp_in_range(__m256 z) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, set(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fmadd_ps(n, set(2.12194440e-4f), _mm256_fmadd_ps(n, set(-0.693359375f), z));
  __m256 p = set(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, set(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, set(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, set(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, set(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, set(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set(1.0f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), scale));
}

// gelu_gate (loops.hpp): 1 / (1 + exp(-2u)), exactly 0 where exp(-2u) would pass e**88.
inline __m256 gelu_gate(__m256 u) {
  __m256 z = _mm256_max_ps(_mm256_mul_ps(set(-2.0f), u), set(kExpLo));  // maxps: NaN becomes kExpLo
  const __m256 tail = _mm256_cmp_ps(z, set(kExpHi), _CMP_GE_OQ);
  z = _mm256_min_ps(z, set(kExpHi));
  const __m256 g = _mm256_div_ps(set(1.0f), _mm256_add_ps(set(1.0f), exp_in_range(z)));
  return _mm256_andnot_ps(tail, g);
}

inline __m256 gelu_inner(__m256 x) {  // sqrt(2/pi) (x + 0.044715 x^3), multiplied in the scalar order
  const __m256 cubic = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(set(float(kGeluCubic)), x), x), x);
  return _mm256_mul_ps(set(float(kSqrt2OverPi)), _mm256_add_ps(x, cubic));
}

// softmax_exp (loops.hpp) of eight values z = x - max <= 0 (or NaN).
inline __m256 softmax_exp(__m256 z) {
  __m256 e = exp_in_range(_mm256_min_ps(_mm256_max_ps(z, set(kExpLo)), set(0.0f)));
  e = _mm256_andnot_ps(_mm256_cmp_ps(z, set(kExpLo), _CMP_LT_OQ), e);  // underflow to 0
  return _mm256_blendv_ps(e, z, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));      // inf - inf stays NaN
}

// The eight lanes of v added in double, in lane order.
inline double hsum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  double t = 0;
  for (float f : lanes) t += f;
  return t;
}

}  // namespace vec8
#endif

// sqrt of a dense float32 row: vsqrtps is correctly rounded, as std::sqrt (NaN below zero); the
// scalar call is not vectorised, since it may set errno.
inline void sqrt_row(float* y, const float* x, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_VEC8
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = std::sqrt(x[i]);
}

// softmax of one dense float32 row: y = exp(x - max) / sum. NaN anywhere gives a NaN row and
// exp underflows to 0 below e**-87 (softmax_exp, the tail's form).
inline void softmax_row(float* y, const float* x, int64_t n) {
  if (n == 0) return;
  int64_t i = 0;
  float m = x[0];
  bool nan = false;
#ifdef POPXL_VEC8
  __m256 m8 = _mm256_set1_ps(-INFINITY), nan8 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m8 = _mm256_max_ps(m8, v);
    nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  for (float v : lanes) m = v > m ? v : m;  // NaN lanes are caught by nan8
  nan = _mm256_movemask_ps(nan8) != 0;
#endif
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || std::isnan(x[i]);
  }
  if (nan) {
    std::fill(y, y + n, NAN);
    return;
  }
  // With m = +inf, x - m is NaN for x = +inf and -inf elsewhere: the reference's NaN / 0 pattern.
  double total = 0;
  i = 0;
#ifdef POPXL_VEC8
  const __m256 shift = _mm256_set1_ps(m);
  __m256 sum8 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = vec8::softmax_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(y + i, e);
    sum8 = _mm256_add_ps(sum8, e);
    if ((i & 1023) == 1016) {  // float lanes over blocks of 1024 values, blocks summed in double
      total += vec8::hsum(sum8);
      sum8 = _mm256_setzero_ps();
    }
  }
  total += vec8::hsum(sum8);
#endif
  for (; i < n; ++i) {
    y[i] = softmax_exp(x[i] - m);
    total += y[i];
  }
  const float scale = float(1.0 / total);
  for (i = 0; i < n; ++i) y[i] *= scale;
}

// ---- rows of normalisations (float32) --------------------------------------------------------------
// Sums run in eight float lanes, flushed into a double every 1024 values: as exact as lane_sum.
// Sum over n values of x, or of (x - m)^2 when `squares`.
inline double row_sum(const float* x, int64_t n, bool squares = false, float m = 0) {
  double total = 0;
  int64_t i = 0;
#ifdef POPXL_VEC8
  const __m256 mv = _mm256_set1_ps(m);
  while (i + 8 <= n) {
    const int64_t end = std::min(n, i + 1024) / 8 * 8;
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= end; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      if (squares) {
        const __m256 d = _mm256_sub_ps(v, mv);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
      } else {
        acc = _mm256_add_ps(acc, v);
      }
    }
    total += vec8::hsum(acc);
  }
#endif
  for (; i < n; ++i) total += squares ? double((x[i] - m) * (x[i] - m)) : double(x[i]);
  return total;
}

// Mean and 1 / sqrt(biased variance + eps) of n values (two passes, as the reference).
inline std::pair<float, float> row_moments(const float* x, int64_t n, double eps) {
  const float m = float(row_sum(x, n) / double(n));
  const float var = float(row_sum(x, n, true, m) / double(n));
  return {m, float(1.0 / std::sqrt(double(var) + double(float(eps))))};
}

// One row of a layer norm's gradient with one weight per value: with h = (x - m) r and
// d = dy w, dx = (d - mean(d) - h mean(d h)) r; dw += dy h and db += dy (float partial sums
// the caller flushes).
inline void layer_norm_grad_row(const float* x, const float* dy, const float* w, float* dx, float* dw, float* db,
                                int64_t n, float m, float r) {
  if (n == 0) return;
  double sd = 0, sdh = 0;
  int64_t i = 0;
#ifdef POPXL_VEC8
  const __m256 mv = _mm256_set1_ps(m), rv = _mm256_set1_ps(r);
  while (i + 8 <= n) {
    const int64_t end = std::min(n, i + 1024) / 8 * 8;
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (; i + 8 <= end; i += 8) {
      const __m256 h = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), rv);
      const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(w + i));
      a = _mm256_add_ps(a, d);
      b = _mm256_add_ps(b, _mm256_mul_ps(d, h));
    }
    sd += vec8::hsum(a);
    sdh += vec8::hsum(b);
  }
#endif
  for (; i < n; ++i) {
    const float h = (x[i] - m) * r, d = dy[i] * w[i];
    sd += d;
    sdh += d * h;
  }
  const float mean_d = float(sd / double(n)), mean_dh = float(sdh / double(n));
  i = 0;
#ifdef POPXL_VEC8
  const __m256 md = _mm256_set1_ps(mean_d), mdh = _mm256_set1_ps(mean_dh);
  for (; i + 8 <= n; i += 8) {
    const __m256 h = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), rv);
    const __m256 g = _mm256_loadu_ps(dy + i);
    const __m256 d = _mm256_mul_ps(g, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(d, md), _mm256_mul_ps(h, mdh)), rv));
    _mm256_storeu_ps(dw + i, _mm256_add_ps(_mm256_loadu_ps(dw + i), _mm256_mul_ps(g, h)));
    _mm256_storeu_ps(db + i, _mm256_add_ps(_mm256_loadu_ps(db + i), g));
  }
#endif
  for (; i < n; ++i) {
    const float h = (x[i] - m) * r, d = dy[i] * w[i];
    dx[i] = (d - mean_d - h * mean_dh) * r;
    dw[i] += dy[i] * h;
    db[i] += dy[i];
  }
}

// y = gelu(x) over n dense values.
inline void gelu_row(float* y, const float* x, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_VEC8
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, vec8::gelu_gate(vec8::gelu_inner(v))));
  }
#endif
  for (; i < n; ++i) y[i] = gelu_value(x[i]);
}

#ifdef POPXL_VEC8
namespace vec8 {
// gelu_slope_of_gate of eight values, left to right as the scalar form multiplies.
inline __m256 gelu_slope_of_gate(__m256 x, __m256 gate) {
  __m256 t = _mm256_mul_ps(_mm256_mul_ps(set(2.0f), x), gate);
  t = _mm256_mul_ps(_mm256_mul_ps(t, _mm256_sub_ps(set(1.0f), gate)), set(float(kSqrt2OverPi)));
  t = _mm256_mul_ps(t, _mm256_add_ps(set(1.0f), _mm256_mul_ps(_mm256_mul_ps(set(float(3 * kGeluCubic)), x), x)));
  return _mm256_add_ps(gate, t);
}
}  // namespace vec8
#endif

// out = g * gelu'(x) over n dense values, given y = gelu(x) (gelu_slope_given).
inline void gelu_grad_row(float* out, const float* g, const float* x, const float* y, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_VEC8
  using namespace vec8;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(set(-0.0f), v), set(kGeluTinyArg), _CMP_LT_OQ);
    const __m256 gate = _mm256_blendv_ps(_mm256_div_ps(_mm256_loadu_ps(y + i), v),
                                         _mm256_fmadd_ps(set(float(0.5 * kSqrt2OverPi)), v, set(0.5f)), tiny);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), vec8::gelu_slope_of_gate(v, gate)));
  }
#endif
  for (; i < n; ++i) out[i] = g[i] * gelu_slope_given(x[i], y[i]);
}

// out = g * gelu'(x) over n dense values from x alone (gelu_slope: the gate through exp), for the
// float rows of float16, whose gelu(x) is too coarse to give the gate.
inline void gelu_grad_row_of_x(float* out, const float* g, const float* x, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_VEC8
  using namespace vec8;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 gate = vec8::gelu_gate(gelu_inner(v));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), vec8::gelu_slope_of_gate(v, gate)));
  }
#endif
  for (; i < n; ++i) out[i] = g[i] * gelu_slope(x[i]);
}

// ---- libm functions eight values at a time (glibc's libmvec) --------------------------------------
// The functions behind the ops whose work is libm calls per value (unary ops, and geluerf_grad's
// slope): a float32 (or float16's float) value goes through libm8<F>, in dense rows and one at a
// time alike, so its result does not depend on the path it takes; float64 uses the scalar libm.
enum class Libm { Exp, Log, Log2, Tanh, Sin, Cos, Sigmoid, Swish, GeluErf, GeluErfSlope };

constexpr double kSqrt2 = 1.4142135623730951, kSqrt2Pi = 2.5066282746310002;

// d/dx of erf-form gelu: 0.5 (1 + erf(x / sqrt 2)) + x e^(-x^2 / 2) / sqrt(2 pi), in the compute
// type W (the scalar form libm8<GeluErfSlope> mirrors).
template <class W>
W geluerf_slope(W x) {
  const W cdf = W(0.5) * (W(1) + std::erf(x / W(kSqrt2)));
  return cdf + x * std::exp(W(-0.5) * x * x) / W(kSqrt2Pi);
}

#if defined(POPXL_VEC8) && defined(POPXL_HAVE_LIBMVEC)
// glibc's AVX2 forms (expf, logf, sinf, cosf since glibc 2.22; tanhf, erff, log2f since 2.35; CMake
// defines POPXL_HAVE_LIBMVEC when the build machine's libmvec has them all): within 1-4 ulp of
// the scalar libm over all floats, with the same NaN, infinity and underflow results, and 8-16x
// faster than it value by value.
extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_log2f(__m256);
__m256 _ZGVdN8v_tanhf(__m256);
__m256 _ZGVdN8v_sinf(__m256);
__m256 _ZGVdN8v_cosf(__m256);
__m256 _ZGVdN8v_erff(__m256);
}
#define POPXL_LIBM8 1

template <Libm F>
__m256 libm8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  if constexpr (F == Libm::Exp) return _ZGVdN8v_expf(x);
  if constexpr (F == Libm::Log) return _ZGVdN8v_logf(x);
  if constexpr (F == Libm::Log2) return _ZGVdN8v_log2f(x);
  if constexpr (F == Libm::Tanh) return _ZGVdN8v_tanhf(x);
  if constexpr (F == Libm::Sin) return _ZGVdN8v_sinf(x);
  if constexpr (F == Libm::Cos) return _ZGVdN8v_cosf(x);
  // the ops' scalar forms, operation for operation: 1 / (1 + e^-x), x / (1 + e^-x),
  // 0.5 x (1 + erf(x / sqrt 2)) and geluerf_slope
  if constexpr (F == Libm::Sigmoid || F == Libm::Swish) {
    const __m256 e = _mm256_add_ps(one, _ZGVdN8v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x)));
    return _mm256_div_ps(F == Libm::Sigmoid ? one : x, e);
  }
  if constexpr (F == Libm::GeluErf) {
    const __m256 erf = _ZGVdN8v_erff(_mm256_mul_ps(x, _mm256_set1_ps(float(kInvSqrt2))));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(one, erf));
  }
  if constexpr (F == Libm::GeluErfSlope) {
    const __m256 erf = _ZGVdN8v_erff(_mm256_div_ps(x, _mm256_set1_ps(float(kSqrt2))));
    const __m256 cdf = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_add_ps(one, erf));
    const __m256 bell = _ZGVdN8v_expf(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-0.5f), x), x));
    return _mm256_add_ps(cdf, _mm256_div_ps(_mm256_mul_ps(x, bell), _mm256_set1_ps(float(kSqrt2Pi))));
  }
}

// y = F(x) over n dense values; the tail goes through F as a zero-padded block of eight.
template <Libm F>
void libm_row(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, libm8<F>(_mm256_loadu_ps(x + i)));
  if (i == n) return;
  alignas(32) float block[8] = {};
  std::copy(x + i, x + n, block);
  _mm256_store_ps(block, libm8<F>(_mm256_load_ps(block)));
  std::copy(block, block + (n - i), y + i);
}

// F of one value, as libm_row computes it.
template <Libm F>
float libm_one(float x) {
  return _mm256_cvtss_f32(libm8<F>(_mm256_set1_ps(x)));
}
#endif

// out = g * geluerf_slope(x) over n dense values (out may be g).
inline void geluerf_grad_row(float* out, const float* g, const float* x, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_LIBM8
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), libm8<Libm::GeluErfSlope>(_mm256_loadu_ps(x + i))));
  for (; i < n; ++i) out[i] = g[i] * libm_one<Libm::GeluErfSlope>(x[i]);
#else
  for (; i < n; ++i) out[i] = g[i] * geluerf_slope(x[i]);
#endif
}

}  // namespace popxl
