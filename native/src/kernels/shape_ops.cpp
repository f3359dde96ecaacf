// Data movement with run-time indices or several operands: concat, split, gather (plain, tied,
// grouped) and its gradient, scatter, dynamic_slice/dynamic_update, onehot; plus init and
// increment_mod. Moves are byte copies, so every dtype is handled and results are bit-identical.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- concat / split -----------------------------------------------------------------------------
// Both copy between whole operands and windows of the joined tensor along the axis.
KernelFactory join_or_cut(bool join) {
  return [join](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer whole = bufs[join ? ins.outputs[0] : ins.inputs[0]];
    const auto& part_ids = join ? ins.inputs : ins.outputs;
    const size_t axis = static_cast<size_t>(ins.attr_int("axis") + (ins.attr_int("axis") < 0 ? whole.shape.size() : 0));
    std::vector<std::pair<Buffer, Buffer>> moves;  // (part, window)
    int64_t start = 0;
    for (int id : part_ids) {
      const Buffer& part = bufs[id];
      moves.emplace_back(part, window(whole, axis, start, part.shape[axis]));
      start += part.shape[axis];
    }
    return std::make_unique<FnKernel>([moves, join](uint8_t* a) {
      for (auto& [part, win] : moves) {
        if (join) copy_buffer(a, win, a, part);
        else copy_buffer(a, part, a, win);
      }
    });
  };
}

const RegisterKernel join_ops[] = {
    {{"concat", "concat_"}, join_or_cut(true)},
    {{"split"}, join_or_cut(false)},
};

// ---- gather -----------------------------------------------------------------------------------
// x viewed as (groups, pre, D, post) and indices as (groups, K): out[g, p, k] = x[g, p, idx[g, k]]
// (a row of `post` elements), zeros for indices outside [-D, D), or outside [0, D) without `wrap`
// (zero_OOR: vocabulary-sharded embeddings rely on negative indices giving 0).
struct Gather {
  int64_t groups, pre, D, K, row;  // row: bytes of `post` elements
  bool wrap;  // negative indices count from the end
  void run(const uint8_t* x, const int64_t* idx, uint8_t* out) const {
    // Rows of 1, 2, 4 or 8 bytes (a gather along the last axis) move as one value each, not as a
    // memcpy call each.
    switch (row) {
      case 1: return rows<uint8_t>(x, idx, out);
      case 2: return rows<uint16_t>(x, idx, out);
      case 4: return rows<uint32_t>(x, idx, out);
      case 8: return rows<uint64_t>(x, idx, out);
      default: return rows<void>(x, idx, out);
    }
  }

 private:
  // Output rows [r0, r1) of the (groups * pre * K) in order; the threads take even shares. The
  // position (g, p, k) of the first is divided out once, the next ones' stepped.
  template <class E>
  void rows(const uint8_t* x, const int64_t* idx, uint8_t* out) const {
    const int64_t total = groups * pre * K;
    if (total == 0) return;
    threads::region([&](int id, int team) {
      const int64_t r0 = total * id / team, r1 = total * (id + 1) / team;
      int64_t k = r0 % K, gp = r0 / K;
      const int64_t* ix = idx + gp / pre * K;
      const uint8_t* line = x + gp * D * row;
      for (int64_t r = r0; r < r1; ++r) {
        int64_t i = ix[k];
        if (wrap && i < 0) i += D;
        uint8_t* dst = out + r * row;
        const bool inside = i >= 0 && i < D;
        if constexpr (std::is_void_v<E>) {
          if (inside) std::memcpy(dst, line + i * row, static_cast<size_t>(row));
          else std::memset(dst, 0, static_cast<size_t>(row));
        } else {  // a memcpy of a constant size: one move, at any alignment
          const E zero = 0;
          std::memcpy(dst, inside ? line + i * row : reinterpret_cast<const uint8_t*>(&zero), sizeof(E));
        }
        if (++k == K) {
          k = 0;
          ++gp;
          line += D * row;
          ix = idx + gp / pre * K;
        }
      }
    }, total * row > (1 << 18));
  }
};

