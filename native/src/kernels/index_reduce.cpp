// Reductions along one axis that are not plain folds: argmax/argmin, cumsum, topk, median; and
// whole-tensor statistics lamb_square and histogram. The tensor is seen as (pre, D, post) around
// the axis.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

struct Lines {
  int64_t pre = 1, D = 1, post = 1;
};

// Axis `dim` of `shape`, or the flattened tensor when dim is None.
Lines lines_of(const std::vector<int64_t>& shape, const AttrValue& dim) {
  if (dim.is_none() || shape.empty()) return {1, prod(shape), 1};
  const size_t d = static_cast<size_t>(dim.i());
  return {prod(shape, 0, d), shape[d], prod(shape, d + 1)};
}

template <class T>
bool isnan_any(T v) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, f16>) return v != v; else return false;
}

// Element offset of the i-th element (C order) of `shape` laid out with element `strides`.
inline int64_t offset_of(int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

// The elements of a buffer as a packed vector of T (its own dtype).
template <class T>
const T* packed_values(uint8_t* arena, Packed& p) { return reinterpret_cast<const T*>(p.read(arena)); }

// The (pre, D, post) lines' work shared out on the threads, big enough (more than
// kParallelElements values): `body(p, q0, n)` takes line p's columns [q0, q0 + n), blocks of up to
// kColumns columns (a row of running state fits on the stack); a whole line (q0 = 0, n = 1) when
// post is 1.
constexpr int64_t kColumns = 256;
template <class F>
void line_blocks(const Lines& l, F body) {
  const int64_t chunks = (l.post + kColumns - 1) / kColumns, blocks = l.pre * chunks;
  threads::for_each(blocks, [&](int64_t b) {
    const int64_t q0 = b % chunks * kColumns;
    body(b / chunks, q0, std::min(kColumns, l.post - q0));
  }, l.pre * l.D * l.post > kParallelElements && blocks > 1);
}

// ---- argmax / argmin: the first extreme wins; NaN counts as the extreme (as NumPy) --------------
// A dense line (along the last axis): its extreme (NaN winning) first, float32 eight lanes at a
// time, then the first position holding it. Other axes: a row of best values and positions per
// step along the axis, the rows' columns independent. Lines or column blocks on both threads.
template <bool kMax, class T>
int64_t first_extreme(const T* line, int64_t D) {
  T m = line[0];
  int64_t i = 0;
#ifdef POPXL_VEC8
  if constexpr (std::is_same_v<T, float>) {
    if (D >= 16) {
      __m256 m8 = _mm256_loadu_ps(line);
      for (i = 8; i + 8 <= D; i += 8) m8 = extreme_lanes<kMax>(m8, _mm256_loadu_ps(line + i));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, m8);
      m = lanes[0];
      for (int j = 1; j < 8; ++j)
        if (more_extreme<kMax>(lanes[j], m)) m = lanes[j];
    }
  }
#endif
  for (; i < D; ++i)
    if (more_extreme<kMax>(line[i], m)) m = line[i];
  // m is one of the line's values: the scans end
  if (isnan_any(m))
    for (i = 0;; ++i)
      if (isnan_any(line[i])) return i;
  for (i = 0;; ++i)
    if (line[i] == m) return i;
}

template <bool kMax, class T>
void arg_extreme_lines(const T* v, const Lines& l, int32_t* out) {
  line_blocks(l, [&](int64_t p, int64_t q0, int64_t n) {
    if (l.post == 1) {
      out[p] = static_cast<int32_t>(first_extreme<kMax>(v + p * l.D, l.D));
      return;
    }
    const T* row = v + p * l.D * l.post + q0;
    T best[kColumns];
    int32_t at[kColumns] = {};
    std::copy(row, row + n, best);
    for (int64_t i = 1; i < l.D; ++i) {
      row += l.post;
      for (int64_t q = 0; q < n; ++q) {
        // a NaN best stays (the first NaN wins): nothing compares better than it
        const bool take = !isnan_any(best[q]) && more_extreme<kMax>(row[q], best[q]);
        best[q] = take ? row[q] : best[q];
        at[q] = take ? static_cast<int32_t>(i) : at[q];
      }
    }
    std::copy(at, at + n, out + p * l.post + q0);
  });
}

