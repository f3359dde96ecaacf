// popxl-addons' custom ops that are kernels of their own (popxl/ops/addons/): rotary position
// embeddings and their gradient, the local pieces of the sharded cross entropy (a shard's softmax
// denominators, its negative log softmax and picked losses, and the logits' gradient), and the
// float8 scaling-bias search. The other addons ops run as other ops (OpDef.expand), and the sharded
// cross entropy's combination across replicas is replicated_all_reduce's.
//
// Compute type W is float32 for float16 and the dtype itself otherwise, as in the reference.
// Rotary embeddings and the scaling-bias search follow the reference's operations one for one
// (bit-identical results); the cross entropy pieces round through the stored type where the
// reference does, use the engine's exp (within 2 ulp, underflowing to 0 below e**-87) and sum
// the denominators in double, so they agree with the reference to rounding.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// Byte stride of axis `i` of `b` as seen broadcast: 0 along an axis of size 1.
int64_t bstride(const Buffer& b, size_t i) { return b.shape[i] == 1 ? 0 : b.strides[i]; }

// A value of compute type W rounded through the stored type T (as the reference rounds each
// operation's result of a float16 tensor).
template <class T, class W>
W through(W v) {
  return W(T(v));
}

// ---- rotary_pos_embed / rotary_pos_embed_grad ----------------------------------------------------
// x (batch, seq, heads, head) with each pair of the first rotary_dim values of a head turned by the
// angle of its (batch, seq) position: by +angle forward, -angle for the gradient. Pair p is
// (x[2p], x[2p+1]) "interleaved" or (x[p], x[p + rotary_dim/2]) "halves".
KernelFactory rotary(float direction) {
  return [direction](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer x = bufs[ins.inputs[0]], sn = bufs[ins.inputs[1]], cs = bufs[ins.inputs[2]], y = bufs[ins.outputs[0]];
    const int64_t pairs = ins.attr_int("rotary_dim") / 2;
    const bool halves = ins.attr_str("pairing") == "halves";
    // where the real and imaginary parts of pair p sit in a head: re_step * p + im_at (+ 0 for re)
    const int64_t re_step = halves ? 1 : 2, im_at = halves ? pairs : 1;
    if (x.shape.size() != 4 || sn.shape.size() != 3 || cs.shape.size() != 3)
      throw std::logic_error(ins.type + " '" + ins.name + "': expects a rank-4 input and rank-3 tables");
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using W = typename Wide<typename decltype(tag)::type>::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
        threads::region([&](int id, int team) {
          std::vector<W> row(D), s(pairs), c(pairs);
          for (int64_t bt : threads::share(B * S, id, team)) {
            const int64_t b = bt / S, t = bt % S;
            load_row<W>(a + sn.offset + b * bstride(sn, 0) + t * bstride(sn, 1), bstride(sn, 2), sn.dtype, s.data(), pairs);
            load_row<W>(a + cs.offset + b * bstride(cs, 0) + t * bstride(cs, 1), bstride(cs, 2), cs.dtype, c.data(), pairs);
            for (W& v : s) v = W(direction) * v;
            for (int64_t h = 0; h < H; ++h) {
              const int64_t xo = x.offset + b * x.strides[0] + t * x.strides[1] + h * x.strides[2];
              load_row<W>(a + xo, x.strides[3], x.dtype, row.data(), D);
              for (int64_t p = 0; p < pairs; ++p) {
                const int64_t at = re_step * p;
                const W re = row[at], im = row[at + im_at];
                row[at] = re * c[p] - im * s[p];
                row[at + im_at] = im * c[p] + re * s[p];
              }
              store_row<W>(a + y.offset + b * y.strides[0] + t * y.strides[1] + h * y.strides[2], y.strides[3], y.dtype,
                           row.data(), D);
            }
          }
        }, B * S > 1 && B * S * H * D > kParallelElements);
      });
    });
    return k;
  };
}

const RegisterKernel rotary_ops[] = {
    {{"rotary_pos_embed"}, rotary(1.0f)},
    {{"rotary_pos_embed_grad"}, rotary(-1.0f)},
};

