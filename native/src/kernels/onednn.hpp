// What the oneDNN-backed kernels (matmul.cpp, conv.cpp, pooling.cpp) share: the CPU engine,
// float16 / float8 operands staged as float32, primitives whose scratchpad is the engine's scratch
// region, a kernel of one primitive (DnnlKernel), and for convolution and pooling the window
// geometry, the operands' layouts and their reorders. Primitives are created once at load; each
// run only points their memory at the arena and at the engine's scratch region (every primitive is
// created with scratchpad_mode::user, so oneDNN allocates no scratchpad of its own). A
// configuration oneDNN rejects (e.g. a dtype this CPU lacks) makes a factory return nullptr, and
// the op runs on the fallback.
#pragma once

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "fp8.hpp"
#include "static_copies.hpp"

namespace popxl {

using dnnl::memory;

inline dnnl::engine& cpu() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Float16 and float8 operands run through float32 primitives, staged in packed float32 scratch:
// the reference computes them in float32 and rounds once, and this CPU may lack f16 kernels.
inline bool dnnl_type(DType d, memory::data_type& out) {
  switch (d) {
    case DType::F32: case DType::F16: case DType::F8_143: case DType::F8_152:
      out = memory::data_type::f32;
      return true;
    default: return false;
  }
}

inline bool staged(const Buffer& b) { return b.dtype == DType::F16 || is_fp8(b.dtype); }

// `f(packed piece, float32 piece, count)` over the n values of a staged operand, in pieces spread
// over the threads when there are enough of them (nd_loop's rule).
template <class F>
void over_staged(uint8_t* packed, DType d, float* f32, int64_t n, F&& f) {
  const int64_t item = static_cast<int64_t>(itemsize(d));
  nd_loop<2>({n}, {std::vector<int64_t>{item}, {int64_t(sizeof(float))}}, {packed, reinterpret_cast<uint8_t*>(f32)},
             [&](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>&, int64_t len) {
               f(p[0], reinterpret_cast<float*>(p[1]), len);
             });
}

// A staged input's packed bytes as float32.
inline void unstage(uint8_t* packed, DType d, float* out, int64_t n) {
  over_staged(packed, d, out, n, [d](const uint8_t* in, float* f32, int64_t len) {
    if (is_fp8(d))
      fp8_format(d).decode_row(in, f32, len);
    else
      load_row<float>(in, static_cast<int64_t>(itemsize(d)), d, f32, len);
  });
}

// A staged output's float32 values, times `scale` (pow2scaled ops scale in float32, as the reference
// scales its float32 result), into its packed float16 bytes.
inline void restage(float* f32, uint8_t* packed, int64_t n, float scale = 1.0f) {
  over_staged(packed, DType::F16, f32, n, [scale](uint8_t* out, float* v, int64_t len) {
    if (scale != 1.0f)
      for (int64_t i = 0; i < len; ++i) v[i] *= scale;
    store_row<float>(out, 2, DType::F16, v, len);
  });
}

// One OpenMP thread for the lifetime of the guard (when `single`), then the previous count.
// oneDNN (OpenMP runtime) fixes its work split when a primitive is created, so both creation and
// every execution of a small primitive run under this guard.
class SingleThreadScope {
 public:
  explicit SingleThreadScope(bool single) : saved_(single ? omp_get_max_threads() : 0) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~SingleThreadScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int saved_;
};

// oneDNN's dims are 64-bit, but some of its heuristics hold them in 32 bits: a matmul with M or
// K of 2**32 or more dies of SIGFPE (a division by a size that wrapped to 0) while its primitive
// is created. Such operands are refused here, as dnnl::error, so the op runs on the fallback.
inline void check_dims(const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (d > std::numeric_limits<int32_t>::max())
      throw dnnl::error(dnnl_unimplemented, "a dimension beyond 2**31 - 1");
}

// A buffer as a oneDNN memory descriptor of `dims`, with `strides` in elements.
inline memory::desc md(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, memory::data_type t) {
  check_dims(dims);
  return memory::desc(memory::dims(dims.begin(), dims.end()), t, memory::dims(strides.begin(), strides.end()));
}

// Element strides of a buffer as oneDNN sees it (packed when staged).
inline std::vector<int64_t> elem_strides(const Buffer& b) {
  const Buffer& v = staged(b) ? packed_like(b) : b;
  std::vector<int64_t> s;
  for (auto x : v.strides) s.push_back(x / static_cast<int64_t>(itemsize(v.dtype)));
  return s;
}

// Attributes that make a primitive take its scratchpad from us (DNNL_ARG_SCRATCHPAD) rather
// than from oneDNN's own allocations, so that it lives in the engine's scratch region.
inline dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr = dnnl::primitive_attr()) {
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A primitive created from a descriptor made with user_scratchpad(), its arguments (memory
// objects are handles: data pointers set on them later are seen through this map, built once)
// and its scratchpad, reserved in the owning kernel's scratch layout. Every oneDNN primitive here
// is one of these.
class Primitive {
 public:
  Primitive() = default;
  // primitive_desc_base: reorders' descriptors do not derive from dnnl::primitive_desc.
  Primitive(const dnnl::primitive_desc_base& pd, ScratchLayout& scratch) : prim_(pd.get()) {
    const memory::desc d = pd.scratchpad_desc();
    if (d.get_size() == 0) return;
    scratch.reserve_scratchpad(d.get_size());
    pad_ = memory(d, cpu(), DNNL_MEMORY_NONE);
    args_[DNNL_ARG_SCRATCHPAD] = pad_;
  }
  void arg(int id, const memory& m) { args_[id] = m; }
  void execute(dnnl::stream& strm, const ScratchLayout& scratch) {
    if (pad_) pad_.set_data_handle(scratch.scratchpad());
    prim_.execute(strm, args_);
  }
  // A reorder between two memories (the layouts their descriptors give).
  static Primitive reorder(const memory& from, const memory& to, ScratchLayout& scratch) {
    Primitive p(dnnl::reorder::primitive_desc(from, to, user_scratchpad()), scratch);
    p.arg(DNNL_ARG_FROM, from);
    p.arg(DNNL_ARG_TO, to);
    return p;
  }

 private:
  dnnl::primitive prim_;
  memory pad_;
  std::unordered_map<int, memory> args_;
};

// ---- convolution and pooling: windows, layouts, reordered operands --------------------------------
// Window geometry from the op attributes (spatial dims only). oneDNN counts dilation from 0.
struct Window {
  memory::dims strides, dilates, pad_l, pad_r;
};

// `prefix`: "pool_" for the max pool a conv_fused may end with.
inline Window window_of(const OpInstr& ins, size_t r, const std::string& prefix = "") {
  auto get = [&](const char* name, int64_t dflt) {
    const std::string full = prefix + name;
    return ins.attr_is_none(full.c_str()) ? std::vector<int64_t>(r, dflt) : ins.attr_ints(full.c_str());
  };
  const auto st = get("strides", 1), dl = get("dilations", 1), pads = get("pads", 0);
  Window w;
  for (size_t i = 0; i < r; ++i) {
    w.strides.push_back(st[i]);
    w.dilates.push_back(dl[i] - 1);
    w.pad_l.push_back(pads[i]);
    w.pad_r.push_back(pads[r + i]);
  }
  return w;
}

// The right padding that makes oneDNN's output-size rule give `out` (ceil mode, or strides that
// leave the end of the padded input unused).
inline void fit_right_padding(Window& w, const std::vector<int64_t>& in, const std::vector<int64_t>& kernel,
                       const std::vector<int64_t>& out, bool transposed) {
  for (size_t i = 0; i < w.strides.size(); ++i) {
    const int64_t eff = (kernel[i] - 1) * (w.dilates[i] + 1) + 1;
    w.pad_r[i] = transposed ? (in[i] - 1) * w.strides[i] + eff - w.pad_l[i] - out[i]
                            : (out[i] - 1) * w.strides[i] + eff - in[i] - w.pad_l[i];
  }
}

inline std::vector<int64_t> spatial(const std::vector<int64_t>& shape) { return {shape.begin() + 2, shape.end()}; }

// A 4-D buffer as elements of type t: contiguous NHWC when popxl.transforms.keep_channels_last
// keeps it channels-last, else the strided NCHW view the buffer describes.
inline memory::desc user_desc(const Buffer& b, bool nhwc, memory::data_type t) {
  // With one spatial position the two layouts are the same bytes: say NHWC, what the primitives
  // write, so that no reorder runs (a global pool's result).
  if (b.contiguous && b.shape.size() == 4 && b.shape[2] * b.shape[3] == 1) nhwc = true;
  check_dims(b.shape);
  return nhwc ? memory::desc(memory::dims(b.shape.begin(), b.shape.end()), t, memory::format_tag::nhwc)
              : md(b.shape, elem_strides(b), t);
}

// The arena's element type of a float32 or float16 operand of the blocked-layout kernels below:
// their primitives compute in float32, and the reorders in and out convert float16.
inline memory::data_type stored_type(const Buffer& b) {
  return b.dtype == DType::F16 ? memory::data_type::f16 : memory::data_type::f32;
}
inline memory::desc user_desc(const Buffer& b, bool nhwc) { return user_desc(b, nhwc, stored_type(b)); }

// Which operands an op's `layouts` attribute (keep_channels_last) puts in NHWC; all false without it.
inline std::vector<bool> nhwc_slots(const OpInstr& ins, size_t n) {
  std::vector<bool> out(n, false);
  if (!ins.declares("layouts") || ins.attr_is_none("layouts")) return out;
  const std::vector<std::string> l = ins.attr_strs("layouts");
  for (size_t i = 0; i < n && i < l.size(); ++i) out[i] = l[i] == "nhwc";
  return out;
}

constexpr int kSrcSlot = 0, kWeightsSlot = 1, kDstSlot = 2;
// One operand: `user` is the arena tensor, `inner` the layout the primitive wants. When they
// differ, `convert` reorders user -> inner for an input, inner -> user for the output, and
// `keep` says where `inner` lives:
//
// - Keep::None: in a piece of the kernel's scratch (the arena keeps no copies between ops);
//   reordered on every run.
// - Keep::Bytes (weights): in storage of its own, reordered again only when the bytes of `user`
//   differ from a saved copy of those it was last reordered from: weights rarely change, and a
//   byte comparison is far cheaper than a reorder. `user` must be contiguous.
// - Keep::Static (weights in static storage, OpInstr::static_inputs): their bytes change only
//   with the engine's weights epoch, so a copy reordered at the current epoch from the same
//   arena is current: no comparison, no saved bytes. Each arena (replica) keeps its own copy,
//   since replicas may hold different weights.
//
// A float16 `user` (a dense block of memory) is staged: converted to and from a float32 copy in
// the same layout in scratch, eight values at a time on both threads (F16C), which oneDNN's
// reorders then take; their own float16 conversion is a reference loop on CPUs without AVX-512,
// ~50x slower (ResNet-18: 3 images/s against 45 for float32).
struct ReorderedOperand {
  enum class Keep { None, Bytes, Static };
  memory user, inner;  // user: the arena tensor, or its float32 staging copy
  Primitive convert;
  bool reordered = false, output = false, f16 = false;
  Keep keep = Keep::None;
  size_t at = 0;           // `inner`'s scratch offset (Keep::None)
  size_t staging = 0;      // f16: the float32 copy's scratch offset
  int64_t nelms = 0;       // f16: values in the tensor
  uint8_t* data = nullptr;  // the arena tensor (bind)
  StaticCopies kept;        // Static: a copy per arena; Bytes: its one copy (owner null)
  std::vector<uint8_t> last;  // Bytes: the user bytes last reordered
  ReorderedOperand() = default;
  ReorderedOperand(const memory::desc& arena_d, const memory::desc& inner_d, bool output_, ScratchLayout& scratch,
                   Keep keep_ = Keep::None)
      : output(output_), f16(arena_d.get_data_type() == memory::data_type::f16), keep(keep_) {
    memory::desc user_d = arena_d;
    if (f16) {
      const memory::dims dims = arena_d.get_dims();
      nelms = std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
      if (arena_d.get_size() != static_cast<size_t>(nelms) * 2)
        throw std::runtime_error("a float16 operand must be a dense block to be staged");
      user_d = memory::desc(dims, memory::data_type::f32, arena_d.get_strides());
      staging = scratch.reserve(user_d.get_size());
    }
    user = memory(user_d, cpu(), DNNL_MEMORY_NONE);
    reordered = user_d != inner_d;
    if (!reordered) keep = Keep::None;  // inner is user (for float16, the staging copy in scratch)
    inner = reordered ? memory(inner_d, cpu(), DNNL_MEMORY_NONE) : user;
    if (!reordered) return;
    convert = output ? Primitive::reorder(inner, user, scratch) : Primitive::reorder(user, inner, scratch);
    if (keep == Keep::None)
      at = scratch.reserve(inner_d.get_size());
    else
      kept = StaticCopies(inner_d.get_size());
    if (keep == Keep::Bytes) inner.set_data_handle(kept.copy_for(nullptr, nullptr).first);
  }
  void bind(uint8_t* data_, const ScratchLayout& scratch) {
    data = data_;
    user.set_data_handle(f16 ? scratch.at(staging) : data);
    if (reordered && keep == Keep::None) inner.set_data_handle(scratch.at(at));
  }
  // `epoch`: the engine's weights epoch (Keep::Static; without one, every run reorders).
  void to_inner(dnnl::stream& strm, const ScratchLayout& scratch, const uint64_t* epoch = nullptr) {
    if (output) return;
    if (!reordered) {  // the primitive reads user itself (keep is None)
      if (f16) unstage(data, DType::F16, static_cast<float*>(user.get_data_handle()), nelms);
      return;
    }
    if (keep == Keep::Bytes) {
      const size_t n = f16 ? static_cast<size_t>(nelms) * 2 : user.get_desc().get_size();
      if (last.size() == n && std::memcmp(last.data(), data, n) == 0) return;
      last.assign(data, data + n);
    } else if (keep == Keep::Static) {
      const auto [copy, stale] = kept.copy_for(data, epoch);
      inner.set_data_handle(copy);
      if (!stale) return;
    }
    if (f16) unstage(data, DType::F16, static_cast<float*>(user.get_data_handle()), nelms);
    convert.execute(strm, scratch);
  }
  void to_user(dnnl::stream& strm, const ScratchLayout& scratch) {
    if (!output) return;
    if (reordered) convert.execute(strm, scratch);
    if (f16) {
      strm.wait();
      restage(static_cast<float*>(user.get_data_handle()), data, nelms);
    }
  }
};

// A kernel of one oneDNN primitive (matmul, an unfused pooling or convolution) on arena operands.
struct DnnlKernel : Kernel {
  struct Arg {
    memory mem;
    Buffer buf;
    bool output;
    int id;             // the oneDNN argument (DNNL_ARG_SRC, ...)
    size_t f32 = 0;     // staged: scratch offset of the operand as float32
    size_t packed = 0;  // staged and strided: scratch offset of its packed bytes
  };
  Primitive prim;
  // Set instead of prim when every operand is staged and sgemm can compute on the staged float32
  // scratch (float16 matmuls): it is 1.3-1.6x faster than oneDNN's f32 matmul (see gemm.cpp).
  std::unique_ptr<Kernel> gemm;
  std::vector<Arg> args;
  bool single_thread = false;  // created under SingleThreadScope: run under it too
  dnnl::stream strm{cpu()};
  // Weights in static storage kept in the primitive's own layout (set with keep_weights).
  std::optional<ReorderedOperand> kept_weights;
  int64_t kept_weights_at = 0;  // their arena offset
  bool scaled = false;  // pow2scaled ops: staged outputs are multiplied by 2**(scale tensor)
  Buffer scale;
  std::string op;  // the op's type, for errors
  std::string primitive_name;  // what algorithm() reports for a primitive (empty: nothing)
  std::string algorithm() const override { return gemm ? gemm->algorithm() : primitive_name; }
  void run(uint8_t* arena) override {
    const float scale_value = scaled ? float(pow2_scale(arena, scale, op)) : 1.0f;  // checked before any work
    for (auto& a : args) {
      if (staged(a.buf)) {
        float* f32 = staging(a);
        if (!a.output) unstage(packed_bytes(a, arena, true), a.buf.dtype, f32, a.buf.nelms);
        a.mem.set_data_handle(f32);
      } else {
        a.mem.set_data_handle(arena + a.buf.offset);
      }
    }
    if (gemm) {
      gemm->run(scratch.at(0));  // its operand offsets are the staged operands' scratch offsets
    } else {
      SingleThreadScope scope(single_thread);
      if (kept_weights) {
        kept_weights->bind(arena + kept_weights_at, scratch);
        kept_weights->to_inner(strm, scratch, weights_epoch);
      }
      prim.execute(strm, scratch);
      strm.wait();
    }
    for (auto& a : args) {
      if (!staged(a.buf) || !a.output) continue;
      restage(staging(a), packed_bytes(a, arena, false), a.buf.nelms,
              scale_value);
      if (!a.buf.contiguous) copy_buffer(arena, a.buf, scratch.at(a.packed), packed_like(a.buf));
    }
  }
  float* staging(const Arg& a) const { return reinterpret_cast<float*>(scratch.at(a.f32)); }
  // Packed bytes of a staged operand: the arena when contiguous, else scratch (filled from the
  // arena for inputs).
  uint8_t* packed_bytes(const Arg& a, uint8_t* arena, bool fill) const {
    if (a.buf.contiguous) return arena + a.buf.offset;
    uint8_t* p = scratch.at(a.packed);
    if (fill) copy_buffer(p, packed_like(a.buf), arena, a.buf);
    return p;
  }
  // The operands, added before the primitive that reads them (use()): staged ones reserve their
  // scratch, whose offsets an sgemm on the staged operands needs before any primitive exists.
  void add(int id, const memory::desc& d, const Buffer& b, bool output = false) {
    Arg a{memory(d, cpu(), DNNL_MEMORY_NONE), b, output, id};
    if (staged(b)) {
      a.f32 = scratch.reserve(static_cast<size_t>(b.nelms) * sizeof(float));
      if (!b.contiguous) a.packed = scratch.reserve(static_cast<size_t>(b.nbytes()));
    }
    args.push_back(std::move(a));
  }
  void use(Primitive p) {
    prim = std::move(p);
    for (const Arg& a : args) prim.arg(a.id, a.mem);
    if (kept_weights) prim.arg(DNNL_ARG_WEIGHTS, kept_weights->inner);
  }
  // Float32 weights `w` in static storage (arena layout `user`) read by the primitive in layout
  // `inner`: reordered into a copy kept per arena when the weights epoch moves on, not every run.
  // Call before use(), instead of add() for them.
  void keep_weights(const Buffer& w, const memory::desc& user, const memory::desc& inner) {
    kept_weights.emplace(user, inner, false, scratch, ReorderedOperand::Keep::Static);
    kept_weights_at = w.offset;
  }
};

// Every (given) operand float32, or every one float16 and contiguous (staged as a dense block,
// whose layout elem_strides describes), none empty.
inline bool one_float_type(std::initializer_list<const Buffer*> bs) {
  const DType d = (*bs.begin())->dtype;
  if (d != DType::F32 && d != DType::F16) return false;
  for (const Buffer* b : bs)
    if (b && (b->dtype != d || b->nelms == 0 || (d == DType::F16 && !b->contiguous))) return false;
  return true;
}

}  // namespace popxl
