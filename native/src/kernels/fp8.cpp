// pow2scale_cast_to_fp8 / pow2scale_cast_from_fp8: float8_143 and float8_152 are the "fnuz"
// formats (ml_dtypes float8_e4m3fnuz / float8_e5m2fnuz): no infinities, no negative zero, code
// 0x80 is NaN. Each format has 128 magnitudes whose codes increase with the value, so encoding
// is a search in a table of them with ties going to the even code (round to nearest even).
#include <cmath>

#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

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
};

const Fp8Format& format(DType d) {
  static const Fp8Format f143(3, 8), f152(2, 16);
  return d == DType::F8_143 ? f143 : f152;
}

bool is_fp8(DType d) { return d == DType::F8_143 || d == DType::F8_152; }

// The scale 2**log2_scale from a scalar int32 tensor, checked as the reference checks it.
double pow2_scale(const uint8_t* arena, const Buffer& s) {
  const int64_t v = load_scalar<int64_t>(arena, s);
  if (v < -32 || v >= 32)
    throw std::invalid_argument("log2_scale must be in [-32, 32), got " + std::to_string(v));
  return std::ldexp(1.0, static_cast<int>(v));
}

// to fp8: x * scale in float64, encoded. from fp8: decoded * scale in float64, rounded once.
KernelFactory fp8_cast(bool to_fp8) {
  return [to_fp8](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &s = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    const Buffer& f8 = to_fp8 ? y : x;
    const Buffer& other = to_fp8 ? x : y;
    if (!is_fp8(f8.dtype) || !is_numeric(other.dtype) || !is_int(s.dtype)) return nullptr;
    const Fp8Format& fmt = format(f8.dtype);
    auto px = std::make_shared<Packed>(x);
    auto py = std::make_shared<Packed>(y);
    return std::make_unique<FnKernel>([=, &fmt](uint8_t* a) {
      const double scale = pow2_scale(a, s);
      const uint8_t* in = px->read(a);
      uint8_t* out = py->write(a);
      std::vector<double> v(x.nelms);
      if (to_fp8) {
        load_row<double>(in, static_cast<int64_t>(itemsize(x.dtype)), x.dtype, v.data(), x.nelms);
        for (int64_t i = 0; i < x.nelms; ++i) out[i] = fmt.encode(v[i] * scale);
      } else {
        for (int64_t i = 0; i < x.nelms; ++i) v[i] = fmt.decode(in[i]) * scale;
        store_row<double>(out, static_cast<int64_t>(itemsize(y.dtype)), y.dtype, v.data(), y.nelms);
      }
      py->commit(a);
    });
  };
}

const RegisterKernel fp8_ops[] = {
    {{"pow2scale_cast_to_fp8"}, fp8_cast(true)},
    {{"pow2scale_cast_from_fp8"}, fp8_cast(false)},
};

}  // namespace
}  // namespace popxl