unique_ptr<Kernel> gather_kernel(const Buffer& x, const Buffer& idx, const Buffer& y, Gather g) {
  if (!is_int(idx.dtype)) return nullptr;
  struct State { Packed x, idx, y; std::vector<int64_t> ids; };
  auto st = std::make_shared<State>(State{Packed(x), Packed(idx), Packed(y), {}});
  return std::make_unique<FnKernel>([st, g](uint8_t* a) {
    st->idx.read_ints(a, st->ids);
    g.run(st->x.read(a), st->ids.data(), st->y.write(a));
    st->y.commit(a);
  });
}

KernelFactory gather(bool grouped) {
  return [grouped](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &idx = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    const size_t axis = static_cast<size_t>(ins.attr_int("axis")) + (grouped ? 1 : 0);
    Gather g;
    g.groups = grouped ? x.shape[0] : 1;
    g.pre = prod(x.shape, grouped ? 1 : 0, axis);
    g.D = x.shape[axis];
    g.K = idx.nelms / std::max<int64_t>(g.groups, 1);
    g.row = prod(x.shape, axis + 1) * static_cast<int64_t>(itemsize(x.dtype));
    g.wrap = !ins.attr_bool("zero_OOR");
    return gather_kernel(x, idx, y, g);
  };
}

const RegisterKernel gather_ops[] = {
    {{"gather", "tied_gather"}, gather(false)},
    {{"groupedgather"}, gather(true)},
};

// gather_grad / groupedgather_grad: the gathered gradients summed back into their rows (repeats
// add up), in float32 (float64 for float64 or integer gradients), rounded once.
KernelFactory gather_grad(bool grouped) {
  return [grouped](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &g = bufs[ins.inputs[0]], &idx = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    if (!is_int(idx.dtype) || !is_numeric(g.dtype) || g.dtype == DType::Bool) return nullptr;
    const size_t first = grouped ? 1 : 0, axis = first + static_cast<size_t>(ins.attr_int("axis"));
    const int64_t groups = grouped ? g.shape[0] : 1;
    const RowScatter rs{groups, prod(g.shape, first, axis), ins.attr_int("size"), prod(idx.shape, first),
                        prod(g.shape, axis + idx.shape.size() - first), !ins.attr_bool("zero_OOR")};
    unique_ptr<Kernel> k;
    auto make = [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State { Packed g, idx, y; std::vector<int64_t> ids; std::vector<W> gw, acc; };
      auto st = std::make_shared<State>(State{Packed(g), Packed(idx), Packed(y), {}, {}, {}});
      // Dense operands already in W are used where they lie (y never shares storage with g).
      const bool g_direct = stored_as<W>(g.dtype) && g.contiguous, y_direct = stored_as<W>(y.dtype) && y.contiguous;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        st->idx.read_ints(a, st->ids);
        const W* src = reinterpret_cast<const W*>(a + g.offset);
        if (!g_direct) {
          read_all(a, st->g, st->gw);
          src = st->gw.data();
        }
        W* acc = reinterpret_cast<W*>(a + y.offset);
        if (!y_direct) {
          st->acc.resize(y.nelms);
          acc = st->acc.data();
        }
        std::fill(acc, acc + y.nelms, W(0));
        rs.run(acc, src, st->ids.data(), W(1));
        if (!y_direct) write_all(a, st->y, st->acc);
      });
    };
    if (needs_double({&g})) make(Tag<double>{}); else make(Tag<float>{});
    return k;
  };
}

const RegisterKernel gather_grad_ops[] = {
    {{"gather_grad"}, gather_grad(false)},
    {{"groupedgather_grad"}, gather_grad(true)},
};

