// Softmax and the nll_loss family: softmax and its gradient, nll_loss (+ gradient, + fused softmax
// gradient). Compute type W is float32 for float16 and the dtype itself otherwise, as in the
// reference. Per-element formulas keep the reference's order of operations; sums (loss totals)
// accumulate in float64, which is at least as exact as NumPy's pairwise sums, so those results
// agree to rounding rather than bit for bit.

#include <array>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "fp8.hpp"
#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- softmax_grad: g * y - y * sum(g * y) along the axis, y = softmax(x) -------------------------
// The tensors are seen as (outer, A, inner) around the axis. With inner == 1 (the last axis) each
// row is one dense run; otherwise the sums run across the axis for `inner` positions at once.
const RegisterKernel softmax_grad_op{{"softmax_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &gb = bufs[ins.inputs[0]], &yb = bufs[ins.inputs[1]], &ob = bufs[ins.outputs[0]];
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  const int64_t outer = prod(yb.shape, 0, axis), A = yb.shape.at(axis), inner = prod(yb.shape, axis + 1);
  unique_ptr<Kernel> k;
  dispatch_float(yb.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using W = typename Wide<T>::type;
    struct State { Packed g, y, out; };
    auto st = std::make_shared<State>();
    st->g = Packed(gb);
    st->y = Packed(yb);
    st->out = Packed(ob);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      const T* gs = reinterpret_cast<const T*>(st->g.read(a));
      const T* ys = reinterpret_cast<const T*>(st->y.read(a));
      T* os = reinterpret_cast<T*>(st->out.write(a));
      const int64_t block = A * inner;
      threads::region([&](int id, int team) {
        std::vector<double> sums(inner > 1 ? inner : 0);
        std::vector<float> staged(std::is_same_v<T, f16> && inner == 1 ? 3 * A : 0);  // float16 rows as float
        const auto dense_row = [A](auto* out, const auto* g, const auto* y) {
          using O = std::remove_reference_t<decltype(*out)>;
          const W s = W(lane_sum<W>(A, [&](int64_t i) { return W(g[i]) * W(y[i]); }));
          for (int64_t i = 0; i < A; ++i) out[i] = O(W(g[i]) * W(y[i]) - W(y[i]) * s);
        };
        for (int64_t o : threads::share(outer, id, team)) {
          const T *g = gs + o * block, *y = ys + o * block;
          T* out = os + o * block;
          if (inner == 1) {
            if constexpr (std::is_same_v<T, f16>) {  // vectorised conversions, then float rows
              float *gf = staged.data(), *yf = gf + A, *of = yf + A;
              f16_to_f32(g, gf, A);
              f16_to_f32(y, yf, A);
              dense_row(of, gf, yf);
              f32_to_f16(of, out, A);
            } else {
              dense_row(out, g, y);
            }
            continue;
          }
          std::fill(sums.begin(), sums.end(), 0.0);
          for (int64_t i = 0; i < A; ++i)
            for (int64_t e = 0; e < inner; ++e) sums[e] += double(W(g[i * inner + e]) * W(y[i * inner + e]));
          for (int64_t i = 0; i < A; ++i)
            for (int64_t e = 0; e < inner; ++e) {
              const W gv = W(g[i * inner + e]), yv = W(y[i * inner + e]);
              out[i * inner + e] = T(gv * yv - yv * W(sums[e]));
            }
        }
      }, outer > 1 && outer * block > kParallelElements);
      st->out.commit(a);
    });
  });
  return k;
}};

// ---- softmax: exp(x - max) / sum along the axis ---------------------------------------------------
// Seen as (outer, A, inner) around the axis. Dense float32 rows (the last axis) go through the
// eight-wide row kernel; anything else is staged a block of A * inner values at a time in the
// compute type (float32 for float16 and float8, as the reference computes them).
//
// Along another axis each of a block's `inner` columns is a softmax: they are computed a row of
// columns at a time (contiguous loads, eight columns a vector for float32), columns [c0, c1) of
// the block, each column's sum in double in row order.
template <class W>
struct SoftmaxColumns {
  std::vector<W> m;
  std::vector<double> total;

