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

#include "loops.hpp"

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
// x is (N, C, S...) seen as (N, G, C/G * S); statistics per (n, g), affine per channel.
struct Groups {
  int64_t N, C, G, S;
  int64_t per_group() const { return C / G * S; }
};

Groups groups_of(const Buffer& x, int64_t G) { return {x.shape[0], x.shape[1], G, prod(x.shape, 2)}; }

// Mean and biased variance of each group, in float64.
template <class W>
void group_stats(const Groups& g, const W* x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t M = g.per_group(), ng = g.N * g.G;
  mean.assign(ng, 0);
  var.assign(ng, 0);
#pragma omp parallel for schedule(static) if (ng * M > 32768)
  for (int64_t j = 0; j < ng; ++j) {
    const W* p = x + j * M;
    double s = 0;
    for (int64_t i = 0; i < M; ++i) s += double(p[i]);
    const double m = M ? s / double(M) : NAN;
    double q = 0;
    for (int64_t i = 0; i < M; ++i) q += (double(p[i]) - m) * (double(p[i]) - m);
    mean[j] = m;
    var[j] = M ? q / double(M) : NAN;
  }
}

KernelFactory group_norm(bool layer) {
  return [layer](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
    const Groups g = groups_of(x, layer ? 1 : ins.attrs.at("num_groups").i());
    const double eps = ins.attrs.at("eps").f();
    unique_ptr<Kernel> k;
    dispatch_wide(x.dtype, [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State { Packed x, y, w, b; std::vector<W> xv, wv, bv; std::vector<double> mean, var; };
      auto st = std::make_shared<State>();
      st->x = Packed(x);
      st->y = Packed(y);
      st->w = Packed(bufs[ins.inputs[1]]);
      st->b = Packed(bufs[ins.inputs[2]]);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        read_all(a, st->x, st->xv);
        read_all(a, st->w, st->wv);
        read_all(a, st->b, st->bv);
        group_stats(g, st->xv.data(), st->mean, st->var);
        W* v = st->xv.data();
        const int64_t cpg = g.C / g.G;
        // One square root per group (a layer norm's group is a whole row of channels).
#pragma omp parallel for schedule(static) if (g.N * g.C * g.S > 32768)
        for (int64_t j = 0; j < g.N * g.G; ++j) {
          const W m = W(st->mean[j]), r = std::sqrt(W(st->var[j]) + W(eps));
          const int64_t c0 = j % g.G * cpg;
          W* group = v + j * cpg * g.S;
          for (int64_t c = c0; c < c0 + cpg; ++c) {
            const W w = st->wv[c], b = st->bv[c];
            W* row = group + (c - c0) * g.S;
            for (int64_t i = 0; i < g.S; ++i) row[i] = (row[i] - m) / r * w + b;
          }
        }
        write_all(a, st->y, st->xv);
      });
    });
    return k;
  };
}

const RegisterKernel group_norm_ops[] = {
    {{"group_norm"}, group_norm(false)},
    {{"layer_norm"}, group_norm(true)},
};

