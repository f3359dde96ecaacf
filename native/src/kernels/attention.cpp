// Fused attention (popxl/ops/fused_attention.py): attention = softmax(q k^T * scale + mask) v, and
// attention_grad, its three gradients, for float32 (other dtypes fall back to the NumPy kernels).
//
// Work goes by blocks of query rows of one (batch, head) matrix: a block's scores are one sgemm
// into a per-thread buffer of rows x Sk floats (kScoreFloats, 64 KiB: in cache), the mask is added
// and each row softmaxed there, and one more sgemm multiplies the block by v straight into the
// output. No (seq, seq) tensor is ever stored: O(seq) memory per head. Blocks are as tall as the
// buffer allows (all 128 rows of a BERT head), as sgemm's cost per call dominates small products. q, k and v are read through their
// strides (a head of a (batch, seq, heads, dim) tensor is a strided matrix sgemm reads as is), so
// the transposes that split heads cost nothing.
//
// The gradient recomputes each block's probabilities P the same way (bit-identical to the
// forward's) and, per (batch, head), accumulates dv += P^T dO and dk += scale dS^T q over the
// blocks, with dS = P * (dO v^T - rowsum(dO * O)) and dq = scale dS k for the block's rows.
#include <algorithm>
#include <vector>

#include "blas.hpp"
#include "loops.hpp"
#include "vec_math.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

constexpr int64_t kScoreFloats = 16384;
constexpr int64_t kMinBlockRows = 16;

// Query rows per block for Sk keys.
int64_t block_rows(int64_t sq, int64_t sk) {
  return std::min(sq, std::max(kMinBlockRows, kScoreFloats / std::max<int64_t>(sk, 1)));
}

// One (rows x cols) float32 matrix of every (batch, head): element strides and per-matrix offsets
// (in floats from the arena base).
struct Mat {
  int64_t rows = 0, cols = 0;
  BlasLayout layout{};
  std::vector<int64_t> base;  // one per matrix of the stack
};

// The matrices of buffer `b` (rank r, leading axes the stack) in stack order; false when sgemm
// cannot read them (neither of the last two strides is one element) or they are not float32.
bool stack_of(const Buffer& b, Mat& m, bool transposed = false) {
  const size_t r = b.shape.size();
  if (b.dtype != DType::F32 || r < 2) return false;
  for (int64_t s : b.strides)
    if (s % int64_t(sizeof(float))) return false;
  int64_t rs = b.strides[r - 2] / 4, cs = b.strides[r - 1] / 4;
  m.rows = b.shape[r - 2];
  m.cols = b.shape[r - 1];
  if (transposed) {  // read as its transpose (k as k^T)
    std::swap(m.rows, m.cols);
    std::swap(rs, cs);
  }
  if (!blas_layout(m.rows, m.cols, rs, cs, m.layout)) return false;
  const int64_t count = prod(b.shape, 0, r - 2);
  m.base.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i, off = b.offset / 4;
    for (size_t d = r - 2; d-- > 0;) {
      off += (rem % b.shape[d]) * (b.strides[d] / 4);
      rem /= b.shape[d];
    }
    m.base[i] = off;
  }
  return true;
}

// Floats from a matrix's row r to row r + 1: a transposed layout stores it column by column.
int64_t row_stride(const Mat& m) { return m.layout.trans ? 1 : m.layout.ld; }

// What both kernels share: the operands as stacks of matrices, the mask's byte strides broadcast
// to the scores (..., Sq, Sk), and the probabilities of a block of query rows.
struct Attention {
  Mat q, kt, v;  // q (Sq x D), k read as k^T (D x Sk), v (Sk x Dv)
  int64_t sq = 0, sk = 0, d = 0, dv = 0, stack = 0;
  float scale = 1.0f;
  bool has_mask = false;
  int64_t mask_offset = 0;
  std::vector<int64_t> mask_strides, shape;  // over (stack axes..., Sq, Sk)
  int threads = 1;
  int64_t rows_per_block = 1;
  Sgemm sgemm = nullptr;  // the preferred library's (blas.hpp): the forward and the gradient the same

