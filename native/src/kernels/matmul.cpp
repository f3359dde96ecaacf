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
// (float32 a @ b + a row vector, which the GEMM starts from); matmul_bias_add (matmul_bias plus a
// float32 tensor of the product's shape: a residual connection); matmul_update_ (float32
// t += b * (a @ w), in place: a gradient's matmul that performs its SGD update). What is added to
// the product rides in the GEMM: sgemm starts from it (beta = 1), oneDNN adds it in the
// epilogue of its kernel (post-ops), so none costs a pass over the output of its own.
enum class MatmulKind { Plain, Pow2, Bias, BiasAdd, Update };

// Whether a matmul keeps its float32 right operand, which lies in static storage, in oneDNN's
// layout (see DnnlKernel::keep_weights) rather than having sgemm or oneDNN pack it on every call.
bool packs_static_weights(MatmulKind kind, const Buffer& b, const OpInstr& ins) {
  return kind != MatmulKind::Update && kind != MatmulKind::Pow2 && b.dtype == DType::F32 && ins.is_static_input(1);
}

KernelFactory matmul(MatmulKind kind) {
  return [kind](const OpInstr& ins, const std::vector<Buffer>& bufs) -> std::unique_ptr<Kernel> {
  const Buffer& a = bufs[ins.inputs[0]];
  const Buffer& b = bufs[ins.inputs[1]];
  const Buffer& y = bufs[ins.outputs[0]];
  const Buffer* bias = kind == MatmulKind::Bias || kind == MatmulKind::BiasAdd ? &bufs[ins.inputs[2]] : nullptr;
  const Buffer* residual = kind == MatmulKind::BiasAdd ? &bufs[ins.inputs[3]] : nullptr;
  const bool update = kind == MatmulKind::Update;
  memory::data_type ta, tb, ty;
  if (!dnnl_type(a.dtype, ta) || !dnnl_type(b.dtype, tb) || !dnnl_type(y.dtype, ty)) return nullptr;
  if (!y.contiguous || ((bias || update) && y.dtype != DType::F32) || (bias && bias->dtype != DType::F32))
    return nullptr;
  // The residual is read as y's bytes would be (packed, y's shape, as the op's shape rule makes it).
  if (residual && (residual->dtype != DType::F32 || !residual->contiguous || residual->shape != y.shape))
    return nullptr;
  if (residual && (a.nelms == 0 || b.nelms == 0)) return nullptr;  // bias + residual alone: the NumPy kernel
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
  // Weights in static storage (an inference's): oneDNN's primitive chooses their layout, and a copy
  // in it is made when they change rather than packed by every call.
  const bool keep_b = packs_static_weights(kind, b, ins);
  const bool f32 = kind != MatmulKind::Pow2 && a.dtype == DType::F32 && b.dtype == DType::F32 && y.dtype == DType::F32;
  GemmInto into;
  into.bias = bias;
  into.residual = residual;
  into.accumulate = update;
  if (update) into.alpha = float(ins.attr_float("b"));
  into.static_weights = keep_b;
  try {
    if (f32)
      if (auto gemm = sgemm_matmul(A, B, ydims, a.offset, b.offset, y.offset, into)) return gemm;
    auto k = std::make_unique<DnnlKernel>();
    k->single_thread = prod(ydims) * A.dims[rank - 1] < kSingleThreadWork;
    SingleThreadScope scope(k->single_thread);
    auto ad = md(A.dims, A.strides, ta), bd = md(B.dims, B.strides, tb), yd = md(ydims, ystr, ty);
    k->add(DNNL_ARG_SRC, ad, a);
    if (keep_b)
      bd = memory::desc(memory::dims(B.dims.begin(), B.dims.end()), tb, memory::format_tag::any);
    else
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
    dnnl::post_ops post;
    if (update) {  // y = b * (a @ w) + y
      post.append_eltwise(dnnl::algorithm::eltwise_linear, float(ins.attr_float("b")), 0.f);
      post.append_sum(1.f);
    }
    if (residual) {
      post.append_binary(dnnl::algorithm::binary_add, yd);
      k->add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, yd, *residual);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(post);
    std::optional<dnnl::matmul::primitive_desc> pd;
    if (bias) {  // (1, ..., 1, N), broadcast over the rows and batches
      std::vector<int64_t> bdims(rank, 1), bstr(rank, ydims[rank - 1]);
      bdims[rank - 1] = ydims[rank - 1];
      bstr[rank - 1] = bias->strides.back() / static_cast<int64_t>(sizeof(float));
      auto biasd = md(bdims, bstr, memory::data_type::f32);
      k->add(DNNL_ARG_BIAS, biasd, *bias);
      pd.emplace(cpu(), ad, bd, biasd, yd, user_scratchpad(attr));
    } else {
      pd.emplace(cpu(), ad, bd, yd, user_scratchpad(attr));
    }
    // oneDNN's reference implementation (its only one for some products on some CPUs) runs a
    // hundred times slower than a GEMM: sgemm takes every such float32 product.
    if (f32 && std::string(pd->impl_info_str()).rfind("ref", 0) == 0) {
      into.only_sgemm = true;
      if (auto gemm = sgemm_matmul(A, B, ydims, a.offset, b.offset, y.offset, into)) return gemm;
      // strides sgemm cannot take: it reads a packed copy of each strided operand, made every run
      if (!a.contiguous) into.copy_a = &a;
      if (!b.contiguous) into.copy_b = &b;
      const MatOperand packed_a = a.contiguous ? A : promote(packed_like(a), true, rank);
      const MatOperand packed_b = b.contiguous ? B : promote(packed_like(b), false, rank);
      if (auto gemm = sgemm_matmul(packed_a, packed_b, ydims, a.contiguous ? a.offset : 0,
                                   b.contiguous ? b.offset : 0, y.offset, into))
        return gemm;
    }
    if (keep_b) k->keep_weights(b, md(B.dims, B.strides, tb), pd->weights_desc());
    // oneDNN's name for the implementation, as convolutions report theirs (conv.cpp)
    k->primitive_name = std::string("oneDNN matmul (") + pd->impl_info_str() + (keep_b ? ", weights kept packed)" : ")");
    k->use(Primitive(*pd, k->scratch));
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
    {{"matmul_bias_add"}, matmul(MatmulKind::BiasAdd)},
    {{"matmul_update_"}, matmul(MatmulKind::Update)},
};

}  // namespace
}  // namespace popxl