// ---- sharded cross entropy ----------------------------------------------------------------------
// exp of a row of z, into y: the engine's softmax exponential where z <= 0 (as it is when the pieces
// get the row maxima and their own nls), std::exp above (the ops also run on other inputs).
template <class W>
void exp_row(W* y, const W* z, int64_t n) {
  int64_t i = 0;
#ifdef POPXL_VEC8
  if constexpr (std::is_same_v<W, float>)
    for (; i + 8 <= n; i += 8) {
      const __m256 z8 = _mm256_loadu_ps(z + i);
      if (_mm256_movemask_ps(_mm256_cmp_ps(z8, _mm256_setzero_ps(), _CMP_GT_OQ))) break;  // finish in scalar
      _mm256_storeu_ps(y + i, vec8::softmax_exp(z8));
    }
#endif
  for (; i < n; ++i) y[i] = z[i] > W(0) ? std::exp(z[i]) : softmax_exp(z[i]);
}

// The common frame of the three pieces: (n, c) rows processed in compute type W on all threads,
// `body(i, row, scratch)` for row i loaded from the (n, c) input `rows` (null: none).
template <class W, class Body>
void for_rows(uint8_t* a, const Buffer& rows, int64_t n, int64_t c, Body body) {
  threads::region([&](int id, int team) {
    std::vector<W> row(c), scratch(c);
    for (int64_t i : threads::share(n, id, team)) {
      load_row<W>(a + rows.offset + i * rows.strides[0], rows.strides[1], rows.dtype, row.data(), c);
      body(i, row.data(), scratch.data());
    }
  }, n > 1 && n * c > kParallelElements);
}

template <class W>
W load_at(const uint8_t* a, const Buffer& v, int64_t i) {
  W out;
  load_row<W>(a + v.offset + i * v.strides[0], 0, v.dtype, &out, 1);
  return out;
}

template <class W>
void store_at(uint8_t* a, const Buffer& v, int64_t i, W value) {
  store_row<W>(a + v.offset + i * v.strides[0], 0, v.dtype, &value, 1);
}

// The label of row i when it lies in [0, c), else -1.
int64_t label(const uint8_t* a, const Buffer& indices, int64_t i, int64_t c) {
  const int64_t j = load_at<int64_t>(a, indices, i);
  if (indices.dtype == DType::U64 && j < 0) return -1;  // beyond int64: out of range
  return j >= 0 && j < c ? j : -1;
}

// Which piece a kernel computes.
enum class CePiece { Denominator, Nll, Grad };

KernelFactory cross_entropy(CePiece piece) {
  return [piece](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    std::vector<Buffer> in, out;
    for (int i : ins.inputs) in.push_back(bufs[i]);
    for (int o : ins.outputs) out.push_back(bufs[o]);
    const Buffer& big = piece == CePiece::Grad ? in[1] : in[0];  // the (n, c) operand
    if (big.shape.size() != 2) throw std::logic_error(ins.type + " '" + ins.name + "': expects (n, c) values");
    const int64_t n = big.shape[0], c = big.shape[1];
    unique_ptr<Kernel> k;
    dispatch_float(big.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        if (piece == CePiece::Denominator) {  // sum_j exp(x_ij - m_i)
          for_rows<W>(a, in[0], n, c, [&](int64_t i, W* x, W* e) {
            const W m = load_at<W>(a, in[1], i);
            for (int64_t j = 0; j < c; ++j) x[j] = through<T>(x[j] - m);
            exp_row(e, x, c);
            double total = 0;
            for (int64_t j = 0; j < c; ++j) total += double(through<T>(e[j]));
            store_at<W>(a, out[0], i, W(total));
          });
        } else if (piece == CePiece::Nll) {  // nls = -((x - m) - log(d)); the label's nls, or 0
          for_rows<W>(a, in[0], n, c, [&](int64_t i, W* x, W*) {
            const W m = load_at<W>(a, in[1], i);
            const W log_d = through<T>(std::log(load_at<W>(a, in[2], i)));
            for (int64_t j = 0; j < c; ++j) x[j] = -through<T>(through<T>(x[j] - m) - log_d);
            store_row<W>(a + out[0].offset + i * out[0].strides[0], out[0].strides[1], out[0].dtype, x, c);
            const int64_t j = label(a, in[3], i, c);
            store_at<W>(a, out[1], i, j >= 0 ? x[j] : W(0));
          });
        } else {  // dlogits = exp(-nls) * dloss, minus dloss at the label
          for_rows<W>(a, in[1], n, c, [&](int64_t i, W* nls, W* g) {
            const W dl = load_at<W>(a, in[0], i);
            for (int64_t j = 0; j < c; ++j) nls[j] = -nls[j];
            exp_row(g, nls, c);
            for (int64_t j = 0; j < c; ++j) g[j] = through<T>(through<T>(g[j]) * dl);
            const int64_t j = label(a, in[2], i, c);
            if (j >= 0) g[j] = through<T>(g[j] - dl);
            store_row<W>(a + out[0].offset + i * out[0].strides[0], out[0].strides[1], out[0].dtype, g, c);
          });
        }
      });
    });
    return k;
  };
}