// (dx, dweight, dbias) with the statistics recomputed from x; all in float64, rounded once.
const RegisterKernel group_norm_grad_op{{"group_norm_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]];
  if (!dispatch_float(x.dtype, [](auto) {})) return nullptr;
  const Groups g = groups_of(x, ins.attrs.at("num_groups").i());
  const double eps = ins.attrs.at("eps").f();
  struct State {
    Packed x, w, gy, dx, dw, db;
    std::vector<double> xv, wv, gv, mean, var, dwv, dbv, part;
  };
  auto st = std::make_shared<State>();
  st->x = Packed(x);
  st->w = Packed(bufs[ins.inputs[1]]);
  st->gy = Packed(bufs[ins.inputs[2]]);
  st->dx = Packed(bufs[ins.outputs[0]]);
  st->dw = Packed(bufs[ins.outputs[1]]);
  st->db = Packed(bufs[ins.outputs[2]]);
  return std::make_unique<FnKernel>([st, g, eps](uint8_t* a) {
    read_all(a, st->x, st->xv);
    read_all(a, st->w, st->wv);
    read_all(a, st->gy, st->gv);
    group_stats(g, st->xv.data(), st->mean, st->var);
    const int64_t M = g.per_group(), CS = g.C * g.S, cpg = g.C / g.G;
    std::vector<double>& xs = st->xv;  // becomes xhat, then dx
    // Groups are independent except for dweight/dbias, which sum over the batch: each thread sums
    // its own share, and the shares are added in thread order afterwards (deterministic).
    const bool parallel = g.N * g.G > 1 && g.N * CS > 32768;
    const int threads = parallel ? omp_get_max_threads() : 1;
    st->part.assign(size_t(threads) * 2 * g.C, 0.0);
#pragma omp parallel num_threads(threads) if (parallel)
    {
      double* dw = st->part.data() + size_t(omp_get_thread_num()) * 2 * g.C;
      double* db = dw + g.C;
#pragma omp for schedule(static)
      for (int64_t j = 0; j < g.N * g.G; ++j) {
        const int64_t n = j / g.G, gi = j % g.G;
        const double m = st->mean[j], r = 1.0 / std::sqrt(st->var[j] + eps);
        double sum_d = 0, sum_dx = 0;  // sums of dxhat and dxhat * xhat over the group
        for (int64_t c = gi * cpg; c < (gi + 1) * cpg; ++c) {
          double* xr = xs.data() + n * CS + c * g.S;
          const double* gr = st->gv.data() + n * CS + c * g.S;
          for (int64_t i = 0; i < g.S; ++i) {
            xr[i] = (xr[i] - m) * r;
            dw[c] += gr[i] * xr[i];
            db[c] += gr[i];
            const double d = gr[i] * st->wv[c];
            sum_d += d;
            sum_dx += d * xr[i];
          }
        }
        const double md = sum_d / double(M), mdx = sum_dx / double(M);
        for (int64_t c = gi * cpg; c < (gi + 1) * cpg; ++c) {
          double* xr = xs.data() + n * CS + c * g.S;
          const double* gr = st->gv.data() + n * CS + c * g.S;
          for (int64_t i = 0; i < g.S; ++i) xr[i] = (gr[i] * st->wv[c] - md - xr[i] * mdx) * r;
        }
      }
    }
    st->dwv.assign(g.C, 0);
    st->dbv.assign(g.C, 0);
    for (int t = 0; t < threads; ++t)
      for (int64_t c = 0; c < g.C; ++c) {
        st->dwv[c] += st->part[size_t(t) * 2 * g.C + c];
        st->dbv[c] += st->part[size_t(t) * 2 * g.C + g.C + c];
      }
    write_all(a, st->dx, xs);
    write_all(a, st->dw, st->dwv);
    write_all(a, st->db, st->dbv);
  });
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
};

NllSpec nll_spec(const OpInstr& ins, const Buffer& probs) {
  NllSpec s;
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
      throw std::invalid_argument("nll_loss: label " + std::to_string(labels[i]) + " is out of range for " +
                                  std::to_string(s.C) + " classes");
    ++count;
  }
  return count;
}

