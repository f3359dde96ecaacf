// Kernels backed by oneDNN: matmul (batched, broadcast, strided/transposed operands) and softmax.
// Primitives are created once at load; each run only points their memory at the arena.
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "loops.hpp"

namespace popxl {
namespace {

using dnnl::memory;

dnnl::engine& cpu() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

bool dnnl_type(DType d, memory::data_type& out) {
  switch (d) {
    case DType::F32: out = memory::data_type::f32; return true;
    case DType::F16: out = memory::data_type::f16; return true;
    default: return false;
  }
}

// A buffer as a oneDNN memory descriptor of `dims`, with `strides` in elements.
memory::desc md(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, memory::data_type t) {
  return memory::desc(memory::dims(dims.begin(), dims.end()), t, memory::dims(strides.begin(), strides.end()));
}

std::vector<int64_t> elem_strides(const Buffer& b) {
  std::vector<int64_t> s;
  for (auto v : b.strides) s.push_back(v / static_cast<int64_t>(itemsize(b.dtype)));
  return s;
}

struct DnnlKernel : Kernel {
  dnnl::primitive prim;
  std::vector<std::pair<int, memory>> args;  // (DNNL_ARG_*, memory)
  std::vector<int64_t> offsets;               // arena offset of each arg
  dnnl::stream strm{cpu()};
  void run(uint8_t* arena) override {
    std::unordered_map<int, memory> m;
    for (size_t i = 0; i < args.size(); ++i) {
      args[i].second.set_data_handle(arena + offsets[i]);
      m.emplace(args[i].first, args[i].second);
    }
    prim.execute(strm, m);
    strm.wait();
  }
  void add(int arg, const memory::desc& d, int64_t offset) {
    args.emplace_back(arg, memory(d, cpu(), DNNL_MEMORY_NONE));
    offsets.push_back(offset);
  }
};

// numpy.matmul shapes -> equal-rank dims/strides with 1-D operands promoted.
struct MatOperand { std::vector<int64_t> dims, strides; };

MatOperand promote(const Buffer& b, bool is_lhs, size_t rank) {
  MatOperand m{b.shape, elem_strides(b)};
  if (m.dims.size() == 1) {
    if (is_lhs) { m.dims.insert(m.dims.begin(), 1); m.strides.insert(m.strides.begin(), 0); }
    else { m.dims.push_back(1); m.strides.push_back(0); }
  }
  while (m.dims.size() < rank) { m.dims.insert(m.dims.begin(), 1); m.strides.insert(m.strides.begin(), 0); }
  // oneDNN wants a real stride on size-1 dims too
  for (size_t i = m.dims.size(); i-- > 0;)
    if (m.dims[i] == 1) m.strides[i] = (i + 1 < m.dims.size()) ? m.strides[i + 1] * m.dims[i + 1] : 1;
  return m;
}

const RegisterKernel matmul_op{{"matmul"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
  const Buffer& a = bufs[ins.inputs[0]];
  const Buffer& b = bufs[ins.inputs[1]];
  const Buffer& y = bufs[ins.outputs[0]];
  memory::data_type ta, tb, ty;
  if (!dnnl_type(a.dtype, ta) || !dnnl_type(b.dtype, tb) || !dnnl_type(y.dtype, ty)) return nullptr;
  if (!y.contiguous) return nullptr;
  if (a.nelms == 0 || b.nelms == 0) {  // empty operands: an empty sum is 0
    const int64_t off = y.offset, bytes = y.nbytes();
    return std::make_unique<FnKernel>([off, bytes](uint8_t* arena) { std::memset(arena + off, 0, bytes); });
  }
  const size_t rank = std::max<size_t>({a.shape.size(), b.shape.size(), 2});
  MatOperand A = promote(a, true, rank), B = promote(b, false, rank);
  std::vector<int64_t> ydims(rank), ystr(rank);
  for (size_t i = 0; i + 2 < rank; ++i) ydims[i] = std::max(A.dims[i], B.dims[i]);
  ydims[rank - 2] = A.dims[rank - 2];
  ydims[rank - 1] = B.dims[rank - 1];
  int64_t acc = 1;  // output buffers are contiguous
  for (size_t i = rank; i-- > 0;) { ystr[i] = acc; acc *= ydims[i]; }
  try {
    auto k = std::make_unique<DnnlKernel>();
    auto ad = md(A.dims, A.strides, ta), bd = md(B.dims, B.strides, tb), yd = md(ydims, ystr, ty);
    dnnl::matmul::primitive_desc pd(cpu(), ad, bd, yd);
    k->prim = dnnl::matmul(pd);
    k->add(DNNL_ARG_SRC, ad, a.offset);
    k->add(DNNL_ARG_WEIGHTS, bd, b.offset);
    k->add(DNNL_ARG_DST, yd, y.offset);
    return k;
  } catch (const dnnl::error&) {
    return nullptr;  // not supported by oneDNN on this CPU: the engine falls back
  }
}};

const RegisterKernel softmax_op{{"softmax"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
  const Buffer& x = bufs[ins.inputs[0]];
  const Buffer& y = bufs[ins.outputs[0]];
  memory::data_type t;
  if (!dnnl_type(x.dtype, t) || x.shape.empty() || x.nelms == 0) return nullptr;
  const int axis = static_cast<int>(ins.attrs.at("axis").i());
  try {
    auto k = std::make_unique<DnnlKernel>();
    auto xd = md(x.shape, elem_strides(x), t), yd = md(y.shape, elem_strides(y), t);
    dnnl::softmax_forward::primitive_desc pd(cpu(), dnnl::prop_kind::forward_inference,
                                             dnnl::algorithm::softmax_accurate, xd, yd, axis);
    k->prim = dnnl::softmax_forward(pd);
    k->add(DNNL_ARG_SRC, xd, x.offset);
    k->add(DNNL_ARG_DST, yd, y.offset);
    return k;
  } catch (const dnnl::error&) {
    return nullptr;
  }
}};

}  // namespace
}  // namespace popxl