const RegisterKernel cross_entropy_ops[] = {
    {{"cross_entropy_sharded_denominator"}, cross_entropy(CePiece::Denominator)},
    {{"cross_entropy_sharded_nll"}, cross_entropy(CePiece::Nll)},
    {{"cross_entropy_sharded_grad"}, cross_entropy(CePiece::Grad)},
};

// ---- fp8_mse_scale ------------------------------------------------------------------------------
// The reference's search (popxl/ops/addons/quantize.py), step for step in float.
constexpr int kLevels = 254, kBiases = 62;

int32_t fp8_scaling_bias(const std::vector<float>& share, int64_t low, int64_t high, float q) {
  std::vector<float> limit(kLevels);
  for (int c = 0; c < kLevels; ++c) limit[c] = std::ldexp(1.0f, c - 126);
  float errors[kBiases];
  float top = 0.0f;  // the largest bound inside the range, kept from one bias to the next
  for (int b = 0; b < kBiases; ++b, ++low, ++high) {
    float acc = 0.0f;
    int64_t c = 1;
    for (; c < low && c < kLevels; ++c) acc = acc + share[c] * limit[c] * limit[c];
    for (; c >= low && c < high && c < kLevels; ++c) {
      acc = acc + share[c] * limit[c] * limit[c] * q;
      top = limit[c];
    }
    for (; c >= high && c < kLevels; ++c) acc = acc + share[c] * (top - limit[c]) * (top - limit[c]);
    errors[b] = acc;
  }
  float best = errors[0];
  for (float e : errors) best = (std::isnan(e) || e < best) && !std::isnan(best) ? e : best;  // NaN wins, as np.min
  int first = 0, ties = 0;
  if (!std::isnan(best)) {
    while (errors[first] != best) ++first;
    for (float e : errors) ties += e == best;
  }
  return 31 - first - ties / 2;
}

const RegisterKernel fp8_mse_scale_op{{"fp8_mse_scale"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer x = bufs[ins.inputs[0]], y = bufs[ins.outputs[0]];
  if (x.dtype != DType::F32 && x.dtype != DType::F16) return nullptr;
  const int64_t low = ins.attr_int("min_fp32_exp_index");
  const int64_t high = low + ins.attr_int("format_span");
  const float q = float(ins.attr_float("quantisation_error"));
  // the bin bounds 2**-126 .. 2**127 in the input's type (float16 turns the smallest into 0 and the
  // largest into inf)
  std::vector<double> bounds(kLevels);
  for (int c = 0; c < kLevels; ++c) {
    const float v = std::ldexp(1.0f, c - 126);
    bounds[c] = x.dtype == DType::F16 ? double(float(f16(v))) : double(v);
  }
  auto st = std::make_shared<Packed>(x);
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    std::vector<float> values(x.nelms);
    load_row<float>(st->read(a), static_cast<int64_t>(itemsize(x.dtype)), x.dtype, values.data(), x.nelms);
    std::vector<int64_t> counts(kLevels + 1, 0);
    for (float v : values) {
      const double m = std::isnan(v) ? NAN : std::fabs(double(v));
      // NaN sorts last, as in the reference's searchsorted
      const int64_t bin = std::isnan(m) ? kLevels : std::upper_bound(bounds.begin(), bounds.end(), m) - bounds.begin();
      ++counts[bin];
    }
    std::vector<float> share(kLevels);
    const float size = float(std::max<int64_t>(x.nelms, 1));
    for (int c = 0; c < kLevels; ++c) share[c] = float(counts[c + 1]) / size;
    const int32_t bias = fp8_scaling_bias(share, low, high, q);
    store_row<int32_t>(a + y.offset, 0, y.dtype, &bias, 1);
  });
}};

}  // namespace
}  // namespace popxl