  void run(W* y, const W* x, int64_t A, int64_t inner, int64_t c0, int64_t c1) {
    if (A == 0) return;  // nothing to read or write
    const int64_t n = c1 - c0;
    m.assign(x + c0, x + c1);
    total.assign(n, 0.0);
    for (int64_t i = 0; i < A; ++i) {
      const W* r = x + i * inner + c0;
      for (int64_t e = 0; e < n; ++e) m[e] = r[e] > m[e] ? r[e] : m[e];
    }
    // a NaN's exponential is NaN, and so is its column's sum: the whole column comes out NaN
    for (int64_t i = 0; i < A; ++i) {
      const W* r = x + i * inner + c0;
      W* out = y + i * inner + c0;
      int64_t e = 0;
#ifdef POPXL_VEC8
      if constexpr (std::is_same_v<W, float>) {
        for (; e + 8 <= n; e += 8) {
          const __m256 v = vec8::softmax_exp(_mm256_sub_ps(_mm256_loadu_ps(r + e), _mm256_loadu_ps(m.data() + e)));
          _mm256_storeu_ps(out + e, v);
          _mm256_storeu_pd(total.data() + e, _mm256_add_pd(_mm256_loadu_pd(total.data() + e),
                                                           _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
          _mm256_storeu_pd(total.data() + e + 4, _mm256_add_pd(_mm256_loadu_pd(total.data() + e + 4),
                                                               _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
        }
      }
#endif
      for (; e < n; ++e) total[e] += double(out[e] = softmax_exp(r[e] - m[e]));
    }
    for (int64_t i = 0; i < A; ++i) {
      W* out = y + i * inner + c0;
      for (int64_t e = 0; e < n; ++e) out[e] = out[e] / W(total[e]);
    }
  }
};

const RegisterKernel softmax_op{{"softmax"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &xb = bufs[ins.inputs[0]], &yb = bufs[ins.outputs[0]];
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  const int64_t outer = prod(xb.shape, 0, axis), A = xb.shape.at(axis), inner = prod(xb.shape, axis + 1);
  struct State { Packed x, y; };
  auto st = std::make_shared<State>(State{Packed(xb), Packed(yb)});
  const DType d = xb.dtype;
  const int64_t item = static_cast<int64_t>(itemsize(d)), block = A * inner;
  auto run = [st, outer, block, A, inner, d, item](auto tag) {
    using W = typename decltype(tag)::type;
    return [=](uint8_t* a) {
      const uint8_t* xs = st->x.read(a);
      uint8_t* ys = st->y.write(a);
      if constexpr (std::is_same_v<W, float>) {
        if (d == DType::F32 && inner > 1) {  // columns of the blocks in pieces, on all threads
          constexpr int64_t kPiece = 256;
          const int64_t pieces = (inner + kPiece - 1) / kPiece;
          threads::region([&](int id, int team) {
            SoftmaxColumns<float> cols;
            for (int64_t w : threads::share(outer * pieces, id, team)) {
              const int64_t o = w / pieces, c0 = w % pieces * kPiece;
              cols.run(reinterpret_cast<float*>(ys) + o * block, reinterpret_cast<const float*>(xs) + o * block, A,
                       inner, c0, std::min(inner, c0 + kPiece));
            }
          }, outer * pieces > 1 && outer * block > kParallelElements);
          st->y.commit(a);
          return;
        }
      }
      threads::region([&](int id, int team) {
        std::vector<W> in, out;
        SoftmaxColumns<W> cols;
        for (int64_t o : threads::share(outer, id, team)) {
          const uint8_t* xo = xs + o * block * item;
          uint8_t* yo = ys + o * block * item;
          if constexpr (std::is_same_v<W, float>) {
            if (d == DType::F32 && inner == 1) {
              softmax_row(reinterpret_cast<float*>(yo), reinterpret_cast<const float*>(xo), A);
              continue;
            }
          }
          in.resize(block);
          out.resize(block);
          if (is_fp8(d)) {
            const Fp8Format& f = fp8_format(d);
            f.decode_row(xo, in.data(), block);
            cols.run(out.data(), in.data(), A, inner, 0, inner);
            f.round_row(out.data(), yo, block);
          } else {
            load_row<W>(xo, item, d, in.data(), block);
            if constexpr (std::is_same_v<W, float>) {
              if (inner == 1) softmax_row(out.data(), in.data(), A);  // float16's last axis
              else cols.run(out.data(), in.data(), A, inner, 0, inner);
            } else {
              cols.run(out.data(), in.data(), A, inner, 0, inner);
            }
            store_row<W>(yo, item, d, out.data(), block);
          }
        }
      }, outer > 1 && outer * block > kParallelElements);
      st->y.commit(a);
    };
  };
  if (d == DType::F64) return std::make_unique<FnKernel>(run(Tag<double>{}));
  if (d == DType::F32 || d == DType::F16 || is_fp8(d)) return std::make_unique<FnKernel>(run(Tag<float>{}));
  return nullptr;
}};

// ---- nll_loss family ------------------------------------------------------------------------------
// probs (..., C) as rows; labels one per row. Ignored rows count 0; other out-of-range labels are an
// error, as in the reference.
struct NllSpec {
  bool has_ignore = false, log_prob = false;
  int64_t ignore = 0;
  enum { None, Sum, Mean } reduction = Mean;
  double eps = 1e-7;
  int64_t rows = 0, C = 0;
  std::string op;  // the op's type, for errors
};

NllSpec nll_spec(const OpInstr& ins, const Buffer& probs) {
  NllSpec s;
  s.op = ins.type;
  const AttrValue& ig = ins.attr_value("ignore_index");
  s.has_ignore = !ig.is_none();
  if (s.has_ignore) s.ignore = ig.i();
  s.log_prob = ins.declares("log_prob") && ins.attr_bool("log_prob");  // nll_loss_with_softmax_grad has none
  const std::string& r = ins.attr_str("reduction");
  s.reduction = r == "none" ? NllSpec::None : r == "sum" ? NllSpec::Sum : NllSpec::Mean;
  s.eps = probs.dtype == DType::F16 ? 6.104e-5 : 1e-7;
  s.C = probs.shape.back();
  s.rows = probs.nelms / std::max<int64_t>(s.C, 1);
  if (s.C == 0) s.rows = prod(probs.shape, 0, probs.shape.size() - 1);
  return s;
}

// Which rows count, and their labels (0 for ignored rows, as the reference clamps them).
int64_t kept_rows(const NllSpec& s, std::vector<int64_t>& labels, std::vector<uint8_t>& keep) {
  keep.assign(labels.size(), 1);
  int64_t count = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (s.has_ignore && labels[i] == s.ignore) {
      keep[i] = 0;
      labels[i] = 0;
      continue;
    }
    if (labels[i] < 0 || labels[i] >= s.C)
      throw std::invalid_argument(s.op + ": label " + std::to_string(labels[i]) + " is out of range for " +
                                  std::to_string(s.C) + " classes");
    ++count;
  }
  return count;
}

// Per-row losses in W (0 for ignored rows) and the (sum, mean or per-row) output; `probs` packed.
template <class T, class W>
void nll_losses(const NllSpec& s, const T* probs, const std::vector<int64_t>& labels,
                const std::vector<uint8_t>& keep, int64_t count, std::vector<W>& out) {
  std::vector<W> item(s.rows);
  double total = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    const W picked = keep[r] ? W(probs[r * s.C + labels[r]]) : W(0);  // ignored rows may have no class 0
    W v;
    if (s.log_prob) v = -picked;
    else v = -std::log(std::isnan(picked) ? picked : std::max(picked, W(s.eps)));
    item[r] = keep[r] ? v : W(0);
    total += double(item[r]);
  }
  if (s.reduction == NllSpec::None) { out = item; return; }
  W t = W(total);
  if (s.reduction == NllSpec::Mean) t = t / W(std::max<int64_t>(count, 1));
  out.assign(1, t);
}

// Per-row gradient scales: loss_grad (broadcast or per row), / count for "mean", 0 when ignored.
template <class W>
std::vector<W> row_scales(const NllSpec& s, const std::vector<W>& lg, const std::vector<uint8_t>& keep, int64_t count) {
  std::vector<W> sc(s.rows);
  for (int64_t r = 0; r < s.rows; ++r) {
    W v = lg.size() == 1 ? lg[0] : lg[r];
    if (s.reduction == NllSpec::Mean) v = v / W(std::max<int64_t>(count, 1));
    sc[r] = keep[r] ? v : W(0);
  }
  return sc;
}

enum class Nll { Loss, Grad, SoftmaxGrad };

// The probabilities are read and the gradient written in place in the arena (packed copies only
// for strided views), row by row on the threads.
KernelFactory nll(Nll which) {
  return [which](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &probs = bufs[ins.inputs[0]], &labels = bufs[ins.inputs[1]];
    if (!is_int(labels.dtype)) return nullptr;
    const NllSpec s = nll_spec(ins, probs);
    unique_ptr<Kernel> k;
    dispatch_float(probs.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      struct State {
        Packed p, l, lg, loss, grad;
        std::vector<W> lgv, res;
        std::vector<int64_t> lab;
        std::vector<uint8_t> keep;
      };
      auto st = std::make_shared<State>();
      st->p = Packed(probs);
      st->l = Packed(labels);
      if (which != Nll::Loss) st->lg = Packed(bufs[ins.inputs[2]]);
      if (which != Nll::Grad) st->loss = Packed(bufs[ins.outputs[0]]);
      if (which != Nll::Loss) st->grad = Packed(bufs[ins.outputs[which == Nll::Grad ? 0 : 1]]);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const T* p = reinterpret_cast<const T*>(st->p.read(a));
        st->l.read_ints(a, st->lab);
        const int64_t count = kept_rows(s, st->lab, st->keep);
        if (which != Nll::Loss) read_all(a, st->lg, st->lgv);
        if (which != Nll::Grad) {
          nll_losses(s, p, st->lab, st->keep, count, st->res);
          write_all(a, st->loss, st->res);
        }
        if (which == Nll::Loss || s.C == 0) return;
        const std::vector<W> sc = row_scales(s, st->lgv, st->keep, count);
        T* g = reinterpret_cast<T*>(st->grad.write(a));
        threads::for_each(s.rows, [&](int64_t r) {
          const T* in = p + r * s.C;
          T* out = g + r * s.C;
          const int64_t lab = st->lab[r];
          if (which == Nll::SoftmaxGrad) {  // (softmax - onehot) * scale
            const W scale = sc[r];
            const W at_label = (W(in[lab]) - W(1)) * scale;
            for (int64_t c = 0; c < s.C; ++c) out[c] = T(W(in[c]) * scale);
            out[lab] = T(at_label);
            return;
          }
          // d(-log max(p, eps))/dp = -1/p above eps, 0 where the clamp holds; only at the label
          const W picked = W(in[lab]);
          W local = W(-1);
          if (!s.log_prob) local = picked > W(s.eps) ? W(-1) / std::max(picked, W(s.eps)) : W(0);
          std::fill(out, out + s.C, T(0));
          out[lab] = T(st->keep[r] ? sc[r] * local : W(0));
        }, s.rows > 1 && s.rows * s.C > kParallelElements);
        st->grad.commit(a);
      });
    });
    return k;
  };
}

const RegisterKernel nll_ops[] = {
    {{"nll_loss"}, nll(Nll::Loss)},
    {{"nll_loss_grad"}, nll(Nll::Grad)},
    {{"nll_loss_with_softmax_grad"}, nll(Nll::SoftmaxGrad)},
};


}  // namespace
}  // namespace popxl
