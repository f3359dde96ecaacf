// Normalisations: batch_norm_inference, group_norm/layer_norm and their gradient. Compute type W
// is float32 for float16 and the dtype itself otherwise, as in the reference. Per-element formulas
// keep the reference's order of operations; the statistics accumulate in float64, which is at
// least as exact as NumPy's pairwise sums, so those results agree to rounding rather than bit for
// bit.
//
// The normalisations are hand loops rather than oneDNN primitives: oneDNN's layer norm works on
// the last axis (ours normalises everything but the batch axis with per-channel affine) and its
// batch norm folds scale/sqrt(var) into one factor, which rounds differently from the reference.

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

// ---- batch_norm_inference: scale * (x - mean) / sqrt(var + eps) + bias ----------------------------
const RegisterKernel batch_norm_op{{"batch_norm_inference"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  const double eps = ins.attr_float("epsilon");
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
      threads::for_each(N * C, [&](int64_t nc) {
        const int64_t c = nc % C;
        const W s = sc[c], m = mu[c], r = std::sqrt(va[c] + W(eps)), b = bi[c];
        W* row = v.data() + nc * S;
        for (int64_t i = 0; i < S; ++i) row[i] = s * (row[i] - m) / r + b;
      }, N * C * S > 32768);
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
    const Groups g = groups_of(x, layer ? 1 : ins.attr_int("num_groups"));
    const double eps = ins.attr_float("eps");
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
        const bool parallel = g.count() > 1 && g.N * g.C * g.S > kParallelElements;
        threads::region([&](int id, int team) {
          std::vector<W> in_tmp, out_tmp;
          for (int64_t j : threads::share(g.count(), id, team)) {
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
        }, parallel);
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
  const Groups g = groups_of(x, ins.attr_int("num_groups"));
  const double eps = ins.attr_float("eps");
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
      const int team_size = parallel ? threads::max_threads() : 1;
      st->part.assign(size_t(team_size) * 2 * g.C, 0.0);
      threads::region([&](int id, int team) {
        double* dw = st->part.data() + size_t(id) * 2 * g.C;
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
        for (int64_t j : threads::share(g.count(), id, team)) {
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
      }, parallel, team_size);
      st->dwv.assign(g.C, 0);
      st->dbv.assign(g.C, 0);
      for (int t = 0; t < team_size; ++t)
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

}  // namespace
}  // namespace popxl
