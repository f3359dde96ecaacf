// Convolution kernels backed by oneDNN: conv (also fused with bias, residual sum and relu:
// conv_fused), transposed convolution, their float8 pow2scaled forms, and conv_grad; 3x3 ones go to
// the Winograd kernels (winograd.cpp) where those apply.
#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "onednn.hpp"
#include "winograd.hpp"

namespace popxl {
namespace {

// Weights of a (transposed) convolution as oneDNN's (groups, out/g, in/g, k...) without copying.
// conv weights are (M, C/g, k...); conv_transpose weights are (C, M/g, k...).
std::pair<std::vector<int64_t>, std::vector<int64_t>> conv_weights(const Buffer& w, int64_t g, bool transposed) {
  const auto s = elem_strides(w);
  std::vector<int64_t> dims, str;
  const int64_t a = w.shape[0], b = w.shape[1];
  if (!transposed) {
    if (g > 1) { dims = {g, a / g, b}; str = {a / g * s[0], s[0], s[1]}; }
    else { dims = {a, b}; str = {s[0], s[1]}; }
  } else {
    if (g > 1) { dims = {g, b, a / g}; str = {a / g * s[0], s[1], s[0]}; }
    else { dims = {b, a}; str = {s[1], s[0]}; }
  }
  for (size_t i = 2; i < w.shape.size(); ++i) { dims.push_back(w.shape[i]); str.push_back(s[i]); }
  return {dims, str};
}

// A float32 (or float16, computed in float32) convolution in the layouts oneDNN's JIT kernels
// want. The primitive chooses the activation and weight formats (format_tag::any, usually
// channel-blocked); the arena holds plain NCHW/OIHW tensors, which would send oneDNN to its slower
// im2col+GEMM implementation, so each run reorders the operands in and the result out; weights
// only when they changed (static weights: when the weights epoch moved on; other contiguous
// weights: when their bytes differ).
// Values that popxl.transforms.keep_channels_last keeps NHWC skip most of these.
// `bias`, and the post-ops `residual` (a sum into the destination) and `relu`, serve conv_fused.
//
// When the batch divides evenly over the threads, it is cut into up to kSlicesPerThread slices a
// thread, each convolved by a single-threaded primitive, all sharing the reordered weights; the
// threads take slices as they finish their last. No thread waits on another inside a layer, and
// a thread on a busier core takes fewer slices (a VM whose second core ran 35% slower: a static
// half each 13.6 ms for (8, 64, 56, 56), one image at a time 12.6 ms). ResNet-18 at batch 8
// through popart, interleaved with ONNX Runtime four times each: one image a slice ran at
// 0.85-0.90x ORT's speed, halves at 0.79-0.87x, oneDNN's own split of the batch at 0.85-0.87x.
class BlockedConvKernel : public Kernel {
 public:
  struct Spec {
    const Buffer *x, *w, *bias, *residual, *y;
    int64_t groups;
    Window win;
    bool relu;
    std::optional<std::pair<float, float>> clip;  // conv_fused's `clip` (lo, hi): in place of the relu
    bool nhwc_x = false, nhwc_y = false, nhwc_residual = false;  // conv_fused's `layouts`
    bool static_w = false;  // `w` lies in static storage
    // conv_fused's pool_*: a max pool of the result, which `y` then holds (no residual with it)
    struct MaxPool {
      memory::dims kernel;
      Window win;
    };
    std::optional<MaxPool> pool;
    std::vector<int64_t> conv_shape;  // the convolution's result (y's shape when not pooled)
  };

