// Resampling: interpolate (ONNX Resize with scales) and roi_align, with their gradients.
//
// interpolate works one axis at a time as the reference does: each axis maps its output positions
// to input coordinates and turns each coordinate into a few input taps with weights (the same
// float64 arithmetic, in the same order). "nearest" is a gather of elements, so it moves bytes and
// is bit-identical for every dtype; linear and cubic compute in float64 and round once, so they
// are bit-identical too. The gradients apply the transposed taps; their sums run in another order
// than the reference's BLAS contractions, so they agree to rounding.
//
// roi_align averages bilinear samples of boxes; the per-sample arithmetic follows the reference
// (weights in float64, rounded to the compute type, products and sums in it), the bin means are
// taken in float64 and rounded once.
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "fp8.hpp"
#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- float64 staging that also covers the float8 formats ------------------------------------------
// A buffer's elements in C order as float64 (float8 decoded), and back (rounded as astype does).
void read_doubles(uint8_t* arena, Packed& p, std::vector<double>& out) {
  if (!is_fp8(p.buf.dtype)) return read_all<double>(arena, p, out);
  out.resize(p.buf.nelms);
  fp8_format(p.buf.dtype).decode_row(p.read(arena), out.data(), p.buf.nelms);
}

void write_doubles(uint8_t* arena, Packed& p, const std::vector<double>& v) {
  if (!is_fp8(p.buf.dtype)) return write_all<double>(arena, p, v);
  fp8_format(p.buf.dtype).round_row(v.data(), p.write(arena), p.buf.nelms);
  p.commit(arena);
}

bool is_float_or_fp8(DType d) { return d == DType::F16 || d == DType::F32 || d == DType::F64 || is_fp8(d); }

// ---- interpolate: the taps of one axis ----------------------------------------------------------
enum class Resize { Nearest, Linear, Cubic };
enum class Rounding { PreferFloor, PreferCeil, Floor, Ceil };
enum class Coords { HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric, TfCropAndResize };

struct ResizeSpec {
  Resize mode = Resize::Nearest;
  Rounding rounding = Rounding::PreferFloor;
  Coords coords = Coords::HalfPixel;
  std::vector<double> scales;
};

template <class E>
E pick(const std::string& value, std::initializer_list<std::pair<const char*, E>> choices, const char* what) {
  for (auto& [name, e] : choices)
    if (value == name) return e;
  throw std::invalid_argument(std::string("interpolate: unknown ") + what + " '" + value + "'");
}

ResizeSpec resize_spec(const OpInstr& ins) {
  ResizeSpec s;
  s.mode = pick<Resize>(ins.attr_str("mode"),
                        {{"nearest", Resize::Nearest}, {"linear", Resize::Linear}, {"cubic", Resize::Cubic}}, "mode");
  s.rounding = pick<Rounding>(ins.attr_str("nearest_mode"),
                              {{"round_prefer_floor", Rounding::PreferFloor}, {"round_prefer_ceil", Rounding::PreferCeil},
                               {"floor", Rounding::Floor}, {"ceil", Rounding::Ceil}}, "nearest_mode");
  s.coords = pick<Coords>(ins.attr_str("coordinate_transformation_mode"),
                          {{"half_pixel", Coords::HalfPixel}, {"pytorch_half_pixel", Coords::PytorchHalfPixel},
                           {"align_corners", Coords::AlignCorners}, {"asymmetric", Coords::Asymmetric},
                           {"tf_crop_and_resize", Coords::TfCropAndResize}}, "coordinate_transformation_mode");
  for (double f : ins.attr_floats("scale_factor")) s.scales.push_back(f);
  return s;
}

// Output position o of an axis reads input positions index[o * taps + t] with weights
// weight[o * taps + t] (nearest: one tap of weight 1). `identity`: the axis is left as it is.
struct AxisTaps {
  bool identity = false;
  int64_t n_in = 0, n_out = 0, taps = 1;
  std::vector<int64_t> index;
  std::vector<double> weight;
};

