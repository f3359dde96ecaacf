// Random ops keyed by a uint32[2] seed: random_uniform, random_normal, dropout, shaped_dropout
// and split_random_seed. popxl/ops/random.py is the bit recipe (Philox4x32-10, one word stream
// per op kind); these kernels reproduce it bit for bit, so both engines draw the same numbers.
#include <cmath>
#include <memory>

#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

enum Purpose : uint32_t { kUniform = 0, kNormal = 1, kDropout = 2, kShapedDropout = 3, kSplit = 4 };

struct Key { uint32_t k0, k1; };

// Philox4x32-10 on one counter, in place.
inline void philox(uint32_t c[4], Key key) {
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c[1] ^ k0, n2 = uint32_t(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = uint32_t(p1);
    c[2] = n2;
    c[3] = uint32_t(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// The four words of block j of a purpose's word stream.
inline void block(uint64_t j, uint32_t purpose, Key key, uint32_t w[4]) {
  w[0] = uint32_t(j);
  w[1] = uint32_t(j >> 32);
  w[2] = purpose;
  w[3] = 0;
  philox(w, key);
}

Key read_seed(const uint8_t* arena, const Buffer& seed) {
  uint32_t w[2];
  for (int e = 0; e < 2; ++e) std::memcpy(&w[e], arena + seed.offset + e * seed.strides[0], 4);
  return {w[0], w[1]};
}

bool seed_ok(const Buffer& b) { return b.dtype == DType::U32 && b.shape.size() == 1 && b.shape[0] == 2; }

// Element i of an n-element draw takes `per` consecutive words starting at word i*per; blocks
// hold 4 words, so each block covers 4/per elements. Blocks are independent: spread them over
// threads. fill(i, words) receives the words of element i.
template <int per, class F>
void draw(int64_t n, uint32_t purpose, Key key, F&& fill) {
  constexpr int64_t per_block = 4 / per;
  const int64_t blocks = (n + per_block - 1) / per_block;
  threads::for_each(blocks, [&](int64_t j) {
    uint32_t w[4];
    block(static_cast<uint64_t>(j), purpose, key, w);
    for (int64_t e = 0; e < per_block && j * per_block + e < n; ++e) fill(j * per_block + e, w + e * per);
  }, n > 16384);
}

// Run `write(T* packed)` on y's storage, through a packed scratch when y is strided.
template <class T, class F>
void write_packed(uint8_t* arena, const Buffer& y, std::vector<uint8_t>& scratch, F&& write) {
  if (y.contiguous) {
    write(reinterpret_cast<T*>(arena + y.offset));
    return;
  }
  scratch.resize(y.nbytes());
  write(reinterpret_cast<T*>(scratch.data()));
  copy_buffer(arena, y, scratch.data(), packed_like(y));
}

template <class F>
bool dispatch_f16_f32(DType d, F&& f) {
  if (d == DType::F32) { f(Tag<float>{}); return true; }
  if (d == DType::F16) { f(Tag<f16>{}); return true; }
  return false;
}

// ---- random_uniform / random_normal -----------------------------------------------------------
// Element i takes `per` words; `make_value(instruction)` gives the function from those words to the
// value (float32 or float64), which is rounded once to the output dtype.
template <int per, class MakeValue>
KernelFactory draw_kernel(uint32_t purpose, MakeValue make_value) {
  return [=](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer seed = bufs[ins.inputs[0]], y = bufs[ins.outputs[0]];
    if (!seed_ok(seed)) return nullptr;
    const auto value = make_value(ins);
    unique_ptr<Kernel> k;
    dispatch_f16_f32(y.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto scratch = std::make_shared<std::vector<uint8_t>>();
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const Key key = read_seed(a, seed);
        write_packed<T>(a, y, *scratch, [&](T* out) {
          draw<per>(y.nelms, purpose, key, [&](int64_t i, const uint32_t* w) { out[i] = T(value(w)); });
        });
      });
    });
    return k;
  };
}