  explicit BlockedConvKernel(const Spec& s) : w_(*s.w) {
    const int64_t N = s.x->shape[0], parts = slices(N);
    for (int64_t p = 0; p < parts; ++p)
      parts_.push_back(std::make_unique<Part>(s, p * N / parts, N / parts, parts > 1));
    // Result areas: one for each thread running a part at a time (a part's result lives until
    // the part ends), so that a thread's next slice finds its area still in cache.
    threads_ = parts > 1 ? std::min<int64_t>(threads::max_threads(), parts) : 1;
    if (const size_t bytes = parts_[0]->result_bytes)
      for (int64_t t = 0; t < threads_; ++t) areas_.push_back(scratch.reserve(bytes));
    const memory::desc& wd = parts_[0]->weights_desc;
    for (auto& part : parts_)  // equal slices choose the same implementation and weight format
      if (part->weights_desc != wd) throw std::runtime_error("conv: batch slices disagree on the weight format");
    auto [wdims, wstr] = conv_weights(w_, s.groups, false);
    using Keep = ReorderedOperand::Keep;
    const Keep keep = s.static_w ? Keep::Static : w_.contiguous ? Keep::Bytes : Keep::None;
    wei_ = ReorderedOperand(md(wdims, wstr, stored_type(w_)), wd, false, scratch, keep);
    for (auto& part : parts_) part->conv.arg(DNNL_ARG_WEIGHTS, wei_.inner);
  }

  std::string algorithm() const override { return parts_[0]->impl; }

  void run(uint8_t* arena) override {
    wei_.bind(arena + w_.offset, scratch);
    wei_.to_inner(strm_, scratch, weights_epoch);
    strm_.wait();
    const int64_t parts = static_cast<int64_t>(parts_.size());
    auto area = [this](int t) { return areas_.empty() ? nullptr : scratch.at(areas_[static_cast<size_t>(t)]); };
    if (parts == 1) {
      parts_[0]->run(arena, area(0));
      return;
    }
    threads::Dynamic next(parts);
    threads::region([&](int id, int) {
      for (int64_t p; (p = next.next()) >= 0;) parts_[static_cast<size_t>(p)]->run(arena, area(id));
    }, true, static_cast<int>(threads_));
  }

  // The weights' reorder scratch and the result areas, then each slice's own piece (the slices
  // run at the same time).
  size_t scratch_bytes() const override {
    size_t n = scratch.bytes();
    for (auto& part : parts_) n += ScratchLayout::aligned(part->scratch.bytes());
    return n;
  }
  void bind_scratch(uint8_t* region) override {
    scratch.bind(region);
    size_t at = scratch.bytes();
    for (auto& part : parts_) {
      part->scratch.bind(region ? region + at : nullptr);
      at += ScratchLayout::aligned(part->scratch.bytes());
    }
  }

 private:
  static constexpr int64_t kSlicesPerThread = 4;

  // How many equal slices a batch of N is cut into: the most, up to kSlicesPerThread a thread,
  // that the threads share evenly; 1 (oneDNN splits the whole batch) when none do.
  static int64_t slices(int64_t N) {
    const int64_t team = threads::max_threads();
    if (team < 2) return 1;
    for (int64_t k = std::min(N / team, kSlicesPerThread); k >= 1; --k)
      if (N % (k * team) == 0) return k * team;
    return 1;
  }

  // The convolution of batch samples [n0, n0 + count): its primitive (single-threaded when the
  // batch is split), activations in and out, bias and residual.
  //
  // A float32 residual in the result's own dense layout is added, and relu applied, by a pass of
  // ours over the convolution's result in a result area (`add_after`): oneDNN's sum post-op costs
  // ~5% of a ResNet-18 56x56 residual convolution on AVX2, the pass about nothing, as the
  // result is still in cache (one image, one thread: 2.58 -> 2.45 ms). Other residuals go
  // through the sum post-op, copied or reordered into the destination first.
  //
  // A fused max pool reads the convolution's result (bias and relu applied) from the result
  // area, in the layout the convolution wrote, in cache: ResNet-18's stem and 3x3/2 pool, batch 8
  // on two threads, 12.0 ms as two ops, 11.2-11.6 ms pooled a slice at a time.
  struct Part {
    Buffer x, y, bias, residual;
    Primitive conv, residual_in;
    ReorderedOperand src, dst, bias_in;
    memory residual_mem;
    memory::desc weights_desc;
    std::string impl;  // oneDNN's name for the convolution's implementation
    bool sliced, has_bias = false, residual_copied = false, relu_after = false, add_after = false, pooled = false;
    std::optional<size_t> residual_staging;  // float16: the residual's float32 copy in scratch
    size_t result_bytes = 0;  // > 0: the convolution writes its result to a result area (see above)
    memory conv_result;       // ... as the primitive's destination
    Primitive pool;           // the fused max pool: conv_result -> dst
    ScratchLayout scratch;
    dnnl::stream strm{cpu()};