// The input coordinate of output position x (float64, in the reference's order of operations).
double source_coord(double x, int64_t n_in, int64_t n_out, double scale, Coords mode) {
  switch (mode) {
    case Coords::HalfPixel: return (x + 0.5) / scale - 0.5;
    case Coords::PytorchHalfPixel: return n_out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case Coords::Asymmetric: return x / scale;
    default: break;
  }
  if (n_out == 1) return mode == Coords::AlignCorners ? 0.0 : 0.5 * double(n_in - 1);
  // ONNX divides by the unrounded resized length n_in * scale, not the floored n_out
  return x * double(n_in - 1) / (double(n_in) * scale - 1.0);
}

// Keys cubic convolution kernel (a = -0.75) at distance d.
double cubic_weight(double d) {
  const double a = -0.75;
  d = std::fabs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0.0;
}

AxisTaps axis_taps(int64_t n_in, double scale, const ResizeSpec& s) {
  AxisTaps t;
  t.n_in = n_in;
  t.n_out = static_cast<int64_t>(std::floor(double(n_in) * scale));
  t.identity = t.n_out == n_in && scale == 1.0;
  if (t.identity) return t;
  t.taps = s.mode == Resize::Nearest ? 1 : s.mode == Resize::Linear ? 2 : 4;
  t.index.resize(t.n_out * t.taps);
  t.weight.resize(t.n_out * t.taps);
  const double last = double(n_in - 1);
  auto clamped = [&](double p) { return static_cast<int64_t>(std::min(std::max(p, 0.0), last)); };
  for (int64_t o = 0; o < t.n_out; ++o) {
    const double x = source_coord(double(o), n_in, t.n_out, scale, s.coords);
    int64_t* idx = &t.index[o * t.taps];
    double* w = &t.weight[o * t.taps];
    if (s.mode == Resize::Nearest) {
      const double lo = std::floor(x), frac = x - lo;
      bool up = false;
      switch (s.rounding) {
        case Rounding::PreferFloor: up = frac > 0.5; break;
        case Rounding::PreferCeil: up = frac >= 0.5; break;
        case Rounding::Floor: up = false; break;
        case Rounding::Ceil: up = frac > 0; break;
      }
      idx[0] = clamped(lo + (up ? 1.0 : 0.0));
      w[0] = 1.0;
    } else if (s.mode == Resize::Linear) {
      const double xc = std::min(std::max(x, 0.0), last), lo = std::floor(xc), frac = xc - lo;
      idx[0] = clamped(lo);
      idx[1] = clamped(lo + 1);
      w[0] = 1 - frac;
      w[1] = frac;
    } else {
      const double lo = std::floor(x);
      for (int k = 0; k < 4; ++k) {
        const double p = lo + double(k - 1);
        idx[k] = clamped(p);
        w[k] = cubic_weight(x - p);
      }
    }
  }
  return t;
}

std::vector<AxisTaps> resize_plan(const std::vector<int64_t>& in_shape, const ResizeSpec& s) {
  std::vector<AxisTaps> plan;
  for (size_t d = 0; d < in_shape.size(); ++d) plan.push_back(axis_taps(in_shape[d], s.scales.at(d), s));
  return plan;
}

// Nearest: y[o0, o1, ...] = x[i0(o0), i1(o1), ...], element bytes read straight from x's strided view.
template <size_t Item>
void gather_rows(uint8_t* arena, const Buffer& x, const Buffer& y, const std::vector<std::vector<int64_t>>& src_off) {
  const size_t rank = y.shape.size();
  if (y.nelms == 0) return;
  if (rank == 0) {
    std::memcpy(arena + y.offset, arena + x.offset, Item);
    return;
  }
  const int64_t n = y.shape[rank - 1], rows = y.nelms / n, ys = y.strides[rank - 1];
  const std::vector<int64_t>& last = src_off[rank - 1];
  threads::for_each(rows, [&](int64_t r) {
    int64_t src = x.offset, dst = y.offset, rem = r;
    for (size_t d = rank - 1; d-- > 0;) {
      const int64_t c = rem % y.shape[d];
      rem /= y.shape[d];
      src += src_off[d][c];
      dst += c * y.strides[d];
    }
    for (int64_t j = 0; j < n; ++j) std::memcpy(arena + dst + j * ys, arena + src + last[j], Item);
  }, y.nelms > kParallelElements);
}