// ---- scatter: out = t; out[coords with idx along axis] = values (C order, so the last wins) ------
const RegisterKernel scatter_op{{"scatter"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &t = bufs[ins.inputs[0]], &idx = bufs[ins.inputs[1]], &vals = bufs[ins.inputs[2]], &y = bufs[ins.outputs[0]];
  if (!is_int(idx.dtype)) return nullptr;
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  struct State { Packed idx, vals; std::vector<int64_t> ids; };
  auto st = std::make_shared<State>(State{Packed(idx), Packed(vals), {}});
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    st->idx.read_ints(a, st->ids);  // read indices and values before t's copy may overwrite them
    const uint8_t* v = st->vals.read(a);
    if (v == a + vals.offset && vals.nelms) {  // values live in the arena: keep a copy
      st->vals.scratch.assign(v, v + vals.nbytes());
      v = st->vals.scratch.data();
    }
    copy_buffer(a, y, a, t);
    const size_t rank = idx.shape.size(), item = itemsize(y.dtype);
    std::vector<int64_t> c(rank, 0);
    for (int64_t e = 0; e < idx.nelms; ++e) {
      int64_t i = st->ids[e];
      if (i < 0) i += y.shape[axis];
      if (i >= 0 && i < y.shape[axis]) {
        int64_t off = y.offset;
        for (size_t d = 0; d < rank; ++d) off += (d == axis ? i : c[d]) * y.strides[d];
        std::memcpy(a + off, v + e * item, item);
      }
      for (size_t d = rank; d-- > 0;) {  // next C-order coordinate
        if (++c[d] < idx.shape[d]) break;
        c[d] = 0;
      }
    }
  });
}};

// Indices expanded to `shape` as scatter_reduce expands them: the same shape, a 1-D list of
// positions along the axis, or trailing dimensions padded with 1 and broadcast. Returns element
// strides into the packed indices (0 on broadcast dims).
std::vector<int64_t> expanded_index_strides(const std::vector<int64_t>& idx_shape, const std::vector<int64_t>& shape,
                                            size_t axis) {
  std::vector<int64_t> vshape = idx_shape;
  if (idx_shape != shape) {
    if (idx_shape.size() == 1 && shape.size() > 1 && idx_shape[0] == shape[axis]) {
      vshape.assign(shape.size(), 1);
      vshape[axis] = idx_shape[0];
    } else {
      vshape.resize(shape.size(), 1);
    }
  }
  Buffer view;
  view.shape = vshape;
  view.strides = packed_strides(vshape, 1);
  return broadcast_strides(view, shape);
}

// Visit every element (C order) of `shape`: f(flat index, index element offset, coordinates).
template <class F>
void each_coordinate(const std::vector<int64_t>& shape, const std::vector<int64_t>& istr, F&& f) {
  const int64_t n = prod(shape);
  std::vector<int64_t> c(shape.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t ii = 0;
    for (size_t d = 0; d < shape.size(); ++d) ii += c[d] * istr[d];
    f(e, ii, c);
    for (size_t d = shape.size(); d-- > 0;) {  // next C-order coordinate
      if (++c[d] < shape[d]) break;
      c[d] = 0;
    }
  }
}

// Element offset (packed, element units) of coordinates `c` with the axis coordinate replaced by
// index i, or -1 when i (negative counting from the end) is outside [0, dim).
int64_t target(const std::vector<int64_t>& c, size_t axis, int64_t i, const std::vector<int64_t>& shape,
               const std::vector<int64_t>& strides) {
  if (i < 0) i += shape[axis];
  if (i < 0 || i >= shape[axis]) return -1;
  int64_t off = 0;
  for (size_t d = 0; d < c.size(); ++d) off += (d == axis ? i : c[d]) * strides[d];
  return off;
}

// ---- gather_elements: out[c] = g[c with the axis coordinate replaced by idx[c]], 0 out of range ----
// With data_shape, idx is first expanded to it.
const RegisterKernel gather_elements_op{{"gather_elements"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &g = bufs[ins.inputs[0]], &idx = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
  if (!is_int(idx.dtype)) return nullptr;
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  const auto istr = expanded_index_strides(idx.shape, y.shape, axis), gstr = packed_strides(g.shape, 1);
  struct State { Packed g, idx, y; std::vector<int64_t> ids; };
  auto st = std::make_shared<State>(State{Packed(g), Packed(idx), Packed(y), {}});
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    st->idx.read_ints(a, st->ids);
    const uint8_t* gv = st->g.read(a);
    uint8_t* out = st->y.write(a);
    const size_t item = itemsize(y.dtype);
    each_coordinate(y.shape, istr, [&](int64_t e, int64_t ii, const std::vector<int64_t>& c) {
      const int64_t gi = target(c, axis, st->ids[ii], g.shape, gstr);
      if (gi >= 0) std::memcpy(out + e * item, gv + gi * item, item);
      else std::memset(out + e * item, 0, item);
    });
    st->y.commit(a);
  });
}};

