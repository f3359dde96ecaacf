// Shared loops for kernels: dtype dispatch and a broadcasting N-ary loop over strided views.
#pragma once

#include <array>
#include <functional>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../engine.hpp"

namespace popxl {

using f16 = _Float16;

// Compute type: arithmetic on float16 happens in float32, as in the reference engine.
template <class T> struct Wide { using type = T; };
template <> struct Wide<f16> { using type = float; };

// Byte strides of `b` broadcast (NumPy rules, right-aligned) to an output of `rank` dims.
inline std::vector<int64_t> broadcast_strides(const Buffer& b, const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  std::vector<int64_t> s(rank, 0);
  const size_t off = rank - b.shape.size();
  for (size_t i = 0; i < b.shape.size(); ++i) s[off + i] = b.shape[i] == 1 ? 0 : b.strides[i];
  return s;
}

// Loop over `shape` with N operands; `inner(ptrs, strides, n)` handles the innermost dimension.
// Adjacent dimensions that are contiguous for every operand are merged first, and the outer
// iterations are spread over OpenMP threads when there is enough work.
template <size_t N, class F>
void nd_loop(std::vector<int64_t> shape, std::array<std::vector<int64_t>, N> strides, std::array<uint8_t*, N> base,
             F&& inner, bool parallel = true) {
  // drop size-1 dims, then merge mergeable neighbours
  std::vector<int64_t> sh;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sh.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sh.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sh.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  int64_t total = 1;
  for (auto d : shape) total *= d;
  if (total == 0) return;
  if (sh.empty()) {
    std::array<int64_t, N> s{};
    inner(base, s, int64_t{1});
    return;
  }
  const size_t rank = sh.size();
  const int64_t n_inner = sh[rank - 1];
  std::array<int64_t, N> inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = st[k][rank - 1];
  const int64_t outer = total / n_inner;
#pragma omp parallel for schedule(static) if (parallel && total > 32768 && outer > 1)
  for (int64_t o = 0; o < outer; ++o) {
    std::array<uint8_t*, N> p = base;
    int64_t rem = o;
    for (size_t d = rank - 1; d-- > 0;) {
      const int64_t idx = rem % sh[d];
      rem /= sh[d];
      for (size_t k = 0; k < N; ++k) p[k] += idx * st[k][d];
    }
    inner(p, inner_st, n_inner);
  }
}

template <class T> struct Tag { using type = T; };

// Call f(Tag<T>{}) for the C++ type T of a float dtype; false if the dtype is not one.
template <class F>
bool dispatch_float(DType d, F&& f) {
  switch (d) {
    case DType::F32: f(Tag<float>{}); return true;
    case DType::F64: f(Tag<double>{}); return true;
    case DType::F16: f(Tag<f16>{}); return true;
    default: return false;
  }
}

// Integers and floats (no bool).
template <class F>
bool dispatch_arith(DType d, F&& f) {
  switch (d) {
    case DType::I8: f(Tag<int8_t>{}); return true;
    case DType::I16: f(Tag<int16_t>{}); return true;
    case DType::I32: f(Tag<int32_t>{}); return true;
    case DType::I64: f(Tag<int64_t>{}); return true;
    case DType::U8: f(Tag<uint8_t>{}); return true;
    case DType::U16: f(Tag<uint16_t>{}); return true;
    case DType::U32: f(Tag<uint32_t>{}); return true;
    case DType::U64: f(Tag<uint64_t>{}); return true;
    default: return dispatch_float(d, f);
  }
}

// Every numeric dtype, bool included.
template <class F>
bool dispatch_numeric(DType d, F&& f) {
  if (d == DType::Bool) {
    f(Tag<bool>{});
    return true;
  }
  return dispatch_arith(d, f);
}

// A kernel that is one function of the arena.
struct FnKernel : Kernel {
  std::function<void(uint8_t*)> fn;
  explicit FnKernel(std::function<void(uint8_t*)> f) : fn(std::move(f)) {}
  void run(uint8_t* arena) override { fn(arena); }
};

template <class T>
inline T& at(uint8_t* p, int64_t i, int64_t stride) { return *reinterpret_cast<T*>(p + i * stride); }

}  // namespace popxl