unique_ptr<Kernel> nearest_kernel(const Buffer& x, const Buffer& y, const std::vector<AxisTaps>& plan) {
  // byte offset into x of each output position, per axis
  std::vector<std::vector<int64_t>> src_off(plan.size());
  for (size_t d = 0; d < plan.size(); ++d) {
    const int64_t n = plan[d].identity ? plan[d].n_in : plan[d].n_out;
    for (int64_t o = 0; o < n; ++o) src_off[d].push_back((plan[d].identity ? o : plan[d].index[o]) * x.strides[d]);
  }
  void (*gather)(uint8_t*, const Buffer&, const Buffer&, const std::vector<std::vector<int64_t>>&) = nullptr;
  switch (itemsize(x.dtype)) {
    case 1: gather = gather_rows<1>; break;
    case 2: gather = gather_rows<2>; break;
    case 4: gather = gather_rows<4>; break;
    case 8: gather = gather_rows<8>; break;
    case 16: gather = gather_rows<16>; break;
    default: return nullptr;
  }
  return std::make_unique<FnKernel>([=](uint8_t* a) { gather(a, x, y, src_off); });
}

// One axis of a linear/cubic resize over a packed (pre, n_in, post) float64 array:
// out[p, o, :] = sum over taps t, in order, of in[p, index[o, t], :] * weight[o, t].
void resize_axis(const AxisTaps& t, int64_t pre, int64_t post, const double* in, double* out) {
  threads::for_each(pre * t.n_out, [&](int64_t po) {
    const int64_t p = po / t.n_out, o = po % t.n_out;
    const double* src = in + p * t.n_in * post;
    double* dst = out + po * post;
    const int64_t* idx = &t.index[o * t.taps];
    const double* w = &t.weight[o * t.taps];
    const double* row = src + idx[0] * post;
    for (int64_t e = 0; e < post; ++e) dst[e] = row[e] * w[0];
    for (int64_t k = 1; k < t.taps; ++k) {
      row = src + idx[k] * post;
      for (int64_t e = 0; e < post; ++e) dst[e] = dst[e] + row[e] * w[k];
    }
  }, pre * t.n_out * post * t.taps > kParallelElements);
}

// The transpose of resize_axis: in[p, index[o, t], :] += out_grad[p, o, :] * weight[o, t].
// The reference multiplies by the whole (n_out, n_in) matrix of the axis, where 0 * inf and 0 * NaN
// are NaN: a line (p, :, e) with a non-finite gradient is redone densely so it spreads the same way.
void resize_axis_adjoint(const AxisTaps& t, int64_t pre, int64_t post, const double* grad, double* acc) {
  const bool parallel = pre > 1 && pre * t.n_out * post * t.taps > kParallelElements;
  std::atomic<bool> finite{true};
  threads::for_each(pre, [&](int64_t p) {
    double* dst = acc + p * t.n_in * post;
    bool plane_finite = true;
    for (int64_t o = 0; o < t.n_out; ++o) {
      const double* row = grad + (p * t.n_out + o) * post;
      for (int64_t e = 0; e < post; ++e) plane_finite = plane_finite && std::isfinite(row[e]);
      for (int64_t k = 0; k < t.taps; ++k) {
        double* d = dst + t.index[o * t.taps + k] * post;
        const double w = t.weight[o * t.taps + k];
        for (int64_t e = 0; e < post; ++e) d[e] += row[e] * w;
      }
    }
    if (!plane_finite) finite.store(false, std::memory_order_relaxed);
  }, parallel);
  if (finite.load()) return;
  std::vector<double> m(t.n_out * t.n_in, 0.0);  // the axis's matrix: weights of taps that coincide add up
  for (int64_t o = 0; o < t.n_out; ++o)
    for (int64_t k = 0; k < t.taps; ++k) m[o * t.n_in + t.index[o * t.taps + k]] += t.weight[o * t.taps + k];
  for (int64_t p = 0; p < pre; ++p)
    for (int64_t e = 0; e < post; ++e) {
      const double* g = grad + p * t.n_out * post + e;
      bool line_finite = true;
      for (int64_t o = 0; o < t.n_out; ++o) line_finite = line_finite && std::isfinite(g[o * post]);
      if (line_finite) continue;
      for (int64_t j = 0; j < t.n_in; ++j) {
        double sum = 0;
        for (int64_t o = 0; o < t.n_out; ++o) sum += g[o * post] * m[o * t.n_in + j];
        acc[(p * t.n_in + j) * post + e] = sum;
      }
    }
}

