// The float32 GEMM backend of matmul (a CBLAS sgemm: blas.hpp), used by the matmul kernel in matmul.cpp.
#pragma once

#include <memory>
#include <vector>

#include "../engine.hpp"

namespace popxl {

// A matmul operand promoted to the output's rank: dims and element strides (numpy.matmul rules,
// 1-D operands already given their unit dim).
struct MatOperand {
  std::vector<int64_t> dims, strides;
};

// How the product meets y: written over it, added to a bias row first written into it (plus a
// packed `residual` of y's shape, when given), or scaled and added to what y holds
// (y += alpha * a @ b).
struct GemmInto {
  const Buffer* bias = nullptr;
  const Buffer* residual = nullptr;
  bool accumulate = false;
  float alpha = 1.0f;
  // b is weights in static storage that oneDNN's matmul would keep in its own layout (matmul.cpp)
  bool static_weights = false;
  // oneDNN has nothing but its reference implementation for this product (a batched accumulating
  // one on AVX2, say: 100x slower than a GEMM): sgemm takes it whatever its shape.
  bool only_sgemm = false;
  // Operands whose strides sgemm cannot take (a column-strided view): copied packed into the
  // kernel's scratch on every run and read there; a and b then describe those copies (offset 0).
  const Buffer* copy_a = nullptr;
  const Buffer* copy_b = nullptr;
};

// A kernel computing y = a @ b (see GemmInto) for float32 operands at the given arena byte
// offsets (y packed, dims `ydims`), or nullptr when sgemm cannot read an operand's strides or
// oneDNN is the faster of the two for the shape (the caller then uses oneDNN; unless only_sgemm).
std::unique_ptr<Kernel> sgemm_matmul(const MatOperand& a, const MatOperand& b, const std::vector<int64_t>& ydims,
                                     int64_t a_base, int64_t b_base, int64_t y_base, const GemmInto& into = {});

}  // namespace popxl