  // C (m x n, row-major, ldc) = alpha op(A) op(B) + beta C, where the operands are given by their
  // layouts as stored and `ta` / `tb` say whether to use them transposed once more.
  void gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* A, const BlasLayout& la, bool ta,
            const float* B, const BlasLayout& lb, bool tb, float beta, float* C, int64_t ldc) const {
    sgemm(la.trans != ta, lb.trans != tb, int(m), int(n), int(k), alpha, A, int(la.ld), B, int(lb.ld), beta, C,
          int(ldc));
  }

  bool init(const OpInstr& ins, const std::vector<Buffer>& bufs, bool with_mask) {
    const Buffer &qb = in(ins, bufs, 0), &kb = in(ins, bufs, 1), &vb = in(ins, bufs, 2);
    if (!stack_of(qb, q) || !stack_of(kb, kt, true) || !stack_of(vb, v)) return false;
    sq = q.rows, d = q.cols, sk = kt.cols, dv = v.cols;
    stack = int64_t(q.base.size());
    if (std::min({sq, sk, d, dv}) == 0) return false;  // empty products: the NumPy kernel
    if (std::max({sq, sk, d, dv, q.layout.ld, kt.layout.ld, v.layout.ld}) > 0x7fffffff) return false;
    scale = float(ins.attr_float("scale"));
    if (with_mask) {
      const Buffer& mb = in(ins, bufs, 3);
      if (mb.dtype != DType::F32) return false;
      shape = qb.shape;
      shape.back() = sk;
      has_mask = true;
      mask_offset = mb.offset;
      mask_strides = broadcast_strides(mb, shape);
    }
    threads = threads::max_threads();
    rows_per_block = block_rows(sq, sk);
    sgemm = sgemm_of(preferred_blas());
    return true;
  }

  // P (rows x sk, row-major in `p`) for query rows [r0, r0 + rows) of matrix i.
  void probabilities(const uint8_t* arena, int64_t i, int64_t r0, int64_t rows, float* p) const {
    const float* A = reinterpret_cast<const float*>(arena);
    const float* qa = A + q.base[i] + r0 * row_stride(q);
    gemm(rows, sk, d, scale, qa, q.layout, false, A + kt.base[i], kt.layout, false, 0.0f, p, sk);
    if (has_mask) {
      const size_t r = shape.size();
      int64_t off = mask_offset, rem = i;
      for (size_t dd = r - 2; dd-- > 0;) {
        off += (rem % shape[dd]) * mask_strides[dd];
        rem /= shape[dd];
      }
      const int64_t ms_row = mask_strides[r - 2], ms_col = mask_strides[r - 1];
      for (int64_t row = 0; row < rows; ++row) {
        const uint8_t* m = arena + off + (r0 + row) * ms_row;
        float* pr = p + row * sk;
        if (ms_col == int64_t(sizeof(float))) {
          const float* mf = reinterpret_cast<const float*>(m);
          for (int64_t j = 0; j < sk; ++j) pr[j] += mf[j];
        } else {
          for (int64_t j = 0; j < sk; ++j) pr[j] += *reinterpret_cast<const float*>(m + j * ms_col);
        }
      }
    }
    for (int64_t row = 0; row < rows; ++row) softmax_row(p + row * sk, p + row * sk, sk);
  }

  int64_t blocks() const { return (sq + rows_per_block - 1) / rows_per_block; }
};

struct AttentionKernel : Kernel {
  Attention at;
  int64_t y_base = 0, ldy = 0;
  size_t per_thread = 0;

  void run(uint8_t* arena) override {
    float* Y = reinterpret_cast<float*>(arena) + y_base;
    const float* A = reinterpret_cast<const float*>(arena);
    const int64_t blocks = at.blocks(), items = at.stack * blocks;
    auto work = [&](int64_t item, float* p) {
      const int64_t i = item / blocks, r0 = (item % blocks) * at.rows_per_block;
      const int64_t rows = std::min(at.rows_per_block, at.sq - r0);
      at.probabilities(arena, i, r0, rows, p);
      BlasLayout packed{false, at.sk};
      at.gemm(rows, at.dv, at.sk, 1.0f, p, packed, false, A + at.v.base[i], at.v.layout, false, 0.0f,
           Y + (i * at.sq + r0) * ldy, ldy);
    };
    if (at.threads <= 1 || items == 1 || at.stack * at.sq * at.sk * at.d < kSingleThreadWork) {
      float* p = reinterpret_cast<float*>(scratch.at(0));
      for (int64_t item = 0; item < items; ++item) work(item, p);
      return;
    }
    threads::Dynamic next(items);
    threads::region([&](int id, int) {
      float* p = reinterpret_cast<float*>(scratch.at(per_thread * size_t(id)));
      for (int64_t item; (item = next.next()) >= 0;) work(item, p);
    }, true, at.threads);
  }
};

// The gradient: one (batch, head) per task, as dk and dv gather over all of its query rows.
struct AttentionGradKernel : Kernel {
  Attention at;
  Mat o, g;                   // the forward's output and its gradient (Sq x Dv)
  int64_t dq = 0, dk = 0, dvb = 0;  // packed outputs, float offsets
  size_t per_thread = 0;