// Runs `plan`'s non-identity axes in order over a packed float64 array whose shape starts as
// `shape`; `step(taps, pre, post, in, out)` maps one axis, the output having `next(taps)` along it.
// The output starts zeroed when the step adds into it (`accumulates`); otherwise it writes all of it.
template <class Step, class Next>
void each_axis(const std::vector<AxisTaps>& plan, std::vector<int64_t> shape, std::vector<double>& cur,
               std::vector<double>& tmp, Step&& step, Next&& next, bool accumulates) {
  for (size_t d = 0; d < plan.size(); ++d) {
    if (plan[d].identity) continue;
    const int64_t pre = prod(shape, 0, d), post = prod(shape, d + 1);
    shape[d] = next(plan[d]);
    if (accumulates)
      tmp.assign(prod(shape), 0.0);
    else
      tmp.resize(prod(shape));
    step(plan[d], pre, post, cur.data(), tmp.data());
    cur.swap(tmp);
  }
}

const RegisterKernel interpolate_op{{"interpolate"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  const ResizeSpec s = resize_spec(ins);
  const std::vector<AxisTaps> plan = resize_plan(x.shape, s);
  if (s.mode == Resize::Nearest) return nearest_kernel(x, y, plan);
  if (!is_float_or_fp8(x.dtype)) return nullptr;
  struct State { Packed x, y; std::vector<double> cur, tmp; };
  auto st = std::make_shared<State>(State{Packed(x), Packed(y), {}, {}});
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    read_doubles(a, st->x, st->cur);
    each_axis(plan, x.shape, st->cur, st->tmp, resize_axis, [](const AxisTaps& t) { return t.n_out; }, false);
    write_doubles(a, st->y, st->cur);
  });
}};

// interpolate_grad (x, dy) -> dx: float64 throughout, rounded once into x's dtype.
const RegisterKernel interpolate_grad_op{{"interpolate_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &g = bufs[ins.inputs[1]], &dx = bufs[ins.outputs[0]];
  const bool readable = is_numeric(g.dtype) || is_fp8(g.dtype), writable = is_numeric(dx.dtype) || is_fp8(dx.dtype);
  if (!readable || !writable) return nullptr;
  const std::vector<AxisTaps> plan = resize_plan(x.shape, resize_spec(ins));
  struct State { Packed g, dx; std::vector<double> cur, tmp; };
  auto st = std::make_shared<State>(State{Packed(g), Packed(dx), {}, {}});
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    read_doubles(a, st->g, st->cur);
    each_axis(plan, g.shape, st->cur, st->tmp, resize_axis_adjoint, [](const AxisTaps& t) { return t.n_in; }, true);
    write_doubles(a, st->dx, st->cur);
  });
}};

// ---- roi_align -----------------------------------------------------------------------------------
struct RoiSpec {
  int64_t ph, pw, ratio;
  double scale;
  std::string op;  // roi_align or roi_align_grad, for errors
};

RoiSpec roi_spec(const OpInstr& ins) {
  const auto size = ins.attr_ints("output_size");
  return {size.at(0), size.at(1), ins.attr_int("sampling_ratio"), ins.attr_float("spatial_scale"), ins.type};
}

// Bilinear samples along one side of a box: `bins` bins of `per_bin` samples; sample s reads
// pixels lo[s] and hi[s] with weights w_lo[s] and w_hi[s] (ONNX RoiAlign edges: a sample more than
// one pixel outside the image weighs 0, others are clamped to the border).
struct Side {
  int64_t bins = 0, per_bin = 0;
  std::vector<int64_t> lo, hi;
  std::vector<double> w_lo, w_hi;
};

// Python's max(a, 1.0): a unless 1.0 is greater (a NaN stays).
double at_least_one(double a) { return 1.0 > a ? 1.0 : a; }

