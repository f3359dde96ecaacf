// matmul kernels backed by oneDNN (batched, broadcast, strided/transposed operands); float32
// ones that sgemm can read go to OpenBLAS (gemm.cpp).
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "gemm.hpp"
#include "onednn.hpp"

namespace popxl {
namespace {

// numpy.matmul shapes -> equal-rank dims/strides with 1-D operands promoted.
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

// matmul; matmul_pow2scaled (float8 operands, float16 result times 2**log2_scale); matmul_bias
// (float32 a @ b + a row vector, which the GEMM starts from); matmul_update_ (float32
// t += b * (a @ w), in place: a gradient's matmul that performs its SGD update, sgemm only).
enum class MatmulKind { Plain, Pow2, Bias, Update };

KernelFactory matmul(MatmulKind kind) {
  return [kind](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
  const Buffer& a = bufs[ins.inputs[0]];
  const Buffer& b = bufs[ins.inputs[1]];
  const Buffer& y = bufs[ins.outputs[0]];
  const Buffer* bias = kind == MatmulKind::Bias ? &bufs[ins.inputs[2]] : nullptr;
  const bool update = kind == MatmulKind::Update;
  memory::data_type ta, tb, ty;
  if (!dnnl_type(a.dtype, ta) || !dnnl_type(b.dtype, tb) || !dnnl_type(y.dtype, ty)) return nullptr;
  if (!y.contiguous || ((bias || update) && y.dtype != DType::F32) || (bias && bias->dtype != DType::F32))
    return nullptr;
  if (update && (a.nelms == 0 || b.nelms == 0))  // adds b times an empty sum: nothing changes
    return std::make_unique<FnKernel>([](uint8_t*) {});
  if (a.nelms == 0 || b.nelms == 0) {  // empty operands: an empty sum is 0 (plus the bias)
    const Buffer out = y;
    const std::optional<Buffer> row = bias ? std::optional<Buffer>(*bias) : std::nullopt;
    return std::make_unique<FnKernel>([out, row](uint8_t* arena) {
      if (!row) {
        std::memset(arena + out.offset, 0, out.nbytes());
        return;
      }
      const int64_t n = out.shape.back(), step = row->strides.back();
      float* dst = reinterpret_cast<float*>(arena + out.offset);
      for (int64_t i = 0; i < out.nelms; ++i)
        dst[i] = *reinterpret_cast<const float*>(arena + row->offset + (i % n) * step);
    });
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
    if (kind != MatmulKind::Pow2 && a.dtype == DType::F32 && b.dtype == DType::F32 && y.dtype == DType::F32) {
      GemmInto into;
      into.bias = bias;
      into.accumulate = update;
      if (update) into.alpha = float(ins.attr_float("b"));
      if (auto gemm = sgemm_matmul(A, B, ydims, a.offset, b.offset, y.offset, into)) return gemm;
    }
    if (update) return nullptr;  // operands sgemm cannot read: the NumPy kernel
    auto k = std::make_unique<DnnlKernel>();
    k->single_thread = prod(ydims) * A.dims[rank - 1] < kSingleThreadWork;
    SingleThreadScope scope(k->single_thread);
    auto ad = md(A.dims, A.strides, ta), bd = md(B.dims, B.strides, tb), yd = md(ydims, ystr, ty);
    k->add(DNNL_ARG_SRC, ad, a);
    k->add(DNNL_ARG_WEIGHTS, bd, b);
    k->add(DNNL_ARG_DST, yd, y, true);
    if (kind == MatmulKind::Pow2) {
      if (!staged(y)) return nullptr;
      k->scaled = true;
      k->scale = bufs[ins.inputs[2]];
      k->op = ins.type;
    }
    // Staged operands are packed float32 in scratch, as A, B and y describe them.
    if (!bias && staged(a) && staged(b) && staged(y))
      k->gemm = sgemm_matmul(A, B, ydims, k->args[0].f32, k->args[1].f32, k->args[2].f32);
    if (k->gemm) return k;
    if (bias) {  // (1, ..., 1, N), broadcast over the rows and batches
      std::vector<int64_t> bdims(rank, 1), bstr(rank, ydims[rank - 1]);
      bdims[rank - 1] = ydims[rank - 1];
      bstr[rank - 1] = bias->strides.back() / static_cast<int64_t>(sizeof(float));
      auto biasd = md(bdims, bstr, memory::data_type::f32);
      k->add(DNNL_ARG_BIAS, biasd, *bias);
      k->use(Primitive(dnnl::matmul::primitive_desc(cpu(), ad, bd, biasd, yd, user_scratchpad()), k->scratch));
    } else {
      k->use(Primitive(dnnl::matmul::primitive_desc(cpu(), ad, bd, yd, user_scratchpad()), k->scratch));
    }
    return k;
  } catch (const dnnl::error&) {
    return nullptr;  // not supported by oneDNN on this CPU: the engine falls back
  }
  };
}

const RegisterKernel matmul_ops[] = {
    {{"matmul"}, matmul(MatmulKind::Plain)},
    {{"matmul_pow2scaled"}, matmul(MatmulKind::Pow2)},
    {{"matmul_bias"}, matmul(MatmulKind::Bias)},
    {{"matmul_update_"}, matmul(MatmulKind::Update)},
};

}  // namespace
}  // namespace popxl