    Part(const Spec& s, int64_t n0, int64_t count, bool single_thread)
        : x(window(*s.x, 0, n0, count)), y(window(*s.y, 0, n0, count)), sliced(single_thread) {
      SingleThreadScope scope(single_thread);  // creation fixes a primitive's thread count
      const auto f32 = memory::data_type::f32;
      auto [wdims, wstr] = conv_weights(*s.w, s.groups, false);
      const memory::desc xd = user_desc(x, s.nhwc_x), wd = md(wdims, wstr, f32), yd = user_desc(y, s.nhwc_y);
      auto any = [f32](const memory::desc& d) { return memory::desc(d.get_dims(), f32, memory::format_tag::any); };
      // The convolution's result as y would hold it (pooled: float32, in y's layout, y's count).
      memory::dims rdims(s.conv_shape.begin(), s.conv_shape.end());
      rdims[0] = count;
      const memory::desc rd = s.pool ? memory::desc(rdims, f32, s.nhwc_y ? memory::format_tag::nhwc
                                                                       : memory::format_tag::nchw)
                                     : yd;
      if (s.residual) residual = window(*s.residual, 0, n0, count);
      add_after = s.residual && !s.clip && residual.dtype == DType::F32 && y.dtype == DType::F32 &&
                  residual.contiguous && y.contiguous && user_desc(residual, s.nhwc_residual) == yd;
      dnnl::primitive_attr attr;
      auto set_post_ops = [&] {
        dnnl::post_ops ops;
        if (s.residual && !add_after) ops.append_sum(1.f);
        if (s.relu && !add_after) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
        if (s.clip) ops.append_eltwise(dnnl::algorithm::eltwise_clip, s.clip->first, s.clip->second);
        attr = user_scratchpad();
        attr.set_post_ops(ops);
      };
      set_post_ops();
      const Window& win = s.win;
      auto make_pd = [&](const memory::desc& src_d, const memory::desc& dst_d) {
        return s.bias ? dnnl::convolution_forward::primitive_desc(
                            cpu(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_d,
                            any(wd), md(s.bias->shape, {1}, f32), dst_d, win.strides, win.dilates,
                            win.pad_l, win.pad_r, attr)
                      : dnnl::convolution_forward::primitive_desc(
                            cpu(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_d,
                            any(wd), dst_d, win.strides, win.dilates, win.pad_l, win.pad_r, attr);
      };
      const memory::desc rd32 = s.pool ? rd : user_desc(y, s.nhwc_y, f32);
      auto choose_pd = [&] {
        auto pd = make_pd(any(xd), any(rd));
        // A channels-last value the primitive would rather have blocked (the first layer, whose
        // 3-channel input suits a channel-blocked output) is given in NHWC when an optimised kernel
        // takes it: a reorder of the whole activation costs more than the kernel's preference saves
        // (ResNet-18's stem: 14.0 -> 9.7 ms for 4 images on one thread).
        if (s.nhwc_y && pd.dst_desc() != rd32) {
          auto direct = make_pd(any(xd), rd32);
          if (std::string(direct.impl_info_str()).rfind("ref", 0) != 0) pd = direct;
        }
        return pd;
      };
      auto pd = choose_pd();
      if (add_after && pd.dst_desc() != yd) {  // the primitive writes another layout: post-ops after all
        add_after = false;
        set_post_ops();
        pd = choose_pd();
      }
      conv = Primitive(pd, scratch);
      impl = pd.impl_info_str();
      weights_desc = pd.weights_desc();
      src = ReorderedOperand(xd, pd.src_desc(), false, scratch);
      if (s.pool) {
        const Window& pw = s.pool->win;
        dnnl::pooling_forward::primitive_desc ppd(
            cpu(), dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, pd.dst_desc(), any(yd),
            pw.strides, s.pool->kernel, pw.dilates, pw.pad_l, pw.pad_r, user_scratchpad());
        pool = Primitive(ppd, scratch);
        pooled = true;
        dst = ReorderedOperand(yd, ppd.dst_desc(), true, scratch);
        conv_result = memory(pd.dst_desc(), cpu(), DNNL_MEMORY_NONE);
        result_bytes = pd.dst_desc().get_size();
        pool.arg(DNNL_ARG_SRC, conv_result);
        pool.arg(DNNL_ARG_DST, dst.inner);
      } else {
        dst = ReorderedOperand(yd, pd.dst_desc(), true, scratch);
      }
      if (s.bias) {
        has_bias = true;
        bias = *s.bias;
        const memory::desc arena_bias = md(bias.shape, elem_strides(bias), stored_type(bias));
        bias_in = ReorderedOperand(arena_bias, pd.bias_desc(), false, scratch);
      }
      if (add_after) {
        result_bytes = pd.dst_desc().get_size();
        conv_result = memory(pd.dst_desc(), cpu(), DNNL_MEMORY_NONE);
        relu_after = s.relu;
      } else if (s.residual) {
        // float32, staged first when float16 (as ReorderedOperand stages)
        residual_mem = memory(user_desc(residual, s.nhwc_residual, f32), cpu(), DNNL_MEMORY_NONE);
        if (residual.dtype == DType::F16) {
          if (!residual.contiguous) throw std::runtime_error("a float16 residual must be contiguous to be staged");
          residual_staging = scratch.reserve(residual_mem.get_desc().get_size());
        }
        residual_copied = residual.contiguous && residual_mem.get_desc() == pd.dst_desc();
        if (!residual_copied) residual_in = Primitive::reorder(residual_mem, dst.inner, scratch);
      }
      conv.arg(DNNL_ARG_SRC, src.inner);
      conv.arg(DNNL_ARG_DST, result_bytes ? conv_result : dst.inner);
      if (s.bias) conv.arg(DNNL_ARG_BIAS, bias_in.inner);
    }

    // `area`: a result area of result_bytes (when those are > 0) that no other part uses meanwhile.
    void run(uint8_t* arena, uint8_t* area) {
      src.bind(arena + x.offset, scratch);
      dst.bind(arena + y.offset, scratch);
      src.to_inner(strm, scratch);
      if (has_bias) {
        bias_in.bind(arena + bias.offset, scratch);
        bias_in.to_inner(strm, scratch);
      }
      if (result_bytes) conv_result.set_data_handle(area);
      if (pooled) {
        conv.execute(strm, scratch);
        pool.execute(strm, scratch);
        dst.to_user(strm, scratch);
        strm.wait();
        return;
      }
      if (add_after) {
        conv.execute(strm, scratch);
        strm.wait();
        // y may be the residual itself (the memory plan puts the result over it): each value is
        // read before it is written. A whole batch (not split) is added on all threads.
        const int64_t f = sizeof(float);
        const std::array<uint8_t*, 3> at = {arena + y.offset, area, arena + residual.offset};
        nd_loop<3>({y.nelms}, {{{f}, {f}, {f}}}, at,
                   [relu = relu_after](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>&, int64_t n) {
                     float* out = reinterpret_cast<float*>(p[0]);
                     const float* conv = reinterpret_cast<const float*>(p[1]);
                     const float* r = reinterpret_cast<const float*>(p[2]);
                     if (relu)  // NaN stays NaN, as in the relu op
                       for (int64_t i = 0; i < n; ++i) {
                         const float v = conv[i] + r[i];
                         out[i] = v < 0.f ? 0.f : v;
                       }
                     else
                       for (int64_t i = 0; i < n; ++i) out[i] = conv[i] + r[i];
                   }, !sliced);
        return;
      }
      if (residual_mem) {  // the sum post-op adds what the destination holds
        uint8_t* from = arena + residual.offset;
        if (residual_staging) {
          float* f32 = reinterpret_cast<float*>(scratch.at(*residual_staging));
          unstage(from, DType::F16, f32, residual.nelms);
          from = reinterpret_cast<uint8_t*>(f32);
        }
        if (residual_copied) {  // the same dense layout: a memcpy beats oneDNN's generic reorder
          void* to = dst.inner.get_data_handle();
          if (to != from)  // the memory plan may put the result over the residual
            std::memcpy(to, from, residual_mem.get_desc().get_size());
        } else {
          residual_mem.set_data_handle(from);
          residual_in.execute(strm, scratch);
        }
      }
      conv.execute(strm, scratch);
      dst.to_user(strm, scratch);
      strm.wait();
    }
  };

  Buffer w_;
  ReorderedOperand wei_;
  std::vector<std::unique_ptr<Part>> parts_;
  int64_t threads_ = 1;        // how many parts run at a time, at most
  std::vector<size_t> areas_;  // result areas in scratch, one per thread (see Part)
  dnnl::stream strm_{cpu()};
};

// A 2-D 3x3 convolution with stride and dilation 1, one group: what winograd_conv computes.
bool winograd_geometry(const Buffer& w, int64_t groups, const Window& win) {
  const auto all = [](const memory::dims& d, int64_t v) {
    return std::all_of(d.begin(), d.end(), [v](int64_t e) { return e == v; });
  };
  return groups == 1 && w.shape.size() == 4 && w.shape[2] == 3 && w.shape[3] == 3 && all(win.strides, 1) &&
         all(win.dilates, 0);
}

// conv and conv_fused (float32 or float16): x, w, [bias, [residual]] -> y.
std::unique_ptr<Kernel> blocked_conv(const OpInstr& ins, const std::vector<Buffer>& bufs, bool fused) {
  const Buffer &x = bufs[ins.inputs[0]], &w = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
  const bool residual = fused && ins.attr_bool("residual");
  const Buffer* bias = fused ? &bufs[ins.inputs[2]] : nullptr;
  const Buffer* res = residual ? &bufs[ins.inputs[3]] : nullptr;
  BlockedConvKernel::Spec s{&x, &w, bias, res, &y, ins.attr_int("groups"), window_of(ins, x.shape.size() - 2),
                            fused && ins.attr_bool("relu")};
  const auto nhwc = nhwc_slots(ins, 3);
  s.nhwc_x = nhwc[0];
  s.nhwc_y = nhwc[1];
  s.nhwc_residual = nhwc[2];
  s.static_w = ins.is_static_input(kWeightsSlot);
  if (fused && !ins.attr_is_none("clip")) {
    const std::vector<double> bounds = ins.attr_floats("clip");
    if (bounds.size() != 2) return nullptr;
    s.clip = std::make_pair(static_cast<float>(bounds[0]), static_cast<float>(bounds[1]));
  }
  // nullptr: the op falls back (the loader refuses that for channels-last operands).
  if (!one_float_type({&x, &w, &y, bias, res})) return nullptr;
  s.conv_shape = y.shape;
  if (fused && !ins.attr_is_none("pool_kernel")) {
    const auto kernel = ins.attr_ints("pool_kernel");
    if (kernel.size() != 2 || x.shape.size() != 4) return nullptr;
    // the convolution's result: its pads are exact (no ceil mode)
    for (size_t i = 0; i < 2; ++i) {
      const int64_t eff = (w.shape[2 + i] - 1) * (s.win.dilates[i] + 1) + 1;
      s.conv_shape[2 + i] = (x.shape[2 + i] + s.win.pad_l[i] + s.win.pad_r[i] - eff) / s.win.strides[i] + 1;
    }
    s.conv_shape[1] = w.shape[0];
    Window pw = window_of(ins, 2, "pool_");
    fit_right_padding(pw, spatial(s.conv_shape), kernel, spatial(y.shape), false);
    s.pool = BlockedConvKernel::Spec::MaxPool{memory::dims(kernel.begin(), kernel.end()), pw};
  }
  fit_right_padding(s.win, spatial(x.shape), spatial(w.shape), spatial(s.conv_shape), false);
  if (!s.pool && winograd_geometry(w, s.groups, s.win)) {
    const WinogradSpec ws{&x, &w, bias, res, &y, s.nhwc_x, s.nhwc_y, s.nhwc_residual, s.win.pad_l[0], s.win.pad_l[1],
                          s.relu, s.clip, s.static_w};
    if (auto k = winograd_conv(ws)) return k;
  }
  try {
    return std::make_unique<BlockedConvKernel>(s);
  } catch (const dnnl::error&) {
    return nullptr;
  } catch (const std::runtime_error&) {
    return nullptr;
  }
}

KernelFactory convolution(bool transposed, bool pow2 = false) {
  return [transposed, pow2](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
    if (!transposed && !pow2) {
      if (auto k = blocked_conv(ins, bufs, false)) return k;
    }
    const Buffer &x = bufs[ins.inputs[0]], &w = bufs[ins.inputs[1]], &y = bufs[ins.outputs[0]];
    memory::data_type t;
    if (!dnnl_type(x.dtype, t) || !dnnl_type(w.dtype, t) || !dnnl_type(y.dtype, t)) return nullptr;
    if (pow2 != is_fp8(x.dtype) || (!pow2 && (w.dtype != x.dtype || y.dtype != x.dtype))) return nullptr;
    if (x.nelms == 0 || w.nelms == 0 || y.nelms == 0) return nullptr;
    const int64_t g = ins.attr_int("groups");
    Window win = window_of(ins, x.shape.size() - 2);
    fit_right_padding(win, spatial(x.shape), spatial(w.shape), spatial(y.shape), transposed);
    try {
      auto k = std::make_unique<DnnlKernel>();
      // multiply-adds: every output of a convolution (every input of a transposed one) sums
      // over (channels / groups) * window elements
      k->single_thread = (transposed ? x.nelms : y.nelms) * (w.nelms / w.shape[0]) < kSingleThreadWork;
      SingleThreadScope scope(k->single_thread);
      auto [wdims, wstr] = conv_weights(w, g, transposed);
      auto xd = md(x.shape, elem_strides(x), t), wd = md(wdims, wstr, t), yd = md(y.shape, elem_strides(y), t);
      k->add(DNNL_ARG_SRC, xd, x);
      k->add(DNNL_ARG_WEIGHTS, wd, w);
      k->add(DNNL_ARG_DST, yd, y, true);
      if (transposed)
        k->use(Primitive(dnnl::deconvolution_forward::primitive_desc(
                             cpu(), dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, xd, wd,
                             yd, win.strides, win.dilates, win.pad_l, win.pad_r, user_scratchpad()),
                         k->scratch));
      else
        k->use(Primitive(dnnl::convolution_forward::primitive_desc(
                             cpu(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, xd, wd,
                             yd, win.strides, win.dilates, win.pad_l, win.pad_r, user_scratchpad()),
                         k->scratch));
      if (pow2) {
        k->scaled = true;
        k->scale = bufs[ins.inputs[2]];
        k->op = ins.type;
      }
      return k;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  };
}

// Kernels run one after another as one op's kernel (they share the scratch region, as kernels
// run in turn do).
class KernelSequence : public Kernel {
 public:
  explicit KernelSequence(std::vector<std::unique_ptr<Kernel>> parts) : parts_(std::move(parts)) {}
  void run(uint8_t* arena) override {
    for (auto& k : parts_) k->run(arena);
  }
  void bind_weights_epoch(const uint64_t* epoch) override {
    for (auto& k : parts_) k->bind_weights_epoch(epoch);
  }
  size_t scratch_bytes() const override {
    size_t n = 0;
    for (auto& k : parts_) n = std::max(n, k->scratch_bytes());
    return n;
  }
  void bind_scratch(uint8_t* region) override {
    for (auto& k : parts_) k->bind_scratch(region);
  }
  std::string algorithm() const override {
    std::string s;
    for (auto& k : parts_) s += (s.empty() ? "" : " + ") + (k->algorithm().empty() ? "oneDNN" : k->algorithm());
    return s;
  }

 private:
  std::vector<std::unique_ptr<Kernel>> parts_;
};

// conv_grad: dx and/or dweight (its `grads` attribute) from oneDNN's backward-data and
// backward-weights primitives, both built against the forward convolution they differentiate.
//
// The primitives choose their layouts (format any: channel-blocked on AVX2) and the operands are
// reordered in and the results out on every run: on plain NCHW oneDNN runs its im2col + GEMM
// kernels, ~1.5x slower (a 3x3 64 -> 64 convolution at 16x28x28: 22 ms of backward on plain
// layouts, 14.5 ms blocked; the reorders ~2 ms). float16 operands are staged as float32.
class ConvGradKernel : public Kernel {
 public:
  ConvGradKernel(const Buffer& x, const Buffer& w, const Buffer& g, const Buffer* dx, const Buffer* dw, int64_t groups,
                 const Window& win) {
    using namespace dnnl;
    const auto f32 = memory::data_type::f32;
    auto [wdims, wstr] = conv_weights(w, groups, false);
    const memory::desc xd = md(x.shape, elem_strides(x), stored_type(x)), wd = md(wdims, wstr, stored_type(w)),
                       gd = md(g.shape, elem_strides(g), stored_type(g));
    auto any = [f32](const memory::desc& d) { return memory::desc(d.get_dims(), f32, memory::format_tag::any); };
    convolution_forward::primitive_desc fwd(cpu(), prop_kind::forward_training, algorithm::convolution_direct, any(xd),
                                            any(wd), any(gd), win.strides, win.dilates, win.pad_l, win.pad_r);
    const memory* g_inner = nullptr;  // g as the backward-data pass reorders it
    if (dx) {
      convolution_backward_data::primitive_desc pd(cpu(), algorithm::convolution_direct, any(xd), any(wd), any(gd),
                                                   win.strides, win.dilates, win.pad_l, win.pad_r, fwd,
                                                   user_scratchpad());
      Pass& p = add_pass(pd, {{DNNL_ARG_DIFF_DST, gd, pd.diff_dst_desc(), &g}, {DNNL_ARG_WEIGHTS, wd, pd.weights_desc(), &w}},
                         {DNNL_ARG_DIFF_SRC, md(dx->shape, elem_strides(*dx), stored_type(*dx)), pd.diff_src_desc(), dx});
      g_inner = &p.in[0].op.inner;
    }
    if (dw) {
      auto [dwdims, dwstr] = conv_weights(*dw, groups, false);
      convolution_backward_weights::primitive_desc pd(cpu(), algorithm::convolution_direct, any(xd), any(wd),
                                                      any(gd), win.strides, win.dilates, win.pad_l, win.pad_r, fwd,
                                                      user_scratchpad());
      // g is reordered once when both passes read it in the same layout
      const bool shared = g_inner && g_inner->get_desc() == pd.diff_dst_desc();
      std::vector<Operand> in = {{DNNL_ARG_SRC, xd, pd.src_desc(), &x}};
      if (!shared) in.push_back({DNNL_ARG_DIFF_DST, gd, pd.diff_dst_desc(), &g});
      Pass& p = add_pass(pd, in, {DNNL_ARG_DIFF_WEIGHTS, md(dwdims, dwstr, stored_type(*dw)), pd.diff_weights_desc(), dw});
      if (shared) p.prim.arg(DNNL_ARG_DIFF_DST, *g_inner);
    }
  }

  void run(uint8_t* arena) override {
    for (Pass& p : passes_) {
      for (Bound& b : p.in) {
        b.op.bind(arena + b.offset, scratch);
        b.op.to_inner(strm_, scratch);
      }
      p.out.op.bind(arena + p.out.offset, scratch);
      p.prim.execute(strm_, scratch);
      p.out.op.to_user(strm_, scratch);
    }
    strm_.wait();
  }

 private:
  // An operand: its primitive argument, layouts in the arena and in the primitive, buffer.
  struct Operand {
    int arg;
    memory::desc arena, inner;
    const Buffer* buffer;
  };
  struct Bound {
    ReorderedOperand op;
    int64_t offset;
  };
  // One backward primitive: operands reordered in, the result reordered out.
  struct Pass {
    Primitive prim;
    std::vector<Bound> in;
    Bound out;
  };
  Pass& add_pass(const dnnl::primitive_desc& pd, const std::vector<Operand>& in, const Operand& out) {
    Pass p{Primitive(pd, scratch), {}, {ReorderedOperand(out.arena, out.inner, true, scratch), out.buffer->offset}};
    for (const Operand& o : in) {
      p.in.push_back({ReorderedOperand(o.arena, o.inner, false, scratch), o.buffer->offset});
      p.prim.arg(o.arg, p.in.back().op.inner);
    }
    p.prim.arg(out.arg, p.out.op.inner);
    passes_.push_back(std::move(p));
    return passes_.back();
  }

  std::deque<Pass> passes_;  // a deque: the backward-weights pass may refer to the first pass's g
  dnnl::stream strm_{cpu()};
};

const RegisterKernel conv_grad_op{{"conv_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &w = bufs[ins.inputs[1]], &g = bufs[ins.inputs[2]];
  // the outputs the `grads` attribute names, in order (both without it)
  const Buffer *dx = nullptr, *dw = nullptr;
  size_t out = 0;
  if (ins.attr_is_none("grads")) {
    dx = &bufs[ins.outputs[0]];
    dw = &bufs[ins.outputs[1]];
  } else {
    for (const std::string& name : ins.attr_strs("grads")) (name == "dx" ? dx : dw) = &bufs[ins.outputs[out++]];
  }
  if (!one_float_type({&x, &w, &g, dx, dw})) return nullptr;
  const int64_t groups = ins.attr_int("groups");
  Window win = window_of(ins, x.shape.size() - 2);
  fit_right_padding(win, spatial(x.shape), spatial(w.shape), spatial(g.shape), false);
  // dx of a 3x3 stride-1 convolution is itself one: dy correlated with the weights turned round in
  // space, input and output channels swapped (a view of w: (C, K, 3, 3), negative spatial strides),
  // padded by 2 - pad at the top and left. Winograd computes it, and dw, where it pays; oneDNN
  // computes what it does not.
  std::vector<std::unique_ptr<Kernel>> parts;
  if (winograd_geometry(w, groups, win)) {
    if (dx) {
      Buffer turned = w;
      turned.shape = {w.shape[1], w.shape[0], 3, 3};
      turned.strides = {w.strides[1], w.strides[0], -w.strides[2], -w.strides[3]};
      turned.offset = w.offset + 2 * (w.strides[2] + w.strides[3]);
      turned.contiguous = false;
      if (auto k = winograd_conv({&g, &turned, nullptr, nullptr, dx, false, false, false, 2 - win.pad_l[0],
                                  2 - win.pad_l[1], false, std::nullopt, ins.is_static_input(kWeightsSlot)})) {
        parts.push_back(std::move(k));
        dx = nullptr;
      }
    }
    if (dw) {
      if (auto k = winograd_weight_grad(x, g, *dw, win.pad_l[0], win.pad_l[1])) {
        parts.push_back(std::move(k));
        dw = nullptr;
      }
    }
  }
  if (dx || dw) {
    try {
      parts.push_back(std::make_unique<ConvGradKernel>(x, w, g, dx, dw, groups, win));
    } catch (const dnnl::error&) {
      return nullptr;
    } catch (const std::runtime_error&) {
      return nullptr;
    }
  }
  if (parts.size() == 1) return std::move(parts[0]);
  return std::make_unique<KernelSequence>(std::move(parts));
}};

const RegisterKernel conv_ops[] = {
    {{"conv"}, convolution(false)},
    {{"conv_fused"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) { return blocked_conv(ins, bufs, true); }},
    {{"conv_transpose"}, convolution(true)},
    {{"conv_pow2scaled"}, convolution(false, true)},
    {{"conv_transpose_pow2scaled"}, convolution(true, true)},
};

}  // namespace
}  // namespace popxl