// Samples per bin along a side of length `extent` split into `bins` (sampling_ratio, or adaptive);
// huge counts are capped at 2**62, which check_sample_count then refuses.
int64_t samples_per_bin(const std::string& op, int64_t ratio, double extent, int64_t bins, int64_t box) {
  if (ratio > 0) return ratio;
  const double n = std::ceil(extent / double(bins));
  if (std::isnan(n))
    throw std::invalid_argument(op + ": box " + std::to_string(box) + " has NaN coordinates; adaptive sampling "
                                "(sampling_ratio 0) needs finite boxes");
  return n < 0x1p62 ? static_cast<int64_t>(n) : int64_t(1) << 62;
}

// The most bilinear samples one box may take (both sides' samples multiplied): a box of billions of
// pixels sampled adaptively would otherwise run for hours or exhaust memory.
constexpr double kMaxRoiSamples = double(int64_t(1) << 26);

void check_sample_count(const RoiSpec& rs, int64_t gh, int64_t gw, int64_t box) {
  const double n = double(rs.ph) * double(gh) * double(rs.pw) * double(gw);
  if (n > kMaxRoiSamples)
    throw std::invalid_argument(rs.op + ": box " + std::to_string(box) + " would take " + std::to_string(gh) + " x " +
                                std::to_string(gw) + " samples in each of its " + std::to_string(rs.ph) + " x " +
                                std::to_string(rs.pw) + " bins, more than 2**26 in all; give a smaller "
                                "sampling_ratio (0 samples adaptively, by the box's size)");
}

Side side_samples(const std::string& op, double start, double extent, int64_t bins, int64_t per_bin, int64_t size,
                  int64_t box, const char* axis) {
  Side s;
  s.bins = bins;
  s.per_bin = per_bin;
  const int64_t n = bins * per_bin;
  s.lo.resize(n);
  s.hi.resize(n);
  s.w_lo.resize(n);
  s.w_hi.resize(n);
  const double step = extent / double(bins);
  for (int64_t b = 0, k = 0; b < bins; ++b)
    for (int64_t j = 0; j < per_bin; ++j, ++k) {
      const double pos = start + (double(b) + (double(j) + 0.5) / double(per_bin)) * step;
      if (size == 0 || std::isnan(pos))
        throw std::out_of_range(op + ": box " + std::to_string(box) + " samples " + axis + " position " +
                                std::to_string(pos) + ", outside the image's " + std::to_string(size) + " pixels");
      const double inside = (pos >= -1.0 && pos <= double(size)) ? 1.0 : 0.0;
      // np.clip(pos, 0, size): a sample beyond the image (weight 0) reads the border
      double p = pos < 0.0 ? 0.0 : pos > double(size) ? double(size) : pos;
      const int64_t lo = std::min(static_cast<int64_t>(std::floor(p)), size - 1);
      if (lo >= size - 1) p = double(lo);
      const double frac = p - double(lo);
      s.lo[k] = lo;
      s.hi[k] = std::min(lo + 1, size - 1);
      s.w_lo[k] = (1.0 - frac) * inside;
      s.w_hi[k] = frac * inside;
    }
  return s;
}

// The two sides of box r and its image (negative indices count from the end, as NumPy indexing).
struct Box {
  Side ys, xs;
  int64_t image;
};

Box box_samples(const RoiSpec& rs, const double* roi, int64_t image, int64_t r, const std::vector<int64_t>& x_shape) {
  const double x1 = roi[0] * rs.scale, y1 = roi[1] * rs.scale, x2 = roi[2] * rs.scale, y2 = roi[3] * rs.scale;
  const double rh = at_least_one(y2 - y1), rw = at_least_one(x2 - x1);
  const int64_t gh = samples_per_bin(rs.op, rs.ratio, rh, rs.ph, r), gw = samples_per_bin(rs.op, rs.ratio, rw, rs.pw, r);
  check_sample_count(rs, gh, gw, r);
  const int64_t N = x_shape[0];
  if (image < -N || image >= N)
    throw std::out_of_range(rs.op + ": batch_index[" + std::to_string(r) + "] = " + std::to_string(image) +
                            " is out of range for a batch of " + std::to_string(N) + " images");
  Box b;
  b.image = image < 0 ? image + N : image;
  b.ys = side_samples(rs.op, y1, rh, rs.ph, gh, x_shape[2], r, "y");
  b.xs = side_samples(rs.op, x1, rw, rs.pw, gw, x_shape[3], r, "x");
  return b;
}

