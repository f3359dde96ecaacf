// Elementwise kernels beside the unary and binary families (elementwise_unary.cpp,
// elementwise_binary.cpp): where, cast and scaled_add. Float16 computes in float32, as the
// reference engine does. A factory returns nullptr for dtypes it does not cover; the engine then
// falls back.
#include <cmath>
#include <limits>
#include <type_traits>

#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- where, cast, scaled_add --------------------------------------------------------------
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
                     // the condition's bytes as bytes: any nonzero one is true, as NumPy reads a bool
                     const uint8_t* cond = p[1];
                     const T *xv = reinterpret_cast<const T*>(p[2]), *zv = reinterpret_cast<const T*>(p[3]);
                     for (int64_t i = 0; i < n; ++i) out[i] = select_bits(-int64_t(cond[i] != 0), xv[i], zv[i]);
                     return;
                   }
                   for (int64_t i = 0; i < n; ++i)
                     at<T>(p[0], i, s[0]) = at<uint8_t>(p[1], i, s[1]) != 0 ? at<T>(p[2], i, s[2]) : at<T>(p[3], i, s[3]);
                 }, true, {0, 1, int64_t(sizeof(T)), int64_t(sizeof(T))});
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
                   }, true, {0, int64_t(sizeof(F))});
      });
    });
  });
  return k;
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
    const bool a_t = ins.attr_is_none("a"), b_t = ins.attr_is_none("b");
    const double a_c = a_t ? 0 : ins.attr_float("a"), b_c = b_t ? 0 : ins.attr_float("b");
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
                   }, true, {0, int64_t(sizeof(T)), int64_t(sizeof(T))});
      });
    });
    return k;
  }};

}  // namespace
}  // namespace popxl
