// Normalisations and losses: batch_norm_inference, group_norm/layer_norm and their gradient,
// nll_loss (+ gradient, + fused softmax gradient). Compute type W is float32 for float16 and the
// dtype itself otherwise, as in the reference. Per-element formulas keep the reference's order of
// operations; sums (statistics, loss totals) accumulate in float64, which is at least as exact
// as NumPy's pairwise sums, so those results agree to rounding rather than bit for bit.
//
// The normalisations are hand loops rather than oneDNN primitives: oneDNN's layer norm works on
// the last axis (ours normalises everything but the batch axis with per-channel affine) and its
// batch norm folds scale/sqrt(var) into one factor, which rounds differently from the reference.
#include <omp.h>

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

// Calls f(Tag<W>{}) with the compute type of a float16/32/64 dtype.
template <class F>
bool dispatch_wide(DType d, F&& f) {
  return dispatch_float(d, [&](auto tag) { f(Tag<typename Wide<typename decltype(tag)::type>::type>{}); });
}

// ---- batch_norm_inference: scale * (x - mean) / sqrt(var + eps) + bias ----------------------------
const RegisterKernel batch_norm_op{{"batch_norm_inference"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  const double eps = ins.attrs.at("epsilon").f();
  const int64_t N = x.shape[0], C = x.shape[1], S = prod(x.shape, 2);
  unique_ptr<Kernel> k;
  dispatch_wide(x.dtype, [&](auto tag) {
    using W = typename decltype(tag)::type;
    struct State { Packed x, y, p[4]; std::vector<W> xv, pv[4]; };
    auto st = std::make_shared<State>();
    st->x = Packed(x);
    st->y = Packed(y);
    for (int i = 0; i < 4; ++i) st->p[i] = Packed(bufs[ins.inputs[1 + i]]);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      read_all(a, st->x, st->xv);
      for (int i = 0; i < 4; ++i) read_all(a, st->p[i], st->pv[i]);
      const auto &sc = st->pv[0], &bi = st->pv[1], &mu = st->pv[2], &va = st->pv[3];
      std::vector<W>& v = st->xv;
#pragma omp parallel for schedule(static) if (N * C * S > 32768)
      for (int64_t nc = 0; nc < N * C; ++nc) {
        const int64_t c = nc % C;
        const W s = sc[c], m = mu[c], r = std::sqrt(va[c] + W(eps)), b = bi[c];
        W* row = v.data() + nc * S;
        for (int64_t i = 0; i < S; ++i) row[i] = s * (row[i] - m) / r + b;
      }
      write_all(a, st->y, v);
    });
  });
  return k;
}};

// ---- group_norm / layer_norm and the gradient -----------------------------------------------------
// x is (N, C, S...) seen as (N, G, C/G * S); statistics per (n, g), affine per channel. Each group
// is contiguous in the packed layout, so the kernels work group by group, on threads when there is
// enough work: two passes for the statistics (sum, then squared deviations, as the reference does)
// and one for the result, all over values that are still in cache.
struct Groups {
  int64_t N, C, G, S;
  int64_t per_group() const { return C / G * S; }
  int64_t count() const { return N * G; }
  int64_t channels() const { return C / G; }
};

Groups groups_of(const Buffer& x, int64_t G) { return {x.shape[0], x.shape[1], G, prod(x.shape, 2)}; }

// Mean and 1/sqrt(biased variance + eps) of a group's M values (NaN for an empty group).
template <class W>
std::pair<W, W> group_moments(const W* p, int64_t M, double eps) {
  if (M == 0) return {W(NAN), W(NAN)};
  if constexpr (std::is_same_v<W, float>) return row_moments(p, M, eps);  // eight lanes at a time
  const W m = W(lane_sum<W>(M, [&](int64_t i) { return p[i]; }) / double(M));
  const double var = lane_sum<W>(M, [&](int64_t i) { const W d = p[i] - m; return d * d; }) / double(M);
  return {m, W(1.0 / std::sqrt(double(W(var)) + double(W(eps))))};
}