// ---- scatter_reduce: data's elements reduced into the places their (expanded) indices name --------
// In data's C order, as ufunc.at does: with initial values they take part; without, places no
// index names are 0. "none" writes (the last one wins).
enum class Scatter { None, Sum, Max, Min };

template <class T>
T combine(Scatter r, T acc, T v) {
  if constexpr (std::is_integral_v<T>) {
    if (r == Scatter::Sum) return static_cast<T>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));  // wraps
  } else {
    using W = typename Wide<T>::type;
    if (r == Scatter::Sum) return T(W(acc) + W(v));
    if (W(acc) != W(acc) || W(v) != W(v)) return T(NAN);  // np.maximum / np.minimum keep NaN
  }
  if (r == Scatter::Max) return v > acc ? v : acc;
  if (r == Scatter::Min) return v < acc ? v : acc;
  return v;
}

const RegisterKernel scatter_reduce_op{{"scatter_reduce"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &data = bufs[ins.inputs[0]], &idx = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
  if (!is_int(idx.dtype)) return nullptr;
  const bool has_init = ins.inputs.size() > 2;
  const Buffer init = has_init ? bufs[ins.inputs[2]] : Buffer{};
  const std::string& rn = ins.attr_str("reduction");
  const Scatter r = rn == "sum" ? Scatter::Sum : rn == "max" ? Scatter::Max : rn == "min" ? Scatter::Min : Scatter::None;
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  const auto istr = expanded_index_strides(idx.shape, data.shape, axis), ystr = packed_strides(y.shape, 1);
  unique_ptr<Kernel> k;
  dispatch_arith(data.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    struct State { Packed data, idx, init, y; std::vector<int64_t> ids; std::vector<uint8_t> hit; };
    auto st = std::make_shared<State>(State{Packed(data), Packed(idx), Packed(init), Packed(y), {}, {}});
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      st->idx.read_ints(a, st->ids);
      const T* src = reinterpret_cast<const T*>(st->data.read(a));
      std::vector<T> acc(y.nelms, T(0));
      if (has_init) std::memcpy(acc.data(), st->init.read(a), y.nbytes());
      // max/min without initial values: the first value replaces the 0 (as it beats the identity)
      st->hit.assign(y.nelms, has_init || r == Scatter::None || r == Scatter::Sum);
      each_coordinate(data.shape, istr, [&](int64_t e, int64_t ii, const std::vector<int64_t>& c) {
        const int64_t t = target(c, axis, st->ids[ii], y.shape, ystr);
        if (t < 0) return;
        acc[t] = st->hit[t] ? combine(r, acc[t], src[e]) : src[e];
        st->hit[t] = 1;
      });
      std::memcpy(st->y.write(a), acc.data(), y.nbytes());
      st->y.commit(a);
    });
  });
  return k;
}};

// ---- dynamic_slice / dynamic_update -------------------------------------------------------------
// The region starts at the run-time offsets, clamped so that it stays inside the tensor.
struct Region {
  std::vector<int64_t> axes, sizes;
  Buffer in(uint8_t* arena, const Buffer& b, Packed& offsets, std::vector<int64_t>& scratch) const {
    offsets.read_ints(arena, scratch);
    Buffer v = b;
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t ax = static_cast<size_t>(axes[k]);
      const int64_t start = std::min(std::max<int64_t>(scratch[k], 0), b.shape[ax] - sizes[k]);
      v = window(v, ax, start, sizes[k]);
    }
    return v;
  }
};

KernelFactory dynamic(bool update) {
  return [update](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &t = bufs[ins.inputs[0]], &index = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    if (!is_int(index.dtype)) return nullptr;
    const Region r{ins.attr_ints("axes"), ins.attr_ints("sizes")};
    const Buffer upd = update ? bufs[ins.inputs[2]] : Buffer{};
    struct State { Packed offsets; std::vector<int64_t> ids; };
    auto st = std::make_shared<State>(State{Packed(index), {}});
    return std::make_unique<FnKernel>([=](uint8_t* a) {
      if (!update) {
        copy_buffer(a, y, a, r.in(a, t, st->offsets, st->ids));
        return;
      }
      const Buffer dst = r.in(a, y, st->offsets, st->ids);  // offsets read before t is copied over
      copy_buffer(a, y, a, t);
      copy_buffer(a, dst, a, upd);
    });
  };
}