const RegisterKernel draw_ops[] = {
    {{"random_uniform"}, draw_kernel<1>(kUniform, [](const OpInstr& at) {
       const float lo = float(at.attr_float("low")), hi = float(at.attr_float("high"));
       return [lo, hi](const uint32_t* w) {
         const float u = float(w[0] >> 8) * 0x1p-24f;  // exact, in [0, 1)
         return lo + (hi - lo) * u;
       };
     })},
    {{"random_normal"}, draw_kernel<2>(kNormal, [](const OpInstr& at) {
       const double mean = at.attr_float("mean"), stdev = at.attr_float("std");
       return [mean, stdev](const uint32_t* w) {  // Box-Muller in float64
         const double u1 = (double(w[0] >> 8) + 1.0) * 0x1p-24;  // (0, 1]: log never sees 0
         const double u2 = double(w[1] >> 8) * 0x1p-24;
         return mean + stdev * (std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
       };
     })},
};

// ---- dropout / shaped_dropout -----------------------------------------------------------------
// The keep mask (over the mask shape, C order) is drawn first, then applied to x broadcast.
KernelFactory dropout(bool shaped) {
  return [shaped](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = bufs[ins.inputs[0]], seed = bufs[ins.inputs[1]], y = bufs[ins.outputs[0]];
    if (!seed_ok(seed) || x.dtype != y.dtype) return nullptr;
    const double p = ins.attr_float(shaped ? "ratio" : "p");
    const std::vector<int64_t> mshape = shaped ? ins.attr_ints("shape") : x.shape;
    Buffer mask;  // the mask as a packed bool buffer, for broadcasting
    mask.shape = mshape;
    mask.dtype = DType::Bool;
    mask.strides = packed_strides(mshape, 1);
    for (auto d : mshape) mask.nelms *= d;
    const auto ms = broadcast_strides(mask, y.shape);
    const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 0x1p24));
    const float scale = float(1.0 / (1.0 - p));
    const uint32_t purpose = shaped ? kShapedDropout : kDropout;
    unique_ptr<Kernel> k;
    dispatch_f16_f32(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto keep = std::make_shared<std::vector<uint8_t>>(mask.nelms);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        uint8_t* kp = keep->data();
        draw<1>(mask.nelms, purpose, read_seed(a, seed), [&](int64_t i, const uint32_t* w) { kp[i] = (w[0] >> 8) >= threshold; });
        nd_loop<3>(y.shape, {y.strides, x.strides, ms}, {a + y.offset, a + x.offset, kp},
                   [&](const std::array<uint8_t*, 3>& q, const std::array<int64_t, 3>& s, int64_t n) {
                     for (int64_t i = 0; i < n; ++i)
                       at<T>(q[0], i, s[0]) = at<uint8_t>(q[2], i, s[2]) ? T(float(at<T>(q[1], i, s[1])) * scale) : T(0.0f);
                   });
      });
    });
    return k;
  };
}

const RegisterKernel dropout_ops[] = {
    {{"dropout"}, dropout(false)},
    {{"shaped_dropout"}, dropout(true)},
};

// ---- split_random_seed: seed k is words 0 and 1 of block k of the split stream ------------------
const RegisterKernel split_seed_op{{"split_random_seed"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer seed = bufs[ins.inputs[0]];
  std::vector<Buffer> outs;
  for (int o : ins.outputs) outs.push_back(bufs[o]);
  if (!seed_ok(seed)) return nullptr;
  for (auto& o : outs)
    if (!seed_ok(o)) return nullptr;
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    const Key key = read_seed(a, seed);  // read before any output (which may alias it) is written
    std::vector<std::array<uint32_t, 4>> words(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) block(i, kSplit, key, words[i].data());
    for (size_t i = 0; i < outs.size(); ++i)
      for (int e = 0; e < 2; ++e) at<uint32_t>(a + outs[i].offset, e, outs[i].strides[0]) = words[i][e];
  });
}};

}  // namespace
}  // namespace popxl