// One group's values as W: the packed data itself when it is stored as W, else converted into `tmp`.
template <class T, class W>
const W* group_as_wide(const T* p, int64_t M, std::vector<W>& tmp) {
  if constexpr (std::is_same_v<T, W>) {
    return p;
  } else {
    tmp.resize(M);
    if constexpr (std::is_same_v<T, f16> && std::is_same_v<W, float>) f16_to_f32(p, tmp.data(), M);
    else for (int64_t i = 0; i < M; ++i) tmp[i] = W(p[i]);
    return tmp.data();
  }
}

// Writes a group computed in W (in `out`, or in place when T is W) to its place `dst`.
template <class T, class W>
W* group_out(T* dst, int64_t M, std::vector<W>& tmp) {
  if constexpr (std::is_same_v<T, W>) {
    return dst;
  } else {
    tmp.resize(M);
    return tmp.data();
  }
}

template <class T, class W>
void group_commit(T* dst, const W* v, int64_t M) {
  if constexpr (std::is_same_v<T, f16> && std::is_same_v<W, float>) f32_to_f16(v, dst, M);
  else if constexpr (!std::is_same_v<T, W>)
    for (int64_t i = 0; i < M; ++i) dst[i] = T(v[i]);
}

KernelFactory group_norm(bool layer) {
  return [layer](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
    const Groups g = groups_of(x, layer ? 1 : ins.attrs.at("num_groups").i());
    const double eps = ins.attrs.at("eps").f();
    unique_ptr<Kernel> k;
    dispatch_float(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using W = typename Wide<T>::type;
      struct State { Packed x, y, w, b; std::vector<W> wv, bv; };
      auto st = std::make_shared<State>();
      st->x = Packed(x);
      st->y = Packed(y);
      st->w = Packed(bufs[ins.inputs[1]]);
      st->b = Packed(bufs[ins.inputs[2]]);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        read_all(a, st->w, st->wv);
        read_all(a, st->b, st->bv);
        const T* xs = reinterpret_cast<const T*>(st->x.read(a));
        T* ys = reinterpret_cast<T*>(st->y.write(a));
        const int64_t M = g.per_group(), cpg = g.channels(), S = g.S;
        const W *wv = st->wv.data(), *bv = st->bv.data();
#pragma omp parallel if (g.count() > 1 && g.N * g.C * g.S > kParallelElements)
        {
          std::vector<W> in_tmp, out_tmp;
#pragma omp for schedule(static)
          for (int64_t j = 0; j < g.count(); ++j) {
            const W* p = group_as_wide<T, W>(xs + j * M, M, in_tmp);
            W* q = group_out<T, W>(ys + j * M, M, out_tmp);
            const auto [m, r] = group_moments(p, M, eps);
            const int64_t c0 = j % g.G * cpg;
            if (S == 1) {  // one value per channel (a layer norm of rows)
              const W *wc = wv + c0, *bc = bv + c0;
              for (int64_t i = 0; i < M; ++i) q[i] = (p[i] - m) * r * wc[i] + bc[i];
            } else {
              for (int64_t c = 0; c < cpg; ++c) {
                const W w = wv[c0 + c], b = bv[c0 + c];
                const W *pc = p + c * S;
                W* qc = q + c * S;
                for (int64_t i = 0; i < S; ++i) qc[i] = (pc[i] - m) * r * w + b;
              }
            }
            group_commit<T, W>(ys + j * M, q, M);
          }
        }
        st->y.commit(a);
      });
    });
    return k;
  };
}

const RegisterKernel group_norm_ops[] = {
    {{"group_norm"}, group_norm(false)},
    {{"layer_norm"}, group_norm(true)},
};

