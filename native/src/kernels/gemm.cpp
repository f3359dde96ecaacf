// Float32 matmul through a CBLAS sgemm (blas.hpp): MKL's on Intel CPUs that have it, else
// OpenBLAS's. On AVX2 CPUs OpenBLAS computes the GEMMs of typical layers 1.3-1.6x faster than
// oneDNN 3.2's gemm:jit, in one thread and in two; on AVX-512 ones oneDNN beats OpenBLAS up to ~1024
// output columns, and MKL beats both on nearly every shape (sgemm_matmul).
// The library runs single-threaded: the kernel splits the work over the engine's threads itself (whole
// matrices of a batch, or bands of rows or columns of one matrix), as every other kernel does.
#include "gemm.hpp"


#include <algorithm>
#include <optional>
#include <utility>

#include "blas.hpp"
#include "loops.hpp"

namespace popxl {
namespace {

// A band keeps at least this many rows (or columns), so each sgemm call stays efficient.
constexpr int64_t kMinBand = 32;
// Big matmuls with a side shorter than this go to oneDNN (see sgemm_matmul).
constexpr int64_t kThinSide = 32;
// Batches of matrices smaller than this (multiply-adds each) go to oneDNN (see sgemm_matmul).
constexpr int64_t kSmallBatchedMatrix = int64_t(1) << 25;
// On AVX-512 CPUs without MKL, products with at most this many output columns go to oneDNN (see
// sgemm_matmul).
constexpr int64_t kOneDnnMaxColumns = 1024;
// MKL's sgemm is the slower with fewer rows than this against this many columns (see sgemm_matmul).
constexpr int64_t kMklMinRows = 256, kMklWide = 2048;

bool avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

struct GemmKernel : Kernel {
  struct Call {  // one sgemm: offsets in floats from the operands' bases, its share of rows/cols,
    int64_t a, b, y, m, n, col;  // and the output column it starts at
  };
  BlasLayout la{}, lb{};
  int64_t k = 0, ldy = 0;
  int64_t a_base = 0, b_base = 0, y_base = 0;  // byte offsets in the arena
  bool has_bias = false;
  int64_t bias_base = 0, bias_step = 1;  // the bias row: byte offset, element stride
  bool has_residual = false;
  int64_t residual_base = 0;  // byte offset of a packed tensor of y's shape, added with the bias
  float alpha = 1.0f, beta = 0.0f;
  std::vector<Call> calls;
  bool parallel = false;
  // An operand read from a packed copy in scratch, made at the start of every run (see GemmInto).
  struct PackedCopy {
    Buffer from, packed;  // the arena view, and its packed layout
    size_t at;            // the copy's scratch offset
    const float* make(uint8_t* arena, const ScratchLayout& scratch) const {
      copy_buffer(scratch.at(at), packed, arena, from);
      return reinterpret_cast<const float*>(scratch.at(at));
    }
  };
  std::optional<PackedCopy> copy_a, copy_b;
  Blas lib = Blas::OpenBlas;
  Sgemm sgemm = nullptr;

  std::string algorithm() const override { return std::string("sgemm (") + blas_name(lib) + ")"; }