const RegisterKernel dynamic_ops[] = {
    {{"dynamic_slice"}, dynamic(false)},
    {{"dynamic_update", "dynamic_update_"}, dynamic(true)},
};

// ---- onehot: out[p, c, q] = values[idx[p, q] == c]; out-of-range indices give an all-off row ----
const RegisterKernel onehot_op{{"onehot"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &t = bufs[ins.inputs[0]], &values = bufs[ins.inputs[2]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(t.dtype) || t.dtype == DType::Bool) return nullptr;
  const int64_t C = ins.attr_int("num_classes"), rank = static_cast<int64_t>(t.shape.size());
  const int64_t ax = ((ins.attr_int("axis") % (rank + 1)) + rank + 1) % (rank + 1);
  const int64_t pre = prod(t.shape, 0, ax), post = prod(t.shape, ax);
  struct State { Packed t, values, y; std::vector<double> idx; };
  auto st = std::make_shared<State>(State{Packed(t), Packed(values), Packed(y), {}});
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    // Indices as float64 (exact for any class count), truncated toward zero like np.trunc.
    st->idx.resize(t.nelms);
    load_row<double>(st->t.read(a), static_cast<int64_t>(itemsize(t.dtype)), t.dtype, st->idx.data(), t.nelms);
    const size_t item = itemsize(y.dtype);
    const uint8_t* v = st->values.read(a);
    std::vector<uint8_t> off(v, v + item), on(v + item, v + 2 * item);
    uint8_t* out = st->y.write(a);
    for (int64_t p = 0; p < pre; ++p)
      for (int64_t q = 0; q < post; ++q) {
        double i = std::trunc(st->idx[p * post + q]);
        if (i < 0) i += double(C);
        const int64_t hot = (i >= 0 && i < double(C)) ? static_cast<int64_t>(i) : -1;  // NaN: none
        for (int64_t c = 0; c < C; ++c)
          std::memcpy(out + ((p * C + c) * post + q) * item, (c == hot ? on : off).data(), item);
      }
    st->y.commit(a);
  });
}};

// ---- init / increment_mod ---------------------------------------------------------------------
const RegisterKernel init_op{{"init"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  auto y = std::make_shared<Packed>(bufs[ins.outputs[0]]);
  return std::make_unique<FnKernel>([y](uint8_t* a) {
    // "undef" is zeros too, as in the reference; a size-0 tensor has no storage (null pointer).
    if (y->buf.nbytes()) std::memset(y->write(a), 0, y->buf.nbytes());
    y->commit(a);
  });
}};

// (x + increment) fmod modulus: integers in int64, floats in at least float32, rounded once.
const RegisterKernel increment_mod_op{{"increment_mod", "increment_mod_"},
  [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
    if (!is_numeric(x.dtype) || x.dtype == DType::Bool) return nullptr;
    const double inc = ins.attr_float("increment"), mod = ins.attr_float("modulus");
    if (is_int(x.dtype)) {
      const int64_t ii = ins.attr_int("increment"), im = ins.attr_int("modulus");
      return std::make_unique<FnKernel>([=](uint8_t* a) {
        map_rows<int64_t, 1>(a, y, {x}, [&](int64_t* out, const int64_t* const* in, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            const int64_t s = static_cast<int64_t>(static_cast<uint64_t>(in[0][i]) + static_cast<uint64_t>(ii));
            out[i] = im == -1 ? 0 : s % im;  // C remainder; -1 would overflow INT64_MIN % -1
          }
        });
      });
    }
    unique_ptr<Kernel> k;
    auto make = [&](auto tag) {
      using W = typename decltype(tag)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        map_rows<W, 1>(a, y, {x}, [&](W* out, const W* const* in, int64_t n) {
          for (int64_t i = 0; i < n; ++i) out[i] = std::fmod(in[0][i] + W(inc), W(mod));
        });
      });
    };
    if (x.dtype == DType::F64) make(Tag<double>{}); else make(Tag<float>{});
    return k;
  }};

}  // namespace
}  // namespace popxl