// Per-row losses in W (0 for ignored rows) and the (sum, mean or per-row) output.
template <class W>
void nll_losses(const NllSpec& s, const std::vector<W>& p, const std::vector<int64_t>& labels,
                const std::vector<uint8_t>& keep, int64_t count, std::vector<W>& out) {
  std::vector<W> item(s.rows);
  double total = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    const W picked = keep[r] ? p[r * s.C + labels[r]] : W(0);  // ignored rows may have no class 0
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

KernelFactory nll(Nll which) {
  return [which](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &probs = bufs[ins.inputs[0]], &labels = bufs[ins.inputs[1]];
    if (!is_int(labels.dtype)) return nullptr;
    const NllSpec s = nll_spec(ins, probs);
    unique_ptr<Kernel> k;
    dispatch_wide(probs.dtype, [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State {
        Packed p, l, lg, out0, out1;
        std::vector<W> pv, lgv, res;
        std::vector<int64_t> lab;
        std::vector<uint8_t> keep;
      };
      auto st = std::make_shared<State>();
      st->p = Packed(probs);
      st->l = Packed(labels);
      if (which != Nll::Loss) st->lg = Packed(bufs[ins.inputs[2]]);
      st->out0 = Packed(bufs[ins.outputs[0]]);
      if (which == Nll::SoftmaxGrad) st->out1 = Packed(bufs[ins.outputs[1]]);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        read_all(a, st->p, st->pv);
        st->l.read_ints(a, st->lab);
        const int64_t count = kept_rows(s, st->lab, st->keep);
        if (which != Nll::Loss) read_all(a, st->lg, st->lgv);
        if (which != Nll::Grad) {
          nll_losses(s, st->pv, st->lab, st->keep, count, st->res);
          write_all(a, st->out0, st->res);
        }
        if (which == Nll::Loss) return;
        const std::vector<W> sc = row_scales(s, st->lgv, st->keep, count);
        std::vector<W>& g = st->pv;  // becomes the gradient w.r.t. probs / logits
#pragma omp parallel for schedule(static) if (s.rows > 1 && s.rows * s.C > 32768)
        for (int64_t r = 0; r < s.rows; ++r) {
          W* row = g.data() + r * s.C;
          if (s.C == 0) continue;
          if (which == Nll::SoftmaxGrad) {  // (softmax - onehot) * scale
            row[st->lab[r]] = row[st->lab[r]] - W(1);
            for (int64_t c = 0; c < s.C; ++c) row[c] = row[c] * sc[r];
            continue;
          }
          // d(-log max(p, eps))/dp = -1/p above eps, 0 where the clamp holds; only at the label
          const W picked = row[st->lab[r]];
          W local = W(-1);
          if (!s.log_prob) local = picked > W(s.eps) ? W(-1) / std::max(picked, W(s.eps)) : W(0);
          std::fill(row, row + s.C, W(0));
          row[st->lab[r]] = st->keep[r] ? sc[r] * local : W(0);
        }
        write_all(a, which == Nll::Grad ? st->out0 : st->out1, g);
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

// f(plane, output index within the plane, input indices of the window in C order, -1 = padding)
template <class F>
void each_window(const PoolGeom& G, F&& f) {
  std::vector<int64_t> pos(G.k[0] * G.k[1] * G.k[2]);
  for (int64_t pl = 0; pl < G.planes; ++pl)
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
          f(pl, o, pos);
        }
}

KernelFactory pool_grad(bool is_max) {
  return [is_max](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &g = bufs[ins.inputs[1]], &dx = bufs[ins.outputs[0]];
    const PoolGeom G = pool_geom(ins, x, g);
    unique_ptr<Kernel> k;
    dispatch_wide(g.dtype, [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State { Packed x, g, dx; std::vector<W> xv, gv, acc; };
      auto st = std::make_shared<State>();
      st->x = Packed(x);
      st->g = Packed(g);
      st->dx = Packed(dx);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        if (is_max) read_all(a, st->x, st->xv);
        read_all(a, st->g, st->gv);
        st->acc.assign(dx.nelms, W(0));
        const int64_t in_n = G.in_size(), out_n = G.out_size();
        each_window(G, [&](int64_t pl, int64_t o, const std::vector<int64_t>& pos) {
          const W gv = st->gv[pl * out_n + o];
          W* acc = st->acc.data() + pl * in_n;
          if (is_max) {  // the first maximum (padding is -inf; NaN wins at once, as np.argmax)
            const W* xv = st->xv.data() + pl * in_n;
            size_t best = 0;
            W bv = pos[0] >= 0 ? xv[pos[0]] : -INFINITY;
            for (size_t w = 1; w < pos.size() && bv == bv; ++w) {
              const W v = pos[w] >= 0 ? xv[pos[w]] : -INFINITY;
              if (v > bv || v != v) { best = w; bv = v; }
            }
            if (pos[best] >= 0) acc[pos[best]] += gv;
            return;
          }
          W count = 0;  // positions inside the input
          for (int64_t q : pos) count += q >= 0;
          const W share = gv / count;
          for (int64_t q : pos)
            if (q >= 0) acc[q] += share;
        });
        write_all(a, st->dx, st->acc);
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