  void run(uint8_t* arena) override {
    const float* A = copy_a ? copy_a->make(arena, scratch) : reinterpret_cast<const float*>(arena + a_base);
    const float* B = copy_b ? copy_b->make(arena, scratch) : reinterpret_cast<const float*>(arena + b_base);
    float* Y = reinterpret_cast<float*>(arena + y_base);
    const float* bias = reinterpret_cast<const float*>(arena + bias_base);
    const float* R = reinterpret_cast<const float*>(arena + residual_base);
    auto gemm = [&](const Call& c) {
      // sgemm computes Y = A B + beta Y; with a bias, Y starts as its rows (beta = 1) rather than
      // being zeroed first (beta = 0), so adding it costs no pass of its own; nor does adding a
      // residual, which joins the bias there.
      if (has_residual)
        for (int64_t r = 0; r < c.m; ++r) {
          float* row = Y + c.y + r * ldy;
          const float* res = R + c.y + r * ldy;
          for (int64_t j = 0; j < c.n; ++j) row[j] = bias[(c.col + j) * bias_step] + res[j];
        }
      else if (has_bias)
        for (int64_t r = 0; r < c.m; ++r) {
          float* row = Y + c.y + r * ldy;
          for (int64_t j = 0; j < c.n; ++j) row[j] = bias[(c.col + j) * bias_step];
        }
      sgemm(la.trans, lb.trans, int(c.m), int(c.n), int(k), alpha, A + c.a, int(la.ld), B + c.b, int(lb.ld), beta,
            Y + c.y, int(ldy));
    };
    const int64_t n = static_cast<int64_t>(calls.size());
    threads::for_each(n, [&](int64_t i) { gemm(calls[i]); }, parallel);
  }
};

}  // namespace

std::unique_ptr<Kernel> sgemm_matmul(const MatOperand& a, const MatOperand& b, const std::vector<int64_t>& ydims,
                                     int64_t a_base, int64_t b_base, int64_t y_base, const GemmInto& into) {
  const size_t r = ydims.size();
  const int64_t m = ydims[r - 2], n = ydims[r - 1], kk = a.dims[r - 1];
  const int64_t int_max = 0x7fffffff;
  // A stack of matrices times one matrix (x (batch, seq, d) @ W: how ONNX models apply Linear
  // layers) whose rows are evenly spaced through the stack is one (batch * seq, d) GEMM: W is
  // packed once instead of once per matrix, and the threads take bands of all the rows.
  bool stacked_rows = r > 2 && a.strides[r - 1] == 1;
  for (size_t d = 0; d + 2 < r && stacked_rows; ++d)
    stacked_rows = b.dims[d] == 1 && a.dims[d] == ydims[d] && a.strides[d] == a.dims[d + 1] * a.strides[d + 1];
  if (stacked_rows) {
    const int64_t rows = prod(ydims) / std::max<int64_t>(n, 1);
    return sgemm_matmul({{rows, kk}, {a.strides[r - 2], 1}}, {{kk, n}, {b.strides[r - 2], b.strides[r - 1]}},
                        {rows, n}, a_base, b_base, y_base, into);
  }
  if (std::max({m, n, kk}) > int_max) return nullptr;  // blasint is 32-bit
  int64_t batches = 1;
  for (size_t d = 0; d + 2 < r; ++d) batches *= ydims[d];
  const int64_t macs = batches * m * n * kk;
  Blas lib = preferred_blas();
  // On AVX-512 CPUs oneDNN's matmul is faster than OpenBLAS for products of up to ~1024 output
  // columns (10-40% at 128-1024 rows, on one thread or two: mlp_big's, gpt_block's and BERT's
  // 768-wide layers on a 2-core Xeon), while OpenBLAS keeps the wider ones (1024 x 768 x 3072:
  // oneDNN 170-190 GFLOP/s, OpenBLAS 290) and the small ones, where a oneDNN call costs more than
  // the product (mlp_small's 8 x 784 x 32 ran 12% slower). MKL's sgemm beats both on BERT's
  // training shapes (1024 rows; 228-265 GFLOP/s against oneDNN's 78-245 and OpenBLAS's 175-224, a
  // 2-core Xeon, C++ loop) and on 768-wide layers of 64-512 rows, so with MKL none goes to oneDNN.
  const bool may_decline = !into.only_sgemm;  // the rules below may leave the product to oneDNN
  if (may_decline && lib == Blas::OpenBlas && avx512() && n <= kOneDnnMaxColumns && macs >= kSingleThreadWork)
    return nullptr;
  // Except for a few rows against a wide matrix, where MKL packs the wide operand for too little
  // work (128 x 768 x 3072: MKL 140-147 GFLOP/s, OpenBLAS 172-190), and for products one thread
  // takes, where MKL's call costs more (mlp_small's 8 x 784 x 32 layers: 12% fewer steps/s).
  if (lib == Blas::Mkl && ((m < kMklMinRows && n >= kMklWide) || macs < kSingleThreadWork)) lib = Blas::OpenBlas;
  // The next two rules hold on AVX-512 CPUs only, where oneDNN 3.2's matmul is its brgemm. On AVX2
  // it is gemm:jit, which OpenBLAS beats on these shapes too (a 2-core AMD EPYC: BERT-base at
  // batch 1, 224 -> 176 ms a sequence; 10-class layers of 256-4096 rows 1.1-3x).
  // Weights in static storage: oneDNN keeps them packed in its layout between calls (matmul.cpp),
  // where sgemm would pack them on every call.
  if (may_decline && avx512() && into.static_weights && macs >= kSingleThreadWork) return nullptr;
  // A big product with a thin side (a 10-class layer, say) is mostly memory traffic, which
  // oneDNN's matmul streams 2-3x faster than sgemm's packing does.
  if (may_decline && avx512() && macs >= kSingleThreadWork && std::min({m, n, kk}) < kThinSide) return nullptr;
  // Many small matrices (attention's per-head products): oneDNN's batched matmul keeps both
  // threads busy with less packing per matrix than a sgemm call per matrix, 5-15% faster
  // (32 x (128, 64, 128): 174 vs 149 GFLOP/s on two threads); from ~100M multiply-adds a
  // matrix, sgemm is the faster again.
  if (may_decline && batches > 1 && m * n * kk < kSmallBatchedMatrix) return nullptr;
  auto g = std::make_unique<GemmKernel>();
  if (!blas_layout(m, kk, a.strides[r - 2], a.strides[r - 1], g->la) ||
      !blas_layout(kk, n, b.strides[r - 2], b.strides[r - 1], g->lb))
    return nullptr;
  if (g->la.ld > int_max || g->lb.ld > int_max) return nullptr;
  g->lib = lib;
  g->sgemm = sgemm_of(lib);
  g->k = kk;
  g->ldy = n;
  g->a_base = a_base, g->b_base = b_base, g->y_base = y_base;
  if (into.bias) {
    g->has_bias = true;
    g->bias_base = into.bias->offset;
    g->bias_step = into.bias->strides.back() / static_cast<int64_t>(sizeof(float));
  }
  if (into.residual) {  // its bytes are read as y's (packed, same shape)
    g->has_residual = true;
    g->residual_base = into.residual->offset;
  }
  for (auto [from, copy] : {std::pair(into.copy_a, &g->copy_a), std::pair(into.copy_b, &g->copy_b)})
    if (from)
      copy->emplace(GemmKernel::PackedCopy{*from, packed_like(*from), g->scratch.reserve(size_t(from->nbytes()))});
  g->alpha = into.alpha;
  g->beta = into.bias || into.accumulate ? 1.0f : 0.0f;

  // Offsets of every matrix of the (broadcast) batch; the output is packed.
  const int team = threads::max_threads();
  g->parallel = team > 1 && macs >= kSingleThreadWork;
  // Too few matrices to go round the threads: cut each into bands of the longer of rows and cols.
  const bool by_rows = m >= n;
  const int64_t bands = g->parallel && batches < team && std::max(m, n) >= team * kMinBand ? team : 1;
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0;
    for (size_t d = r - 2; d-- > 0;) {
      const int64_t idx = rem % ydims[d];
      rem /= ydims[d];
      if (a.dims[d] != 1) ao += idx * a.strides[d];
      if (b.dims[d] != 1) bo += idx * b.strides[d];
    }
    const int64_t yo = bi * m * n;
    const int64_t len = by_rows ? m : n;
    for (int64_t p = 0; p < bands; ++p) {
      const int64_t lo = len * p / bands, hi = len * (p + 1) / bands;
      if (by_rows)
        g->calls.push_back({ao + lo * a.strides[r - 2], bo, yo + lo * n, hi - lo, n, 0});
      else
        g->calls.push_back({ao, bo + lo * b.strides[r - 1], yo + lo, m, hi - lo, lo});
    }
  }
  g->parallel = g->parallel && g->calls.size() > 1;
  return g;
}

}  // namespace popxl