struct RoiInputs {
  Packed rois, index;
  std::vector<double> boxes;
  std::vector<int64_t> images;
  void read(uint8_t* a) {
    read_all<double>(a, rois, boxes);
    index.read_ints(a, images);
  }
};

// roi_align in compute type W (float32 for float16): out[r, c, i, j] = mean over bin (i, j)'s
// samples of the bilinear interpolation of image batch_index[r], channel c.
template <class W>
void roi_align_box(const RoiSpec& rs, const Box& b, const W* image, int64_t C, int64_t H, int64_t Wd, W* out) {
  const int64_t gh = b.ys.per_bin, gw = b.xs.per_bin;
  const double count = double(gh * gw);
  threads::for_each(C, [&](int64_t c) {
    const W* img = image + c * H * Wd;
    for (int64_t i = 0; i < rs.ph; ++i)
      for (int64_t j = 0; j < rs.pw; ++j) {
        double sum = 0;
        for (int64_t sy = i * gh; sy < (i + 1) * gh; ++sy) {
          const W* lo_row = img + b.ys.lo[sy] * Wd;
          const W* hi_row = img + b.ys.hi[sy] * Wd;
          const double wyl = b.ys.w_lo[sy], wyh = b.ys.w_hi[sy];
          for (int64_t sx = j * gw; sx < (j + 1) * gw; ++sx) {
            const int64_t xl = b.xs.lo[sx], xh = b.xs.hi[sx];
            const double wxl = b.xs.w_lo[sx], wxh = b.xs.w_hi[sx];
            W v = W(0) + lo_row[xl] * W(wyl * wxl);
            v = v + lo_row[xh] * W(wyl * wxh);
            v = v + hi_row[xl] * W(wyh * wxl);
            v = v + hi_row[xh] * W(wyh * wxh);
            sum += double(v);
          }
        }
        out[(c * rs.ph + i) * rs.pw + j] = W(sum / count);
      }
  }, C > 1 && C * rs.ph * rs.pw * gh * gw > kParallelElements / 4);
}

const RegisterKernel roi_align_op{{"roi_align"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &rois = bufs[ins.inputs[1]], &index = bufs[ins.inputs[2]], &y = bufs[ins.outputs[0]];
  if (!is_int(index.dtype) || !dispatch_float(rois.dtype, [](auto) {})) return nullptr;
  const RoiSpec rs = roi_spec(ins);
  const int64_t C = x.shape[1], H = x.shape[2], Wd = x.shape[3], R = rois.shape[0];
  unique_ptr<Kernel> k;
  dispatch_float(x.dtype, [&](auto tag) {
    using W = typename Wide<typename decltype(tag)::type>::type;
    struct State { Packed x, y; RoiInputs in; std::vector<W> xv, out; };
    auto st = std::make_shared<State>();
    st->x = Packed(x);
    st->y = Packed(y);
    st->in.rois = Packed(rois);
    st->in.index = Packed(index);
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      st->in.read(a);
      read_all(a, st->x, st->xv);
      st->out.assign(y.nelms, W(0));
      for (int64_t r = 0; r < R; ++r) {
        const Box b = box_samples(rs, &st->in.boxes[r * 4], st->in.images[r], r, x.shape);
        roi_align_box(rs, b, st->xv.data() + b.image * C * H * Wd, C, H, Wd, st->out.data() + r * C * rs.ph * rs.pw);
      }
      write_all(a, st->y, st->out);
    });
  });
  return k;
}};

// The (bins, size) matrix that averages a side's samples into bins, built as the reference builds
// it (the low pixels' shares added first, then the high ones'), with the span of columns it touches.
struct BinMatrix {
  std::vector<double> m;
  int64_t size = 0, first = 0, last = -1;
};

