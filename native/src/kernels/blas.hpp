// The CBLAS libraries behind the float32 GEMMs of matmul, attention and Winograd convolution:
// OpenBLAS (the scipy-openblas32 wheel, linked) and Intel's MKL (the `mkl` wheel, loaded when first
// wanted, on Intel CPUs only). Both run single-threaded: the kernels split their work over the
// engine's threads themselves (threads.hpp), so no BLAS thread pool competes with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace popxl {

// How sgemm reads a (rows x cols) operand with element strides (row_stride, col_stride): row-major
// (trans false) or transposed, with leading dimension ld. False when neither stride is 1.
struct BlasLayout {
  bool trans = false;
  int64_t ld = 0;
};
bool blas_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, BlasLayout& out);

// y (m x n) = alpha op(a) op(b) + beta y, every matrix row-major with the given leading
// dimensions: cblas_sgemm with CblasRowMajor.
using Sgemm = void (*)(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                       const float* b, int ldb, float beta, float* y, int ldy);

enum class Blas { OpenBlas, Mkl };

// The library whose sgemm takes float32 products: MKL's where it is there to load and the CPU is
// an Intel one (on this project's BERT training shapes it is 10-25% faster than OpenBLAS's and
// oneDNN 3.2's), else OpenBLAS's. `set_blas` overrides the choice for kernels built after it.
Blas preferred_blas();
Sgemm sgemm_of(Blas lib);
const char* blas_name(Blas lib);

// Choose the library by name ("auto", "openblas" or "mkl"; tests and benchmarks compare them).
// Throws std::invalid_argument for an unknown name or a library this process cannot load.
void set_blas(const std::string& name);
// The libraries this process can use, by name.
std::vector<std::string> blas_available();

}  // namespace popxl