// (dx, dweight, dbias) with the statistics recomputed from x. With xhat = (x - mean) * r and
// d = dy * weight: dx = (d - mean(d) - xhat * mean(d * xhat)) * r over each group; dweight and
// dbias sum dy * xhat and dy per channel over the batch and spatial positions.
const RegisterKernel group_norm_grad_op{{"group_norm_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer& x = bufs[ins.inputs[0]];
  const Groups g = groups_of(x, ins.attrs.at("num_groups").i());
  const double eps = ins.attrs.at("eps").f();
  unique_ptr<Kernel> k;
  dispatch_float(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using W = typename Wide<T>::type;
    struct State {
      Packed x, w, gy, dx, dw, db;
      std::vector<W> wv;
      std::vector<double> dwv, dbv, part;
    };
    auto st = std::make_shared<State>();
    st->x = Packed(x);
    st->w = Packed(bufs[ins.inputs[1]]);
    st->gy = Packed(bufs[ins.inputs[2]]);
    st->dx = Packed(bufs[ins.outputs[0]]);
    st->dw = Packed(bufs[ins.outputs[1]]);
    st->db = Packed(bufs[ins.outputs[2]]);
    k = std::make_unique<FnKernel>([st, g, eps](uint8_t* a) {
      read_all(a, st->w, st->wv);
      const T* xs = reinterpret_cast<const T*>(st->x.read(a));
      const T* gys = reinterpret_cast<const T*>(st->gy.read(a));
      T* dxs = reinterpret_cast<T*>(st->dx.write(a));
      const int64_t M = g.per_group(), cpg = g.channels(), S = g.S;
      const W* wv = st->wv.data();
      // Groups are independent except for dweight/dbias, which sum over the batch: each thread sums
      // its own share (in double), and the shares are added in thread order afterwards.
      const bool parallel = g.count() > 1 && g.N * g.C * g.S > kParallelElements;
      const int threads = parallel ? omp_get_max_threads() : 1;
      st->part.assign(size_t(threads) * 2 * g.C, 0.0);
#pragma omp parallel num_threads(threads) if (parallel)
      {
        double* dw = st->part.data() + size_t(omp_get_thread_num()) * 2 * g.C;
        double* db = dw + g.C;
        std::vector<W> x_tmp, g_tmp, out_tmp;
        // float32 rows of one value per channel in one group (a layer norm): the row kernel of vec_math.hpp,
        // its dweight/dbias sums kept in float for 16 rows at a time, then added in double.
        const bool rows = std::is_same_v<W, float> && S == 1 && g.G == 1;
        std::vector<float> fdw(rows ? g.C : 0), fdb(rows ? g.C : 0);
        int64_t pending = 0;
        auto flush = [&] {
          for (int64_t c = 0; c < int64_t(fdw.size()); ++c) {
            dw[c] += fdw[c];
            db[c] += fdb[c];
          }
          std::fill(fdw.begin(), fdw.end(), 0.f);
          std::fill(fdb.begin(), fdb.end(), 0.f);
          pending = 0;
        };
#pragma omp for schedule(static)
        for (int64_t j = 0; j < g.count(); ++j) {
          const W* p = group_as_wide<T, W>(xs + j * M, M, x_tmp);
          const W* gy = group_as_wide<T, W>(gys + j * M, M, g_tmp);
          W* q = group_out<T, W>(dxs + j * M, M, out_tmp);
          const auto [m, r] = group_moments(p, M, eps);
          const int64_t c0 = j % g.G * cpg;
          if constexpr (std::is_same_v<W, float>) {
            if (rows) {
              layer_norm_grad_row(p, gy, wv + c0, q, fdw.data() + c0, fdb.data() + c0, M, m, r);
              if (++pending == 16) flush();
              group_commit<T, W>(dxs + j * M, q, M);
              continue;
            }
          }
          if (S == 1) {
            const W mean_d = W(lane_sum<W>(M, [&](int64_t i) { return gy[i] * wv[c0 + i]; }) / double(M));
            const W mean_dx =
                W(lane_sum<W>(M, [&](int64_t i) { return gy[i] * wv[c0 + i] * ((p[i] - m) * r); }) / double(M));
            for (int64_t i = 0; i < M; ++i) {
              const W xh = (p[i] - m) * r;
              dw[c0 + i] += double(gy[i] * xh);
              db[c0 + i] += double(gy[i]);
              q[i] = (gy[i] * wv[c0 + i] - mean_d - xh * mean_dx) * r;
            }
          } else {
            // per channel, the sums of dy * xhat and of dy (its dweight and dbias shares); the
            // group's means of d and d * xhat are their weighted totals
            double sum_d = 0, sum_dx = 0;
            for (int64_t c = 0; c < cpg; ++c) {
              const W *pc = p + c * S, *gc = gy + c * S;
              const double dxh = lane_sum<W>(S, [&](int64_t i) { return gc[i] * ((pc[i] - m) * r); });
              const double dy = lane_sum<W>(S, [&](int64_t i) { return gc[i]; });
              dw[c0 + c] += dxh;
              db[c0 + c] += dy;
              sum_d += double(wv[c0 + c]) * dy;
              sum_dx += double(wv[c0 + c]) * dxh;
            }
            const W mean_d = W(sum_d / double(M)), mean_dx = W(sum_dx / double(M));
            for (int64_t c = 0; c < cpg; ++c) {
              const W w = wv[c0 + c];
              const W *pc = p + c * S, *gc = gy + c * S;
              W* qc = q + c * S;
              for (int64_t i = 0; i < S; ++i) qc[i] = (gc[i] * w - mean_d - (pc[i] - m) * r * mean_dx) * r;
            }
          }
          group_commit<T, W>(dxs + j * M, q, M);
        }
        if (pending) flush();
      }
      st->dwv.assign(g.C, 0);
      st->dbv.assign(g.C, 0);
      for (int t = 0; t < threads; ++t)
        for (int64_t c = 0; c < g.C; ++c) {
          st->dwv[c] += st->part[size_t(t) * 2 * g.C + c];
          st->dbv[c] += st->part[size_t(t) * 2 * g.C + g.C + c];
        }
      st->dx.commit(a);
      write_all(a, st->dw, st->dwv);
      write_all(a, st->db, st->dbv);
    });
  });
  return k;
}};