BinMatrix bin_matrix(const Side& s, int64_t size) {
  BinMatrix b;
  b.size = size;
  b.m.assign(s.bins * size, 0.0);
  const int64_t n = s.bins * s.per_bin;
  const double per = double(s.per_bin);
  for (int64_t k = 0; k < n; ++k) b.m[(k / s.per_bin) * size + s.lo[k]] += s.w_lo[k] / per;
  for (int64_t k = 0; k < n; ++k) b.m[(k / s.per_bin) * size + s.hi[k]] += s.w_hi[k] / per;
  if (n) {
    b.first = *std::min_element(s.lo.begin(), s.lo.end());
    b.last = *std::max_element(s.hi.begin(), s.hi.end());
  }
  return b;
}

// roi_align_grad (x, rois, batch_index, dy) -> dx: each box's output is A_y @ image @ A_x^T per
// channel, so its image gets A_y^T @ dy @ A_x added; float64 throughout, rounded once.
const RegisterKernel roi_align_grad_op{{"roi_align_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &rois = bufs[ins.inputs[1]], &index = bufs[ins.inputs[2]],
               &g = bufs[ins.inputs[3]], &dx = bufs[ins.outputs[0]];
  if (!is_int(index.dtype) || !dispatch_float(rois.dtype, [](auto) {}) || !dispatch_float(g.dtype, [](auto) {}) ||
      !dispatch_float(dx.dtype, [](auto) {}))
    return nullptr;
  const RoiSpec rs = roi_spec(ins);
  const int64_t C = x.shape[1], H = x.shape[2], Wd = x.shape[3], R = rois.shape[0];
  struct State { Packed g, dx; RoiInputs in; std::vector<double> gv, acc; };
  auto st = std::make_shared<State>();
  st->g = Packed(g);
  st->dx = Packed(dx);
  st->in.rois = Packed(rois);
  st->in.index = Packed(index);
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    st->in.read(a);
    read_all(a, st->g, st->gv);
    st->acc.assign(dx.nelms, 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const Box b = box_samples(rs, &st->in.boxes[r * 4], st->in.images[r], r, x.shape);
      const BinMatrix ay = bin_matrix(b.ys, H), ax = bin_matrix(b.xs, Wd);
      threads::region([&](int id, int team) {
        std::vector<double> t(rs.ph * Wd);  // dy[r, c] @ A_x
        for (int64_t c : threads::share(C, id, team)) {
          const double* gr = st->gv.data() + (r * C + c) * rs.ph * rs.pw;
          // Only the pixels the box samples get a share; but the reference's dense products make
          // 0 * inf and 0 * NaN NaN, so a non-finite gradient reaches the whole image.
          bool finite = true;
          for (int64_t i = 0; i < rs.ph * rs.pw; ++i) finite = finite && std::isfinite(gr[i]);
          const int64_t w0 = finite ? ax.first : 0, nw = finite ? ax.last - ax.first + 1 : Wd;
          const int64_t h0 = finite ? ay.first : 0, h1 = finite ? ay.last : H - 1;
          std::fill(t.begin(), t.begin() + rs.ph * nw, 0.0);
          for (int64_t i = 0; i < rs.ph; ++i)
            for (int64_t j = 0; j < rs.pw; ++j) {
              const double gij = gr[i * rs.pw + j];
              const double* axj = ax.m.data() + j * Wd + w0;
              double* ti = t.data() + i * nw;
              for (int64_t w = 0; w < nw; ++w) ti[w] += gij * axj[w];
            }
          double* img = st->acc.data() + (b.image * C + c) * H * Wd;
          for (int64_t i = 0; i < rs.ph; ++i) {
            const double* ti = t.data() + i * nw;
            for (int64_t h = h0; h <= h1; ++h) {
              const double ayh = ay.m[i * H + h];
              double* row = img + h * Wd + w0;
              for (int64_t w = 0; w < nw; ++w) row[w] += ayh * ti[w];
            }
          }
        }
      }, C > 1 && C * rs.ph * (rs.pw + H) * Wd > kParallelElements);
    }
    write_all(a, st->dx, st->acc);
  });
}};

}  // namespace
}  // namespace popxl