  void run(uint8_t* arena) override {
    float* A = reinterpret_cast<float*>(arena);
    const int64_t sq = at.sq, sk = at.sk, d = at.d, dv = at.dv;
    auto task = [&](int64_t i, float* p, float* ds, float* dot) {
      const BlasLayout packed_sk{false, sk};
      float* DQ = A + dq + i * sq * d;
      float* DK = A + dk + i * sk * d;
      float* DV = A + dvb + i * sk * dv;
      for (int64_t r0 = 0; r0 < sq; r0 += at.rows_per_block) {
        const int64_t rows = std::min(at.rows_per_block, sq - r0);
        const float beta = r0 == 0 ? 0.0f : 1.0f;  // dk and dv: the first block writes, the others add
        at.probabilities(arena, i, r0, rows, p);
        const float* G = A + g.base[i] + r0 * row_stride(g);
        const float* O = A + o.base[i] + r0 * row_stride(o);
        // dv += P^T dO
        at.gemm(sk, dv, rows, 1.0f, p, packed_sk, true, G, g.layout, false, beta, DV, dv);
        // dS = P * (dO v^T - rowsum(dO * O))
        at.gemm(rows, sk, dv, 1.0f, G, g.layout, false, A + at.v.base[i], at.v.layout, true, 0.0f, ds, sk);
        for (int64_t row = 0; row < rows; ++row) {
          double total = 0;
          for (int64_t j = 0; j < dv; ++j) {
            const int64_t gj = g.layout.trans ? row + j * g.layout.ld : row * g.layout.ld + j;
            const int64_t oj = o.layout.trans ? row + j * o.layout.ld : row * o.layout.ld + j;
            total += double(G[gj]) * double(O[oj]);
          }
          dot[row] = float(total);
        }
        for (int64_t row = 0; row < rows; ++row) {
          float* dsr = ds + row * sk;
          const float* pr = p + row * sk;
          const float c = dot[row];
          for (int64_t j = 0; j < sk; ++j) dsr[j] = pr[j] * (dsr[j] - c);
        }
        // dq = scale dS k (k as stored: kt read transposed once more), dk += scale dS^T q
        at.gemm(rows, d, sk, at.scale, ds, packed_sk, false, A + at.kt.base[i], at.kt.layout, true, 0.0f, DQ + r0 * d, d);
        at.gemm(sk, d, rows, at.scale, ds, packed_sk, true, A + at.q.base[i] + r0 * row_stride(at.q), at.q.layout, false,
             beta, DK, d);
      }
    };
    const size_t block = size_t(at.rows_per_block * sk);
    auto buffers = [&](int t, float*& p, float*& ds, float*& dot) {
      float* base = reinterpret_cast<float*>(scratch.at(per_thread * size_t(t)));
      p = base, ds = base + block, dot = base + 2 * block;
    };
    if (at.threads <= 1 || at.stack == 1 || at.stack * sq * sk * d < kSingleThreadWork) {
      float *p, *ds, *dot;
      buffers(0, p, ds, dot);
      for (int64_t i = 0; i < at.stack; ++i) task(i, p, ds, dot);
      return;
    }
    threads::Dynamic next(at.stack);
    threads::region([&](int id, int) {
      float *p, *ds, *dot;
      buffers(id, p, ds, dot);
      for (int64_t i; (i = next.next()) >= 0;) task(i, p, ds, dot);
    }, true, at.threads);
  }
};

bool packed_f32(const Buffer& b) { return b.dtype == DType::F32 && b.contiguous; }

const RegisterKernel attention_ops[] = {
    {{"attention"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
       auto k = std::make_unique<AttentionKernel>();
       const Buffer& y = out(ins, bufs);
       if (!k->at.init(ins, bufs, ins.inputs.size() == 4) || !packed_f32(y)) return nullptr;
       k->y_base = y.offset / 4;
       k->ldy = k->at.dv;
       k->per_thread = ScratchLayout::aligned(size_t(k->at.rows_per_block * k->at.sk) * sizeof(float));
       k->scratch.reserve(k->per_thread * size_t(k->at.threads));
       return k;
     }},
    {{"attention_grad"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
       auto k = std::make_unique<AttentionGradKernel>();
       const size_t n = ins.inputs.size();
       if (!k->at.init(ins, bufs, n == 6)) return nullptr;
       if (!stack_of(in(ins, bufs, int(n) - 2), k->o) || !stack_of(in(ins, bufs, int(n) - 1), k->g)) return nullptr;
       const Buffer &dq = bufs[ins.outputs[0]], &dk = bufs[ins.outputs[1]], &dv = bufs[ins.outputs[2]];
       if (!packed_f32(dq) || !packed_f32(dk) || !packed_f32(dv)) return nullptr;
       k->dq = dq.offset / 4, k->dk = dk.offset / 4, k->dvb = dv.offset / 4;
       const size_t rows = size_t(k->at.rows_per_block);
       k->per_thread = ScratchLayout::aligned((2 * rows * size_t(k->at.sk) + rows) * sizeof(float));
       k->scratch.reserve(k->per_thread * size_t(k->at.threads));
       return k;
     }},
};

}  // namespace
}  // namespace popxl
