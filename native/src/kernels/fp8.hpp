// The float8 formats float8_143 and float8_152: the "fnuz" formats (ml_dtypes float8_e4m3fnuz /
// float8_e5m2fnuz): no infinities, no negative zero, code 0x80 is NaN. Each format has 128
// magnitudes whose codes increase with the value, so encoding is a search in a table of them
// with ties going to the even code (round to nearest even).
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include "loops.hpp"

namespace popxl {

struct Fp8Format {
  std::array<double, 128> magnitude;  // value of codes 0..127
  Fp8Format(int mantissa_bits, int bias) {
    const int m_count = 1 << mantissa_bits;
    for (int c = 0; c < 128; ++c) {
      const int e = c >> mantissa_bits, m = c & (m_count - 1);
      magnitude[c] = e == 0 ? std::ldexp(double(m) / m_count, 1 - bias) : std::ldexp(1.0 + double(m) / m_count, e - bias);
    }
  }
  double decode(uint8_t code) const {
    if (code == 0x80) return NAN;
    return code & 0x80 ? -magnitude[code & 0x7F] : magnitude[code];
  }
  // Values beyond the largest magnitude become NaN (as the reference does before converting).
  uint8_t encode(double v) const {
    const double a = std::fabs(v);
    if (std::isnan(v) || a > magnitude[127]) return 0x80;
    const auto hi = std::lower_bound(magnitude.begin(), magnitude.end(), a);  // first >= a
    int code = static_cast<int>(hi - magnitude.begin());
    if (*hi != a) {  // between code-1 and code: the nearer, or the even one on a tie
      const double below = magnitude[code - 1], above = *hi;
      if (a - below < above - a || (a - below == above - a && (code - 1) % 2 == 0)) --code;
    }
    return code != 0 && v < 0 ? uint8_t(code | 0x80) : uint8_t(code);  // no negative zero
  }
  // A value's code as the reference's astype (ml_dtypes) rounds: through float32, then to the
  // nearest code with ties to even; NaN from half a step above the largest magnitude on.
  uint8_t round(double v) const {
    const double a = std::fabs(double(static_cast<float>(v)));
    const double top = magnitude[127], half_step = (top - magnitude[126]) / 2;
    if (a > top && a < top + half_step) return encode(v < 0 ? -top : top);
    return encode(double(static_cast<float>(v)));
  }
  template <class T>
  void decode_row(const uint8_t* codes, T* out, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) out[i] = T(decode(codes[i]));
  }
  template <class T>
  void round_row(const T* v, uint8_t* codes, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) codes[i] = round(double(v[i]));
  }
};

inline const Fp8Format& fp8_format(DType d) {
  static const Fp8Format f143(3, 8), f152(2, 16);
  return d == DType::F8_143 ? f143 : f152;
}

inline bool is_fp8(DType d) { return d == DType::F8_143 || d == DType::F8_152; }

// The scale 2**log2_scale from a scalar int32 tensor, checked as the reference checks it; errors
// name the op (`op`).
inline double pow2_scale(const uint8_t* arena, const Buffer& s, const std::string& op) {
  const int64_t v = load_scalar<int64_t>(arena, s);
  if (v < -32 || v >= 32)
    throw std::invalid_argument(op + ": log2_scale must be in [-32, 32), got " + std::to_string(v));
  return std::ldexp(1.0, static_cast<int>(v));
}

}  // namespace popxl