KernelFactory arg_extreme(bool is_max) {
  return [is_max](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
    if (y.dtype != DType::I32 || x.nelms == 0) return nullptr;
    const Lines l = lines_of(x.shape, ins.attr_value("dim"));
    unique_ptr<Kernel> k;
    dispatch_arith(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto px = std::make_shared<Packed>(x);
      auto py = std::make_shared<Packed>(y);
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const T* v = packed_values<T>(a, *px);
        int32_t* out = reinterpret_cast<int32_t*>(py->write(a));
        if (is_max) arg_extreme_lines<true>(v, l, out);
        else arg_extreme_lines<false>(v, l, out);
        py->commit(a);
      });
    });
    return k;
  };
}

// ---- cumsum: sequential sums (as np.cumsum), float16 in float32, integers wrapping ----------------
// Each element's sum is the one before plus it, in order, so every split of the work below gives
// the same values. Lines along the last axis (post == 1) are shared out whole among the threads;
// otherwise a step along the axis adds a row of `post` values to a row of running sums, a column
// block at a time (line_blocks).
const RegisterKernel cumsum_op{{"cumsum"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (x.dtype != y.dtype) return nullptr;
  const Lines l = lines_of(x.shape, ins.attr_value("dim"));
  unique_ptr<Kernel> k;
  dispatch_arith(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Integers add in uint64 (wrapping, no signed overflow); the truncation back is NumPy's too.
    using Acc = std::conditional_t<std::is_integral_v<T>, uint64_t, typename Wide<T>::type>;
    auto px = std::make_shared<Packed>(x);
    auto py = std::make_shared<Packed>(y);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      const T* v = packed_values<T>(a, *px);
      T* out = reinterpret_cast<T*>(py->write(a));
      line_blocks(l, [&](int64_t p, int64_t q0, int64_t n) {
        const T* in = v + p * l.D * l.post + q0;
        T* o = out + p * l.D * l.post + q0;
        if (l.post == 1) {  // the running sum in a register
          Acc s = 0;
          for (int64_t i = 0; i < l.D; ++i) {
            s = s + static_cast<Acc>(in[i]);
            o[i] = static_cast<T>(s);
          }
          return;
        }
        Acc s[kColumns] = {};
        for (int64_t i = 0; i < l.D; ++i, in += l.post, o += l.post)
          for (int64_t q = 0; q < n; ++q) {
            s[q] = s[q] + static_cast<Acc>(in[q]);
            o[q] = static_cast<T>(s[q]);
          }
      });
      py->commit(a);
    });
  });
  return k;
}};

// ---- topk: a stable order (ties keep the lower index first; NaN is the largest value) -----------
const RegisterKernel topk_op{{"topk"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &vals = bufs[ins.outputs[0]], &idx = bufs[ins.outputs[1]];
  if (idx.dtype != DType::I32) return nullptr;
  const int64_t K = ins.attr_int("k");
  const bool largest = ins.attr_bool("largest"), sorted = ins.attr_bool("sorted");
  const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
  const Lines l{prod(x.shape, 0, axis), x.shape[axis], prod(x.shape, axis + 1)};
  unique_ptr<Kernel> k;
  dispatch_arith(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto px = std::make_shared<Packed>(x);
    auto pv = std::make_shared<Packed>(vals);
    auto pi = std::make_shared<Packed>(idx);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      const T* v = packed_values<T>(a, *px);
      T* ov = reinterpret_cast<T*>(pv->write(a));
      int32_t* oi = reinterpret_cast<int32_t*>(pi->write(a));
      threads::region([&](int id, int team) {
        std::vector<int64_t> order(l.D);
        for (int64_t line_no : threads::share(l.pre * l.post, id, team)) {
          const int64_t p = line_no / l.post, q = line_no % l.post;
          const T* line = v + p * l.D * l.post + q;
          auto at_ = [&](int64_t i) { return line[i * l.post]; };
          // "i before j": i is strictly better (NaN above every number), or as good and first: the
          // stable order as a total one, so that a partial sort finds its first K
          auto before = [&](int64_t i, int64_t j) {
            const T s = at_(i), t = at_(j);
            const bool ns = isnan_any(s), nt = isnan_any(t);
            if (ns || nt) {
              if (ns != nt) return largest ? ns : nt;
              return i < j;
            }
            if (s != t) return largest ? s > t : s < t;
            return i < j;
          };
          std::iota(order.begin(), order.end(), int64_t{0});
          std::partial_sort(order.begin(), order.begin() + K, order.end(), before);
          if (!sorted) std::sort(order.begin(), order.begin() + K);
          for (int64_t j = 0; j < K; ++j) {
            const int64_t e = (p * K + j) * l.post + q;
            ov[e] = at_(order[j]);
            oi[e] = static_cast<int32_t>(order[j]);
          }
        }
      }, l.pre * l.post > 1 && x.nelms > kParallelElements);
      pv->commit(a);
      pi->commit(a);
    });
  });
  return k;
}};

