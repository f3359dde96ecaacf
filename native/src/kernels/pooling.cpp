// Pooling kernels: max_pool and average_pool backed by oneDNN (2-D ones in channels-last, where
// oneDNN's kernels are fast), and their gradients as hand loops.
#include <array>
#include <memory>
#include <vector>

#include "onednn.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// 2-D float32 (or float16, computed in float32) pooling in channels-last: oneDNN has only a slow
// reference kernel for NCHW pooling, and the reorders in and out cost less than it does. None are
// needed for operands the arena already holds channels-last.
class ChannelsLastPoolKernel : public Kernel {
 public:
  ChannelsLastPoolKernel(dnnl::algorithm alg, const Buffer& x, const Buffer& y, const std::vector<int64_t>& kernel,
                         const Window& win, bool nhwc_x, bool nhwc_y)
      : x_(x), y_(y) {
    const auto f32 = memory::data_type::f32;
    const memory::desc xd = user_desc(x, nhwc_x), yd = user_desc(y, nhwc_y);
    const memory::desc nhwc(xd.get_dims(), f32, memory::format_tag::nhwc);
    dnnl::pooling_forward::primitive_desc pd(
        cpu(), dnnl::prop_kind::forward_inference, alg, nhwc,
        memory::desc(yd.get_dims(), f32, memory::format_tag::any), win.strides,
        memory::dims(kernel.begin(), kernel.end()), win.dilates, win.pad_l, win.pad_r, user_scratchpad());
    pool_ = Primitive(pd, scratch);
    src_ = ReorderedOperand(xd, pd.src_desc(), false, scratch);
    dst_ = ReorderedOperand(yd, pd.dst_desc(), true, scratch);
    pool_.arg(DNNL_ARG_SRC, src_.inner);
    pool_.arg(DNNL_ARG_DST, dst_.inner);
  }
  void run(uint8_t* arena) override {
    src_.bind(arena + x_.offset, scratch);
    dst_.bind(arena + y_.offset, scratch);
    src_.to_inner(strm_, scratch);
    pool_.execute(strm_, scratch);
    dst_.to_user(strm_, scratch);
    strm_.wait();
  }

 private:
  Buffer x_, y_;
  Primitive pool_;
  ReorderedOperand src_, dst_;
  dnnl::stream strm_{cpu()};
};

// Max pooling: padding never wins. Average pooling: padded positions are not counted.
KernelFactory pooling(dnnl::algorithm alg) {
  return [alg](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
    memory::data_type t;
    if (!dnnl_type(x.dtype, t) || x.nelms == 0 || y.nelms == 0) return nullptr;
    const auto kernel = ins.attr_ints("kernel");
    Window win = window_of(ins, kernel.size());
    fit_right_padding(win, spatial(x.shape), kernel, spatial(y.shape), false);
    const auto nhwc = nhwc_slots(ins, 2);
    if (kernel.size() == 2 && one_float_type({&x, &y})) {
      try {
        return std::make_unique<ChannelsLastPoolKernel>(alg, x, y, kernel, win, nhwc[0], nhwc[1]);
      } catch (const dnnl::error&) {
        // fall through to the plain-layout primitive
      }
    }
    if (nhwc[0] || nhwc[1]) return nullptr;  // the plain primitive reads NCHW; the loader refuses
    try {
      auto k = std::make_unique<DnnlKernel>();
      k->single_thread = y.nelms * prod(kernel) < kSingleThreadWork;
      SingleThreadScope scope(k->single_thread);
      auto xd = md(x.shape, elem_strides(x), t), yd = md(y.shape, elem_strides(y), t);
      k->add(DNNL_ARG_SRC, xd, x);
      k->add(DNNL_ARG_DST, yd, y, true);
      k->use(Primitive(dnnl::pooling_forward::primitive_desc(
                           cpu(), dnnl::prop_kind::forward_inference, alg, xd, yd, win.strides,
                           memory::dims(kernel.begin(), kernel.end()), win.dilates, win.pad_l, win.pad_r,
                           user_scratchpad()),
                       k->scratch));
      return k;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  };
}

const RegisterKernel pool_ops[] = {
    {{"max_pool"}, pooling(dnnl::algorithm::pooling_max)},
    {{"average_pool"}, pooling(dnnl::algorithm::pooling_avg_exclude_padding)},
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
  const auto k = ins.attr_ints("kernel"), s = ins.attr_ints("strides"), d = ins.attr_ints("dilations"),
             p = ins.attr_ints("pads");
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
        threads::region([&](int id, int team) {
          std::vector<W> xv(is_max ? in_n : 0), gv(out_n), acc(in_n);
          std::vector<int64_t> pos;
          PoolRows<W> rows;
          for (int64_t pl : threads::share(G.planes, id, team)) {
            if (is_max) load_row<W>(xp + pl * in_n * xi, xi, x.dtype, xv.data(), in_n);
            load_row<W>(gp + pl * out_n * gi, gi, g.dtype, gv.data(), out_n);
            std::fill(acc.begin(), acc.end(), W(0));
            if (G.in[0] == 1 && G.k[0] == 1)
              plane_grad_2d(G, is_max, xv.data(), gv.data(), acc.data(), rows);
            else
              plane_grad_nd(G, is_max, xv.data(), gv.data(), acc.data(), pos);
            store_row<W>(dxp + pl * in_n * di, di, dx.dtype, acc.data(), in_n);
          }
        }, G.planes > 1 && G.planes * (in_n + out_n * static_cast<int64_t>(G.k[0] * G.k[1] * G.k[2])) > kSingleThreadWork);
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
