// pow2scale_cast_to_fp8 / pow2scale_cast_from_fp8 (the formats are described in fp8.hpp).
#include <cmath>

#include "fp8.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// to fp8: x * scale in float64, encoded. from fp8: decoded * scale in float64, rounded once.
KernelFactory fp8_cast(bool to_fp8) {
  return [to_fp8](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &s = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    const Buffer& f8 = to_fp8 ? y : x;
    const Buffer& other = to_fp8 ? x : y;
    if (!is_fp8(f8.dtype) || !is_numeric(other.dtype) || !is_int(s.dtype)) return nullptr;
    const Fp8Format& fmt = fp8_format(f8.dtype);
    auto px = std::make_shared<Packed>(x);
    auto py = std::make_shared<Packed>(y);
    return std::make_unique<FnKernel>([=, &fmt, op = ins.type](uint8_t* a) {
      const double scale = pow2_scale(a, s, op);
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