// ---- softmax_grad: g * y - y * sum(g * y) along the axis, y = softmax(x) -------------------------
// The tensors are seen as (outer, A, inner) around the axis. With inner == 1 (the last axis) each
// row is one dense run; otherwise the sums run across the axis for `inner` positions at once.
const RegisterKernel softmax_grad_op{{"softmax_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &gb = bufs[ins.inputs[0]], &yb = bufs[ins.inputs[1]], &ob = bufs[ins.outputs[0]];
  const size_t axis = static_cast<size_t>(ins.attrs.at("axis").i());
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
#pragma omp parallel if (outer > 1 && outer * block > kParallelElements)
      {
        std::vector<double> sums(inner > 1 ? inner : 0);
        std::vector<float> staged(std::is_same_v<T, f16> && inner == 1 ? 3 * A : 0);  // float16 rows as float
        const auto dense_row = [A](auto* out, const auto* g, const auto* y) {
          using O = std::remove_reference_t<decltype(*out)>;
          const W s = W(lane_sum<W>(A, [&](int64_t i) { return W(g[i]) * W(y[i]); }));
          for (int64_t i = 0; i < A; ++i) out[i] = O(W(g[i]) * W(y[i]) - W(y[i]) * s);
        };
#pragma omp for schedule(static)
        for (int64_t o = 0; o < outer; ++o) {
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
      }
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
  const size_t axis = static_cast<size_t>(ins.attrs.at("axis").i());
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
#pragma omp parallel if (outer * pieces > 1 && outer * block > kParallelElements)
          {
            SoftmaxColumns<float> cols;
#pragma omp for schedule(static)
            for (int64_t w = 0; w < outer * pieces; ++w) {
              const int64_t o = w / pieces, c0 = w % pieces * kPiece;
              cols.run(reinterpret_cast<float*>(ys) + o * block, reinterpret_cast<const float*>(xs) + o * block, A,
                       inner, c0, std::min(inner, c0 + kPiece));
            }
          }
          st->y.commit(a);
          return;
        }
      }
#pragma omp parallel if (outer > 1 && outer * block > kParallelElements)
      {
        std::vector<W> in, out;
        SoftmaxColumns<W> cols;
#pragma omp for schedule(static)
        for (int64_t o = 0; o < outer; ++o) {
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
      }
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
  const AttrValue& ig = ins.attrs.at("ignore_index");
  s.has_ignore = !ig.is_none();
  if (s.has_ignore) s.ignore = ig.i();
  auto lp = ins.attrs.find("log_prob");
  s.log_prob = lp != ins.attrs.end() && lp->second.b();
  const std::string& r = ins.attrs.at("reduction").s();
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
#pragma omp parallel for schedule(static) if (s.rows > 1 && s.rows * s.C > kParallelElements)
        for (int64_t r = 0; r < s.rows; ++r) {
          const T* in = p + r * s.C;
          T* out = g + r * s.C;
          const int64_t lab = st->lab[r];
          if (which == Nll::SoftmaxGrad) {  // (softmax - onehot) * scale
            const W scale = sc[r];
            const W at_label = (W(in[lab]) - W(1)) * scale;
            for (int64_t c = 0; c < s.C; ++c) out[c] = T(W(in[c]) * scale);
            out[lab] = T(at_label);
            continue;
          }
          // d(-log max(p, eps))/dp = -1/p above eps, 0 where the clamp holds; only at the label
          const W picked = W(in[lab]);
          W local = W(-1);
          if (!s.log_prob) local = picked > W(s.eps) ? W(-1) / std::max(picked, W(s.eps)) : W(0);
          std::fill(out, out + s.C, T(0));
          out[lab] = T(st->keep[r] ? sc[r] * local : W(0));
        }
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

// ---- pooling gradients -------------------------------------------------------------------------
// Hand loops rather than oneDNN: they add contributions in the reference's order (output
// positions, then window positions, in C order), so the float sums are bit-identical, and max
// pooling sends the gradient to the first maximum exactly as the reference does.
struct PoolGeom {
  int64_t planes = 1;  // N * C
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, p{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

PoolGeom pool_geom(const OpInstr& ins, const Buffer& x, const Buffer& g) {
  PoolGeom G;
  const size_t r = x.shape.size() - 2;
  G.planes = x.shape[0] * x.shape[1];
  const auto k = ins.attrs.at("kernel").ints(), s = ins.attrs.at("strides").ints(), d = ins.attrs.at("dilations").ints(),
             p = ins.attrs.at("pads").ints();
  for (size_t i = 0; i < r; ++i) {
    const size_t j = 3 - r + i;  // right-align the spatial dims in 3
    G.in[j] = x.shape[2 + i];
    G.out[j] = g.shape[2 + i];
    G.k[j] = k[i];
    G.s[j] = s[i];
    G.d[j] = d[i];
    G.p[j] = p[i];
  }
  return G;
}

// f(output index within a plane, input indices of its window in C order, -1 = padding)
template <class F>
void each_window(const PoolGeom& G, std::vector<int64_t>& pos, F&& f) {
  pos.resize(static_cast<size_t>(G.k[0] * G.k[1] * G.k[2]));
  for (int64_t o0 = 0, o = 0; o0 < G.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < G.out[1]; ++o1)
      for (int64_t o2 = 0; o2 < G.out[2]; ++o2, ++o) {
        size_t w = 0;
        for (int64_t k0 = 0; k0 < G.k[0]; ++k0)
          for (int64_t k1 = 0; k1 < G.k[1]; ++k1)
            for (int64_t k2 = 0; k2 < G.k[2]; ++k2, ++w) {
              const int64_t i0 = o0 * G.s[0] - G.p[0] + k0 * G.d[0], i1 = o1 * G.s[1] - G.p[1] + k1 * G.d[1],
                            i2 = o2 * G.s[2] - G.p[2] + k2 * G.d[2];
              const bool inside = i0 >= 0 && i0 < G.in[0] && i1 >= 0 && i1 < G.in[1] && i2 >= 0 && i2 < G.in[2];
              pos[w] = inside ? (i0 * G.in[1] + i1) * G.in[2] + i2 : -1;
            }
        f(o, pos);
      }
}

// A plane's gradient for any pool (3-D ones): the reference's walk, window by window.
template <class W>
void plane_grad_nd(const PoolGeom& G, bool is_max, const W* xv, const W* gv, W* acc, std::vector<int64_t>& pos) {
  each_window(G, pos, [&](int64_t o, const std::vector<int64_t>& pos) {
    if (is_max) {  // the first maximum (padding is -inf; NaN wins at once, as np.argmax)
      size_t best = 0;
      W bv = pos[0] >= 0 ? xv[pos[0]] : -INFINITY;
      for (size_t w = 1; w < pos.size() && bv == bv; ++w) {
        const W v = pos[w] >= 0 ? xv[pos[w]] : -INFINITY;
        if (v > bv || v != v) { best = w; bv = v; }
      }
      if (pos[best] >= 0) acc[pos[best]] += gv[o];
      return;
    }
    W count = 0;  // positions inside the input
    for (int64_t q : pos) count += q >= 0;
    const W share = gv[o] / count;
    for (int64_t q : pos)
      if (q >= 0) acc[q] += share;
  });
}

// The kernel positions [lo, hi) of a window starting at `start` (step d) that fall inside [0, size).
void inside_range(int64_t start, int64_t k, int64_t d, int64_t size, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = k;
  while (lo < hi && start + lo * d < 0) ++lo;
  while (hi > lo && start + (hi - 1) * d >= size) --hi;
}

// Per-row state of plane_grad_2d, one set per thread.
template <class W>
struct PoolRows {
  std::vector<W> bv;                     // each window's maximum so far
  std::vector<int64_t> best, ja, jb;     // its position; the window's columns inside the input
};

// A plane's gradient for 1-D and 2-D pools (G.in[0] == G.k[0] == 1), the same sums as
// each_window's walk. Max: a row of windows at a time, window position by window position, so
// that the windows' compare chains are independent of each other (one window at a time is bound
// by the latency of its chain), branch-free (random values mispredict half the comparisons).
// A window whose first position is padding starts at -inf, which only a greater value (or a NaN)
// beats; the first NaN wins and keeps its place; revisiting the first position changes nothing.
template <class W>
void plane_grad_2d(const PoolGeom& G, bool is_max, const W* xv, const W* gv, W* acc, PoolRows<W>& rows) {
  const int64_t H = G.in[1], Wd = G.in[2], OW = G.out[2], s2 = G.s[2], p2 = G.p[2], d2 = G.d[2];
  rows.bv.resize(OW);
  rows.best.resize(OW);
  rows.ja.resize(OW);
  rows.jb.resize(OW);
  for (int64_t o2 = 0; o2 < OW; ++o2) inside_range(o2 * s2 - p2, G.k[2], d2, Wd, rows.ja[o2], rows.jb[o2]);
  for (int64_t o1 = 0, o = 0; o1 < G.out[1]; ++o1, o += OW) {
    const int64_t h0 = o1 * G.s[1] - G.p[1];
    int64_t ka, kb;  // the rows of the window inside the input
    inside_range(h0, G.k[1], G.d[1], H, ka, kb);
    if (ka == kb) continue;  // all padding: nothing receives the gradient
    if (!is_max) {
      for (int64_t o2 = 0; o2 < OW; ++o2) {
        const int64_t w0 = o2 * s2 - p2, ja = rows.ja[o2], jb = rows.jb[o2];
        if (ja == jb) continue;
        const W share = gv[o + o2] / W((kb - ka) * (jb - ja));
        for (int64_t k1 = ka; k1 < kb; ++k1)
          for (int64_t k2 = ja; k2 < jb; ++k2) acc[(h0 + k1 * G.d[1]) * Wd + w0 + k2 * d2] += share;
      }
      continue;
    }
    W* bv = rows.bv.data();
    int64_t* best = rows.best.data();
    for (int64_t o2 = 0; o2 < OW; ++o2) {
      const bool padded_first = ka > 0 || rows.ja[o2] > 0;
      best[o2] = padded_first ? -1 : h0 * Wd + o2 * s2 - p2;
      bv[o2] = padded_first ? W(-INFINITY) : xv[best[o2]];
    }
    for (int64_t k1 = ka; k1 < kb; ++k1) {
      const int64_t row = (h0 + k1 * G.d[1]) * Wd;
      for (int64_t k2 = 0; k2 < G.k[2]; ++k2) {
        // the windows with column k2 inside the input: o2 * s2 - p2 + k2 * d2 in [0, Wd)
        const int64_t off = k2 * d2 - p2;
        int64_t lo, hi;
        inside_range(off, OW, s2, Wd, lo, hi);
        for (int64_t o2 = lo; o2 < hi; ++o2) {
          const int64_t q = row + o2 * s2 + off;
          const W v = xv[q], b = bv[o2];
          const int64_t take = -static_cast<int64_t>((v > b) | ((v != v) & (b == b)));
          best[o2] = (q & take) | (best[o2] & ~take);
          bv[o2] = select_bits(take, v, b);
        }
      }
    }
    for (int64_t o2 = 0; o2 < OW; ++o2)
      if (best[o2] >= 0) acc[best[o2]] += gv[o + o2];
  }
}

// Planes (one image's channel) are independent: the threads take whole planes, each converted
// into (and its dx out of) the accumulation type on its own, so the sums keep the reference's order.
KernelFactory pool_grad(bool is_max) {
  return [is_max](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &g = bufs[ins.inputs[1]], &dx = bufs[ins.outputs[0]];
    const PoolGeom G = pool_geom(ins, x, g);
    unique_ptr<Kernel> k;
    dispatch_wide(g.dtype, [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State { Packed x, g, dx; };
      auto st = std::make_shared<State>();
      st->x = Packed(x);
      st->g = Packed(g);
      st->dx = Packed(dx);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const int64_t in_n = G.in_size(), out_n = G.out_size();
        const uint8_t* xp = is_max ? st->x.read(a) : nullptr;
        const uint8_t* gp = st->g.read(a);
        uint8_t* dxp = st->dx.write(a);
        const int64_t xi = static_cast<int64_t>(itemsize(x.dtype)), gi = static_cast<int64_t>(itemsize(g.dtype)),
                      di = static_cast<int64_t>(itemsize(dx.dtype));
#pragma omp parallel if (G.planes > 1 && G.planes * (in_n + out_n * static_cast<int64_t>(G.k[0] * G.k[1] * G.k[2])) > kSingleThreadWork)
        {
          std::vector<W> xv(is_max ? in_n : 0), gv(out_n), acc(in_n);
          std::vector<int64_t> pos;
          PoolRows<W> rows;
#pragma omp for schedule(static)
          for (int64_t pl = 0; pl < G.planes; ++pl) {
            if (is_max) load_row<W>(xp + pl * in_n * xi, xi, x.dtype, xv.data(), in_n);
            load_row<W>(gp + pl * out_n * gi, gi, g.dtype, gv.data(), out_n);
            std::fill(acc.begin(), acc.end(), W(0));
            if (G.in[0] == 1 && G.k[0] == 1)
              plane_grad_2d(G, is_max, xv.data(), gv.data(), acc.data(), rows);
            else
              plane_grad_nd(G, is_max, xv.data(), gv.data(), acc.data(), pos);
            store_row<W>(dxp + pl * in_n * di, di, dx.dtype, acc.data(), in_n);
          }
        }
        st->dx.commit(a);
      });
    });
    return k;
  };
}

const RegisterKernel pool_grad_ops[] = {
    {{"max_pool_grad"}, pool_grad(true)},
    {{"average_pool_grad"}, pool_grad(false)},
};

}  // namespace
}  // namespace popxl
