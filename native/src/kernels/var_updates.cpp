// In-place variable updates and optimiser terms (popxl/ops/var_updates.py). Operands may have
// different numeric dtypes; like the reference, the arithmetic runs in float32, or in float64
// when an operand is float64 or an integer, and the result is rounded once to the output dtype.
// Each formula below spells out the reference's order of operations, so that (built without
// fused multiply-add) the results are bit-identical.
#include <cmath>

#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

bool all_numeric(const OpInstr& ins, const std::vector<Buffer>& bufs) {
  for (int i : ins.inputs)
    if (!is_numeric(bufs[i].dtype)) return false;
  return is_numeric(bufs[ins.outputs[0]].dtype);
}

// A coefficient held in a float16 operand's type (`in_type_of` of popxl/ops/var_updates.py).
template <class W>
W in_type_of(W c, DType dtype) {
  if (dtype != DType::F16) return c;
  if constexpr (std::is_same_v<W, double>) return W(float(f16_of_double(c)));
  else return W(float(static_cast<f16>(c)));
}

// ---- accumulate family: t = formula(t, X, s[, 1 - s]) -----------------------------------------
// `moving`: the moving averages, whose f and 1 - f are held in a float16 accumulator's type.
template <class Formula>
KernelFactory accumulator(bool takes_x, const char* param, Formula formula, bool moving = false) {
  return [=](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    if (!all_numeric(ins, bufs)) return nullptr;
    const Buffer t = bufs[ins.inputs[0]], y = bufs[ins.outputs[0]];
    const Buffer x = takes_x ? bufs[ins.inputs[1]] : t;
    size_t next = takes_x ? 2 : 1;
    const ScalarArg s = param ? scalar_arg(ins, bufs, param, next) : ScalarArg{};
    unique_ptr<Kernel> k;
    with_wide(needs_double({&t, &x}), [&](auto tag) {
      using W = typename decltype(tag)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const W sv = s.get<W>(a);
        const W f = moving ? in_type_of(sv, t.dtype) : sv, g = moving ? in_type_of(W(1) - sv, t.dtype) : W(0);
        map_rows<W, 2>(a, y, {t, x}, [&](W* out, const W* const* in, int64_t n) {
          for (int64_t i = 0; i < n; ++i) out[i] = formula(in[0][i], in[1][i], f, g);
        });
      });
    });
    return k;
  };
}

const RegisterKernel accumulators[] = {
    {{"accumulate_"}, accumulator(true, "f", [](auto t, auto x, auto f, auto) { return t + f * x; })},
    {{"accumulate_square_"}, accumulator(true, "f", [](auto t, auto x, auto f, auto) { return t + f * (x * x); })},
    {{"accumulate_mean_"}, accumulator(true, "step", [](auto t, auto x, auto s, auto) {
       using W = decltype(t);
       return t * s / (s + W(1)) + x / (s + W(1));
     })},
    {{"accumulate_moving_average_"}, accumulator(true, "f", [](auto t, auto x, auto f, auto g) {
       return f * t + g * x;
     }, true)},
    {{"accumulate_moving_average_square_"}, accumulator(true, "f", [](auto t, auto x, auto f, auto g) {
       return f * t + g * (x * x);
     }, true)},
    {{"accumulator_scale_"}, accumulator(false, "f", [](auto t, auto, auto f, auto) { return t * f; })},
    {{"accumulator_zero_"}, accumulator(false, nullptr, [](auto t, auto, auto, auto) { return decltype(t)(0); })},
    {{"copy_var_update_"}, accumulator(true, nullptr, [](auto, auto x, auto, auto) { return x; })},
};

// ---- sparse_accumulate_: t[.., indices[j], ..] += f * X[.., j, ..] (out-of-range rows dropped) ----
const RegisterKernel sparse_accumulate_op{{"sparse_accumulate_"},
  [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    if (!all_numeric(ins, bufs)) return nullptr;
    const Buffer t = bufs[ins.inputs[0]], x = bufs[ins.inputs[1]], idx = bufs[ins.inputs[2]], y = bufs[ins.outputs[0]];
    if (!is_int(idx.dtype)) return nullptr;
    size_t next = 3;
    const ScalarArg f = scalar_arg(ins, bufs, "f", next);
    const size_t axis = static_cast<size_t>(ins.attr_int("axis"));
    const RowScatter rs{1, prod(t.shape, 0, axis), t.shape[axis], idx.nelms, prod(t.shape, axis + 1), false};
    unique_ptr<Kernel> k;
    with_wide(needs_double({&t, &x}), [&](auto tag) {
      using W = typename decltype(tag)::type;
      struct State { Packed t, x, idx, y; std::vector<W> acc, rows; std::vector<int64_t> ids; };
      auto st = std::make_shared<State>(State{Packed(t), Packed(x), Packed(idx), Packed(y), {}, {}, {}});
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        read_all(a, st->t, st->acc);
        read_all(a, st->x, st->rows);
        st->idx.read_ints(a, st->ids);
        rs.run(st->acc.data(), st->rows.data(), st->ids.data(), f.get<W>(a));
        write_all(a, st->y, st->acc);
      });
    });
    return k;
  }};