// ---- median over axes: the middle value, or the mean of the two middle values (in float64, so the
// median of (max, max) is max), NaN when the slice holds a NaN or is empty -------------------------
const RegisterKernel median_op{{"median"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(x.dtype) || x.dtype == DType::Bool) return nullptr;
  std::vector<bool> reduced(x.shape.size(), false);
  for (auto ax : ins.attr_ints("axis")) reduced[static_cast<size_t>(ax)] = true;
  // x as (kept..., reduced...) element strides of the packed input
  const auto st = packed_strides(x.shape, 1);
  std::vector<int64_t> kshape, kstr, rshape, rstr;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    (reduced[d] ? rshape : kshape).push_back(x.shape[d]);
    (reduced[d] ? rstr : kstr).push_back(st[d]);
  }
  const int64_t outer = prod(kshape), count = prod(rshape);
  unique_ptr<Kernel> k;
  with_wide(needs_double({&x}), [&](auto tag) {
    using W = typename decltype(tag)::type;
    struct State { Packed x, y; std::vector<W> xv, out, slice; };
    auto s = std::make_shared<State>();
    s->x = Packed(x);
    s->y = Packed(y);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      read_all(a, s->x, s->xv);
      s->out.resize(outer);
      s->slice.resize(count);
      for (int64_t o = 0; o < outer; ++o) {
        const int64_t base = offset_of(o, kshape, kstr);
        bool nan = count == 0;
        for (int64_t i = 0; i < count; ++i) {
          s->slice[i] = s->xv[base + offset_of(i, rshape, rstr)];
          nan = nan || s->slice[i] != s->slice[i];
        }
        if (nan) { s->out[o] = W(NAN); continue; }
        auto mid = s->slice.begin() + (count - 1) / 2;
        std::nth_element(s->slice.begin(), mid, s->slice.end());
        W v = *mid;
        if (count % 2 == 0) v = W((double(v) + double(*std::min_element(mid + 1, s->slice.end()))) / 2.0);
        s->out[o] = v;
      }
      write_all(a, s->y, s->out);
    });
  });
  return k;
}};

// ---- lamb_square: sum of squares in float64, as float32 -----------------------------------------
const RegisterKernel lamb_square_op{{"lamb_square"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(x.dtype) || y.dtype != DType::F32) return nullptr;
  auto px = std::make_shared<Packed>(x);
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    const uint8_t* v = px->read(a);
    const int64_t item = static_cast<int64_t>(itemsize(x.dtype));
    double buf[256], total = 0;
    for (int64_t i0 = 0; i0 < x.nelms; i0 += 256) {
      const int64_t n = std::min<int64_t>(256, x.nelms - i0);
      load_row<double>(v + i0 * item, item, x.dtype, buf, n);
      for (int64_t i = 0; i < n; ++i) total += buf[i] * buf[i];
    }
    *reinterpret_cast<float*>(a + y.offset) = float(total);
  });
}};

// ---- histogram: bin = number of levels <= value (NaN in the last bin) ----------------------------
const RegisterKernel histogram_op{{"histogram"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(x.dtype) || y.dtype != DType::U32) return nullptr;
  std::vector<double> levels;
  for (double v : ins.attr_floats("levels")) levels.push_back(v);
  const bool absolute = ins.attr_bool("absolute_of_input");
  auto px = std::make_shared<Packed>(x);
  auto py = std::make_shared<Packed>(y);
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    std::vector<double> v(x.nelms);
    load_row<double>(px->read(a), static_cast<int64_t>(itemsize(x.dtype)), x.dtype, v.data(), x.nelms);
    std::vector<uint32_t> counts(levels.size() + 1, 0);
    for (double e : v) {
      if (absolute) e = std::fabs(e);
      const size_t bin = std::isnan(e) ? levels.size()
                                       : static_cast<size_t>(std::upper_bound(levels.begin(), levels.end(), e) - levels.begin());
      ++counts[bin];
    }
    std::memcpy(py->write(a), counts.data(), counts.size() * sizeof(uint32_t));
    py->commit(a);
  });
}};

const RegisterKernel arg_ops[] = {
    {{"argmax"}, arg_extreme(true)},
    {{"argmin"}, arg_extreme(false)},
};

}  // namespace
}  // namespace popxl