// ---- Adam / LAMB / AdaMax update terms --------------------------------------------------------
enum class Mode { Adam, Lamb, AdaMax };

KernelFactory updater(Mode mode) {
  return [mode](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    if (!all_numeric(ins, bufs)) return nullptr;
    const bool has_weight = ins.attr_bool("has_weight"), has_step = ins.attr_bool("has_step");
    const Buffer m = bufs[ins.inputs[0]], v = bufs[ins.inputs[1]], y = bufs[ins.outputs[0]];
    size_t next = 2;
    const Buffer w = has_weight ? bufs[ins.inputs[next++]] : m;
    const Buffer step = has_step ? bufs[ins.inputs[next++]] : Buffer{};
    const ScalarArg wd = scalar_arg(ins, bufs, "weight_decay", next), b1 = scalar_arg(ins, bufs, "beta1", next),
                    b2 = scalar_arg(ins, bufs, "beta2", next), eps = scalar_arg(ins, bufs, "epsilon", next);
    const bool wide = needs_double({&m, &v}) || (has_weight && needs_double({&w}));
    unique_ptr<Kernel> k;
    with_wide(wide, [&](auto tag) {
      using W = typename decltype(tag)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        // Coefficients are formed in float64 and rounded to W, as the reference does.
        const W wdv = W(wd.get<double>(a)), epsv = W(eps.get<double>(a));
        // the bias corrections held in the moments' types, the quotients rounded to them
        W c1 = 1, c2 = 1;
        if (has_step) {
          const double st = load_scalar<double>(a, step);
          c1 = in_type_of(W(1.0 - std::pow(b1.get<double>(a), st)), m.dtype);
          if (mode != Mode::AdaMax) c2 = in_type_of(W(1.0 - std::pow(b2.get<double>(a), st)), v.dtype);
        }
        map_rows<W, 3>(a, y, {m, v, w}, [&](W* out, const W* const* in, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            W mw = in[0][i], vw = in[1][i];
            if (has_step) {
              mw = in_type_of(mw / c1, m.dtype);
              if (mode != Mode::AdaMax) vw = in_type_of(vw / c2, v.dtype);
            }
            W u = mode == Mode::AdaMax ? mw / (vw + epsv) : mw / (std::sqrt(vw) + epsv);
            if (has_weight) u = u + wdv * in[2][i];
            out[i] = u;
          }
        });
      });
    });
    return k;
  };
}

const RegisterKernel updaters[] = {
    {{"adam_updater"}, updater(Mode::Adam)},
    {{"lamb_updater"}, updater(Mode::Lamb)},
    {{"adamax_updater"}, updater(Mode::AdaMax)},
};

// ---- t -= learning_rate * trust_ratio * x -----------------------------------------------------
const RegisterKernel adam_var_update_op{{"adam_var_update"},
  [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    if (!all_numeric(ins, bufs)) return nullptr;
    const Buffer t = bufs[ins.inputs[0]], x = bufs[ins.inputs[1]], r1 = bufs[ins.inputs[2]],
                 r2 = bufs[ins.inputs[3]], y = bufs[ins.outputs[0]];
    size_t next = 4;
    const ScalarArg lr = scalar_arg(ins, bufs, "learning_rate", next), mwn = scalar_arg(ins, bufs, "max_weight_norm", next);
    unique_ptr<Kernel> k;
    with_wide(needs_double({&t, &x}), [&](auto tag) {
      using W = typename decltype(tag)::type;
      k = std::make_unique<FnKernel>([=](uint8_t* a) {
        const W lrv = lr.get<W>(a), mwnv = mwn.get<W>(a);
        const double n1 = load_scalar<double>(a, r1), n2 = load_scalar<double>(a, r2);
        W ratio = 1;
        if (!(n1 == 0 || n2 == 0 || mwnv == 0)) {
          const double s1 = std::sqrt(n1), cap = double(mwnv);
          const double lim = (std::isnan(s1) || std::isnan(cap)) ? NAN : std::min(s1, cap);  // np.minimum keeps NaN
          ratio = W(lim / std::sqrt(n2));
        }
        const W step = lrv * ratio;
        map_rows<W, 2>(a, y, {t, x}, [&](W* out, const W* const* in, int64_t n) {
          for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] - step * in[1][i];
        });
      });
    });
    return k;
  }};

}  // namespace
}  // namespace popxl
