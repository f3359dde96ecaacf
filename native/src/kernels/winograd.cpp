// Winograd's minimal filtering F(4x4, 3x3) for 3x3 stride-1 float32 convolutions and their
// gradients (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
//
// The output is cut into 4x4 tiles; each reads a 6x6 patch of the input. With the 6x6 transforms
// B (input), G (filter) and A (output) of the interpolation points 0, 1, -1, 2, -2 and infinity,
// a tile of one output channel is A^T [sum over c of (G g_c G^T) . (B^T d_c B)] A: 36 products
// per channel and tile instead of 144, so the 36 positions of the sum are 36 GEMMs,
// (tiles x C) @ (C x K), that OpenBLAS runs at its speed; the transforms are additions.
// On two AVX2 cores, batch 8, the convolutions of ResNet-18's stages (56x56x64 ... 7x7x512) run
// 1.7-2.1x faster than oneDNN's direct brgconv. The result differs from direct summation by
// about 1e-5 of its largest value (the transforms' coefficients are up to 8 and 1/24).
//
// Operands in NCHW (a plain `conv`, outside popart's channels-last chains) are copied channels-last
// into scratch first, and the result back, through 8x8 register transposes: the same two passes
// oneDNN's direct kernels make into and out of their blocked layout.
//
// In training, dx of such a convolution is one itself (conv_grad in conv.cpp runs this kernel
// with the weights turned round); dw has a kernel of its own below, on the same tiling.
//
// Work is cut two ways. Many tiles: blocks of ~64 tiles, each transformed, multiplied and
// transformed back by one thread while its V and M stay in that core's cache. Few tiles (the
// transformed operands fit in L3 together): all tiles' transforms on all threads, then the 36
// GEMMs shared out, then the output transforms, so that every thread has work.
#include "winograd.hpp"


#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blas.hpp"
#include "loops.hpp"
#include "static_copies.hpp"

namespace popxl {
namespace {

// Eight float lanes (AVX); aligned(4): loaded and stored with memcpy at any float's address.
using v8 = float __attribute__((vector_size(32), aligned(4)));

constexpr int kSide = 6;            // a tile's input patch side (4 outputs + 2)
constexpr int kPos = kSide * kSide;  // transformed positions of a tile
constexpr int64_t kBlockTiles = 64;  // tiles a block, many-tile mode (best for 56x56x64 and 28x28x128)
constexpr int64_t kFewTilesBytes = int64_t(16) << 20;  // all of V and M within this: few-tile mode
constexpr int64_t kMaxGradBytes = int64_t(96) << 20;   // the weight gradient's V and Z, at most

// One column of B^T d: six inputs to six transformed values.
template <class V>
inline void input_1d(const V* d, V* o) {
  o[0] = 4.f * d[0] - 5.f * d[2] + d[4];
  o[1] = -4.f * (d[1] + d[2]) + d[3] + d[4];
  o[2] = 4.f * (d[1] - d[2]) - d[3] + d[4];
  o[3] = 2.f * (d[3] - d[1]) - d[2] + d[4];
  o[4] = 2.f * (d[1] - d[3]) - d[2] + d[4];
  o[5] = 4.f * d[1] - 5.f * d[3] + d[5];
}

// G: a 3-tap filter to its six transformed values.
constexpr float kG[kSide][3] = {{1.f / 4, 0, 0},           {-1.f / 6, -1.f / 6, -1.f / 6},
                                {-1.f / 6, 1.f / 6, -1.f / 6}, {1.f / 24, 1.f / 12, 1.f / 6},
                                {1.f / 24, -1.f / 12, 1.f / 6}, {0, 0, 1}};

// One column of A dy (the transpose of the output transform): four output gradients to six.
template <class V>
inline void gradient_1d(const V* d, V* z) {
  const V a = d[0] + d[2], b = d[1] + d[3], c = d[0] + 4.f * d[2], e = 2.f * d[1] + 8.f * d[3];
  z[0] = d[0];
  z[1] = a + b;
  z[2] = a - b;
  z[3] = c + e;
  z[4] = c - e;
  z[5] = d[3];
}

// One column of A^T m: six products to four outputs.
template <class V>
inline void output_1d(const V* m, V* y) {
  const V a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], d = m[3] - m[4];
  y[0] = m[0] + a + c;
  y[1] = b + 2.f * d;
  y[2] = a + 4.f * c;
  y[3] = b + 8.f * d + m[5];
}

// A float32 piece of a kernel's scratch.
float* floats(const ScratchLayout& scratch, size_t offset) { return reinterpret_cast<float*>(scratch.at(offset)); }

// A 4-D float32 view whose channels lie 4 bytes apart: byte offset and N, H, W byte strides.
// `staged`: the operand is a dense NCHW tensor at `offset`, and the view describes its dense NHWC
// copy in scratch (offset 0 there).
struct View {
  int64_t offset = 0, n = 0, h = 0, w = 0;
  bool staged = false;
};

// False when `b` is neither channels-innermost nor a dense NCHW tensor to stage.
bool channels_last_view(const Buffer& b, bool nhwc, View& v) {
  if (b.dtype != DType::F32 || b.shape.size() != 4) return false;
  const int64_t C = b.shape[1], H = b.shape[2], W = b.shape[3], f = sizeof(float);
  if (!nhwc && (C == 1 || b.strides[1] == f)) {
    v = {b.offset, b.strides[0], b.strides[2], b.strides[3]};
    return true;
  }
  if (!b.contiguous) return false;
  v = {b.offset, H * W * C * f, W * C * f, C * f, !nhwc};  // dense NHWC: the operand's bytes, or its copy
  return true;
}

// Each of `images` row-major (A x B) float matrices at `src`, transposed into (B x A) at `dst`, in
// pieces of up to 64 x 256 on the threads.
void transpose_images(float* dst, const float* src, int64_t images, int64_t A, int64_t B, int threads) {
  constexpr int64_t kRows = 64, kCols = 256;  // of the result
  const int64_t row_pieces = (B + kRows - 1) / kRows, col_pieces = (A + kCols - 1) / kCols;
  const int64_t f = sizeof(float);
  threads::for_each(images * row_pieces * col_pieces, [&](int64_t w) {
    const int64_t n = w / (row_pieces * col_pieces), b0 = w / col_pieces % row_pieces * kRows,
                  a0 = w % col_pieces * kCols;
    const float* from = src + n * A * B + a0 * B + b0;
    float* to = dst + n * A * B + b0 * A + a0;
    stage_transposed(reinterpret_cast<uint8_t*>(to), A * f, reinterpret_cast<const uint8_t*>(from),
                     std::min(kRows, B - b0), std::min(kCols, A - a0), f, B * f);
  }, true, threads);
}

// The channels-last values of `v` (N images of C channels of HW values): in the arena, or, for a
// staged view, its NCHW tensor copied channels-last into `staging` first.
const uint8_t* stage_in(const View& v, const uint8_t* arena, float* staging, int64_t N, int64_t C, int64_t HW,
                        int threads) {
  if (!v.staged) return arena + v.offset;
  transpose_images(staging, reinterpret_cast<const float*>(arena + v.offset), N, C, HW, threads);
  return reinterpret_cast<const uint8_t*>(staging);
}

// A convolution's output cut into 4x4 tiles (N x TH x TW of them, T in all), and the input
// transform of the tiles' 6x6 patches of x (C channels of H x W, padded by pt, pl at the top, left).
struct Tiling {
  View x;
  int64_t N, C, H, W, OH, OW, pt, pl, TH, TW, T;
  Tiling(const View& x_, const std::vector<int64_t>& xs, const std::vector<int64_t>& ys, int64_t pad_top,
         int64_t pad_left)
      : x(x_), N(xs[0]), C(xs[1]), H(xs[2]), W(xs[3]), OH(ys[2]), OW(ys[3]), pt(pad_top), pl(pad_left),
        TH((OH + 3) / 4), TW((OW + 3) / 4), T(N * TH * TW) {}

  // x's channels-last values: in the arena, or (staged) copied into `staging` first.
  const uint8_t* channels_last(const uint8_t* arena, float* staging, int threads) const {
    return stage_in(x, arena, staging, N, C, H * W, threads);
  }

  // The tile's image and its first output row and column.
  void origin(int64_t t, int64_t& n, int64_t& oy, int64_t& ox) const {
    n = t / (TH * TW);
    oy = (t / TW) % TH * 4;
    ox = t % TW * 4;
  }

  // Tiles [t0, t0 + count): position p of tile t0 + i, channel c, at V[p * ldv + i * C + c].
  void input(const uint8_t* xbase, int64_t t0, int64_t count, float* V, int64_t ldv) const {
    for (int64_t i = 0; i < count; ++i) {
      int64_t n, oy, ox;
      origin(t0 + i, n, oy, ox);
      const int64_t r0 = oy - pt, c0 = ox - pl;
      const bool inside = r0 >= 0 && c0 >= 0 && r0 + kSide <= H && c0 + kSide <= W;
      const uint8_t* image = xbase + n * x.n;
      float* v = V + i * C;
      int64_t c = 0;
      for (; c + 8 <= C; c += 8) input_tile<v8>(image + c * 4, r0, c0, inside, v + c, ldv);
      for (; c < C; ++c) input_tile<float>(image + c * 4, r0, c0, inside, v + c, ldv);
    }
  }

  // `src`: channel(s) c of the image at row 0, column 0.
  template <class V>
  void input_tile(const uint8_t* src, int64_t r0, int64_t c0, bool inside, float* v, int64_t ldv) const {
    V d[kPos], t[kPos];
    for (int i = 0; i < kSide; ++i)
      for (int j = 0; j < kSide; ++j) {
        const int64_t r = r0 + i, q = c0 + j;
        if (inside || (r >= 0 && r < H && q >= 0 && q < W))
          std::memcpy(&d[i * kSide + j], src + r * x.h + q * x.w, sizeof(V));
        else
          d[i * kSide + j] = V{};
      }
    for (int j = 0; j < kSide; ++j) {  // columns: t = B^T d
      V col[kSide], o[kSide];
      for (int i = 0; i < kSide; ++i) col[i] = d[i * kSide + j];
      input_1d(col, o);
      for (int i = 0; i < kSide; ++i) t[i * kSide + j] = o[i];
    }
    for (int i = 0; i < kSide; ++i) {  // rows: (B^T d) B
      V o[kSide];
      input_1d(&t[i * kSide], o);
      for (int j = 0; j < kSide; ++j) std::memcpy(v + (i * kSide + j) * ldv, &o[j], sizeof(V));
    }
  }
};

class WinogradConvKernel : public Kernel {
 public:
  WinogradConvKernel(const WinogradSpec& s, const View& x, const View& y, const View& r)
      : tl_(x, s.x->shape, s.y->shape, s.pad_top, s.pad_left), y_(y), r_(r), w_(*s.w), has_bias_(s.bias),
        has_residual_(s.residual), relu_(s.relu), clip_(s.clip), static_w_(s.static_w) {
    if (s.bias) bias_at_ = s.bias->offset, bias_step_ = s.bias->strides[0] / static_cast<int64_t>(sizeof(float));
    K_ = s.y->shape[1];
    threads_ = threads::max_threads();
    const int64_t f = sizeof(float);
    few_tiles_ = kPos * tl_.T * (tl_.C + K_) * f <= kFewTilesBytes || tl_.T < 2 * kBlockTiles * threads_;
    if (few_tiles_) {
      v_at_.push_back(scratch.reserve(kPos * tl_.T * tl_.C * f));
      m_at_.push_back(scratch.reserve(kPos * tl_.T * K_ * f));
    } else {  // blocks shared evenly over the threads
      int64_t blocks = (tl_.T + kBlockTiles - 1) / kBlockTiles;
      blocks = (blocks + threads_ - 1) / threads_ * threads_;
      block_ = (tl_.T + blocks - 1) / blocks;
      for (int64_t t = 0; t < threads_; ++t) {
        v_at_.push_back(scratch.reserve(kPos * block_ * tl_.C * f));
        m_at_.push_back(scratch.reserve(kPos * block_ * K_ * f));
      }
    }
    if (static_w_)
      kept_ = StaticCopies(kPos * tl_.C * K_ * f);
    else
      u_at_ = scratch.reserve(kPos * tl_.C * K_ * f);
    if (tl_.x.staged) x_at_ = scratch.reserve(tl_.N * tl_.H * tl_.W * tl_.C * f);
    if (y_.staged) y_at_ = scratch.reserve(tl_.N * tl_.OH * tl_.OW * K_ * f);
  }

  std::string algorithm() const override { return "winograd F(4x4,3x3)"; }

  void run(uint8_t* arena) override {
    const float* U = transformed_weights(arena);
    const int th = static_cast<int>(threads_);
    const uint8_t* xbase = tl_.channels_last(arena, floats(scratch, x_at_), th);
    uint8_t* ybase = y_.staged ? scratch.at(y_at_) : arena + y_.offset;
    tiles(arena, xbase, ybase, U);
    if (y_.staged)
      transpose_images(reinterpret_cast<float*>(arena + y_.offset), floats(scratch, y_at_), tl_.N,
                       tl_.OH * tl_.OW, K_, th);
  }

 private:
  // The convolution from x's channels-last values at `xbase` into y's at `ybase`.
  void tiles(uint8_t* arena, const uint8_t* xbase, uint8_t* ybase, const float* U) {
    if (few_tiles_) {
      float *V = floats(scratch, v_at_[0]), *M = floats(scratch, m_at_[0]);
      const int64_t ldv = tl_.T * tl_.C, ldm = tl_.T * K_;
      const int team = static_cast<int>(threads_);
      // Every position's product reads all tiles' inputs: three regions, one after the other.
      threads::region([&](int id, int th) {
        const threads::Share s = threads::share(tl_.T, id, th);
        tl_.input(xbase, s.first, s.last - s.first, V + s.first * tl_.C, ldv);
      }, true, team);
      threads::Dynamic next(kPos);
      threads::region([&](int, int) {
        for (int64_t p; (p = next.next()) >= 0;) gemm(static_cast<int>(p), tl_.T, V, ldv, U, M, ldm);
      }, true, team);
      threads::region([&](int id, int th) {
        const threads::Share s = threads::share(tl_.T, id, th);
        output_tiles(arena, ybase, s.first, s.last - s.first, M + s.first * K_, ldm);
      }, true, team);
      return;
    }
    const int64_t blocks = (tl_.T + block_ - 1) / block_;
    threads::Dynamic next(blocks);
    threads::region([&](int id, int) {
      float *V = floats(scratch, v_at_[size_t(id)]), *M = floats(scratch, m_at_[size_t(id)]);
      for (int64_t b; (b = next.next()) >= 0;) {
        const int64_t t0 = b * block_, count = std::min(block_, tl_.T - t0);
        tl_.input(xbase, t0, count, V, count * tl_.C);
        for (int p = 0; p < kPos; ++p) gemm(p, count, V, count * tl_.C, U, M, count * K_);
        output_tiles(arena, ybase, t0, count, M, count * K_);
      }
    }, true, static_cast<int>(threads_));
  }

  // M[p] (tiles x K) = V[p] (tiles x C) @ U[p] (C x K); ldv, ldm: the position strides.
  void gemm(int p, int64_t tiles, const float* V, int64_t ldv, const float* U, float* M, int64_t ldm) const {
    sgemm_(false, false, static_cast<int>(tiles), static_cast<int>(K_), static_cast<int>(tl_.C), 1.f, V + p * ldv,
           static_cast<int>(tl_.C), U + p * tl_.C * K_, static_cast<int>(K_), 0.f, M + p * ldm, static_cast<int>(K_));
  }

  // Tiles [t0, t0 + count) from M (laid out as V in Tiling::input, K channels) into y, with the
  // epilogue.
  void output_tiles(const uint8_t* arena, uint8_t* ybase, int64_t t0, int64_t count, const float* M,
                    int64_t ldm) const {
    for (int64_t i = 0; i < count; ++i) {
      int64_t n, oy, ox;
      tl_.origin(t0 + i, n, oy, ox);
      uint8_t* out = ybase + n * y_.n + oy * y_.h + ox * y_.w;
      const uint8_t* res = has_residual_ ? arena + r_.offset + n * r_.n + oy * r_.h + ox * r_.w : nullptr;
      const int64_t rows = std::min<int64_t>(4, tl_.OH - oy), cols = std::min<int64_t>(4, tl_.OW - ox);
      const float* m = M + i * K_;
      const float* bias = reinterpret_cast<const float*>(arena + bias_at_);
      int64_t k = 0;
      for (; k + 8 <= K_; k += 8) output_tile<v8>(m, ldm, bias, k, out, res, rows, cols);
      for (; k < K_; ++k) output_tile<float>(m, ldm, bias, k, out, res, rows, cols);
    }
  }

  // Channel(s) k from k onwards: `m`: the tile's products at position 0, `out`, `res` (or null):
  // its first output in y and in the residual, all at channel 0.
  template <class V>
  void output_tile(const float* m, int64_t ldm, const float* bias, int64_t k, uint8_t* out, const uint8_t* res,
                   int64_t rows, int64_t cols) const {
    constexpr int L = sizeof(V) / sizeof(float);
    m += k;
    out += k * sizeof(float);
    if (res) res += k * sizeof(float);
    V p[kPos], t[4 * kSide], b{};
    for (int q = 0; q < kPos; ++q) std::memcpy(&p[q], m + q * ldm, sizeof(V));
    if (has_bias_) {
      float lanes[L];
      for (int l = 0; l < L; ++l) lanes[l] = bias[(k + l) * bias_step_];
      std::memcpy(&b, lanes, sizeof(V));
    }
    for (int j = 0; j < kSide; ++j) {  // columns: A^T p
      V col[kSide], o[4];
      for (int i = 0; i < kSide; ++i) col[i] = p[i * kSide + j];
      output_1d(col, o);
      for (int i = 0; i < 4; ++i) t[i * kSide + j] = o[i];
    }
    for (int64_t i = 0; i < rows; ++i) {  // rows: (A^T p) A
      V o[4];
      output_1d(&t[i * kSide], o);
      for (int64_t j = 0; j < cols; ++j) {
        V v = o[j] + b;
        if (res) {  // read before y is written: y may lie over the residual
          V r;
          std::memcpy(&r, res + i * r_.h + j * r_.w, sizeof(V));
          v = v + r;
        }
        if (relu_) v = v < 0.f ? V{} : v;  // NaN stays NaN, as in the relu op
        if (clip_) {
          const V lo = V{} + clip_->first, hi = V{} + clip_->second;
          v = v < lo ? lo : (v > hi ? hi : v);
        }
        std::memcpy(out + i * y_.h + j * y_.w, &v, sizeof(V));
      }
    }
  }

  // U = G g G^T of every (c, k), at U[(p * C + c) * K + k].
  void transform_weights(const uint8_t* arena, float* U) const {
    const uint8_t* w = arena + w_.offset;
    const auto& st = w_.strides;
    threads::for_each(tl_.C, [&](int64_t c) {
      for (int64_t k = 0; k < K_; ++k) {
        float g[3][3], gt[kSide][3];
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 3; ++b)
            std::memcpy(&g[a][b], w + k * st[0] + c * st[1] + a * st[2] + b * st[3], sizeof(float));
        for (int i = 0; i < kSide; ++i)
          for (int b = 0; b < 3; ++b) gt[i][b] = kG[i][0] * g[0][b] + kG[i][1] * g[1][b] + kG[i][2] * g[2][b];
        for (int i = 0; i < kSide; ++i)
          for (int j = 0; j < kSide; ++j)
            U[((i * kSide + j) * tl_.C + c) * K_ + k] = gt[i][0] * kG[j][0] + gt[i][1] * kG[j][1] + gt[i][2] * kG[j][2];
      }
    }, true, static_cast<int>(threads_));
  }

  // Static weights: a transformed copy per arena, made again when the weights epoch moves on.
  // Otherwise transformed on every run.
  const float* transformed_weights(const uint8_t* arena) {
    if (!static_w_) {
      float* U = floats(scratch, u_at_);
      transform_weights(arena, U);
      return U;
    }
    const auto [U, stale] = kept_.copy_for(arena, weights_epoch);
    if (stale) transform_weights(arena, static_cast<float*>(U));
    return static_cast<const float*>(U);
  }

  Tiling tl_;
  View y_, r_;
  Buffer w_;
  bool has_bias_, has_residual_, relu_;
  std::optional<std::pair<float, float>> clip_;
  bool static_w_;
  int64_t bias_at_ = 0, bias_step_ = 1;  // the bias: byte offset, element stride
  int64_t K_;
  int64_t threads_, block_ = 0;
  Sgemm sgemm_ = sgemm_of(preferred_blas());
  bool few_tiles_;
  std::vector<size_t> v_at_, m_at_;  // V and M in scratch: one pair, or one a thread
  size_t u_at_ = 0;                  // non-static weights: U in scratch
  size_t x_at_ = 0, y_at_ = 0;       // staged x, y: their channels-last copies in scratch
  StaticCopies kept_;                // static weights: U per arena
};

// dw of such a convolution: with V the input transform of x's tiles (as the forward pass) and
// Z = A dy A^T of the tiles' output gradients (zero past the result's edge), the gradient of the
// transformed weights is dU[p] = sum over tiles of V[p]^T Z[p], one (C x tiles) @ (tiles x K) GEMM
// a position, and dw = G^T dU G. All tiles are transformed first (V and Z in scratch), then the
// 36 GEMMs shared out, then the 3x3 results; x and dy in NCHW are staged channels-last first.
class WinogradWeightGradKernel : public Kernel {
 public:
  WinogradWeightGradKernel(const Tiling& tiling, const View& dy, const Buffer& dw)
      : tl_(tiling), dy_(dy), dw_(dw), K_(dw.shape[0]), threads_(threads::max_threads()) {
    const int64_t f = sizeof(float);
    v_at_ = scratch.reserve(kPos * tl_.T * tl_.C * f);
    z_at_ = scratch.reserve(kPos * tl_.T * K_ * f);
    du_at_ = scratch.reserve(kPos * tl_.C * K_ * f);
    if (tl_.x.staged) x_at_ = scratch.reserve(tl_.N * tl_.H * tl_.W * tl_.C * f);
    if (dy_.staged) dy_at_ = scratch.reserve(tl_.N * tl_.OH * tl_.OW * K_ * f);
  }

  std::string algorithm() const override { return "winograd F(4x4,3x3)"; }

  void run(uint8_t* arena) override {
    const int th = static_cast<int>(threads_);
    const uint8_t* xbase = tl_.channels_last(arena, floats(scratch, x_at_), th);
    const uint8_t* dybase = stage_in(dy_, arena, floats(scratch, dy_at_), tl_.N, K_, tl_.OH * tl_.OW, th);
    float *V = floats(scratch, v_at_), *Z = floats(scratch, z_at_), *dU = floats(scratch, du_at_);
    const int64_t T = tl_.T, C = tl_.C, K = K_;
    // Each position's product sums over all tiles: three regions, one after the other.
    threads::region([&](int id, int team) {
      const threads::Share s = threads::share(T, id, team);
      tl_.input(xbase, s.first, s.last - s.first, V + s.first * C, T * C);
      gradient_tiles(dybase, s.first, s.last - s.first, Z + s.first * K, T * K);
    }, true, th);
    threads::Dynamic next(kPos);
    threads::region([&](int, int) {
      for (int64_t p; (p = next.next()) >= 0;)
        sgemm_(true, false, static_cast<int>(C), static_cast<int>(K), static_cast<int>(T), 1.f, V + p * T * C,
               static_cast<int>(C), Z + p * T * K, static_cast<int>(K), 0.f, dU + p * C * K, static_cast<int>(K));
    }, true, th);
    threads::for_each(C, [&](int64_t c) { write_gradient(arena, dU, c); }, true, th);
  }

 private:
  // Z of tiles [t0, t0 + count), laid out as V in Tiling::input (K channels).
  void gradient_tiles(const uint8_t* dybase, int64_t t0, int64_t count, float* Z, int64_t ldz) const {
    for (int64_t i = 0; i < count; ++i) {
      int64_t n, oy, ox;
      tl_.origin(t0 + i, n, oy, ox);
      const uint8_t* d = dybase + n * dy_.n + oy * dy_.h + ox * dy_.w;
      const int64_t rows = std::min<int64_t>(4, tl_.OH - oy), cols = std::min<int64_t>(4, tl_.OW - ox);
      int64_t k = 0;
      for (; k + 8 <= K_; k += 8) gradient_tile<v8>(d + k * 4, rows, cols, Z + i * K_ + k, ldz);
      for (; k < K_; ++k) gradient_tile<float>(d + k * 4, rows, cols, Z + i * K_ + k, ldz);
    }
  }

  template <class V>
  void gradient_tile(const uint8_t* d, int64_t rows, int64_t cols, float* z, int64_t ldz) const {
    V g[16], t[4 * kSide];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (i < rows && j < cols)
          std::memcpy(&g[i * 4 + j], d + i * dy_.h + j * dy_.w, sizeof(V));
        else
          g[i * 4 + j] = V{};
    for (int j = 0; j < 4; ++j) {  // columns: A g (6 x 4)
      V col[4], o[kSide];
      for (int i = 0; i < 4; ++i) col[i] = g[i * 4 + j];
      gradient_1d(col, o);
      for (int i = 0; i < kSide; ++i) t[i * 4 + j] = o[i];
    }
    for (int i = 0; i < kSide; ++i) {  // rows: (A g) A^T
      V o[kSide];
      gradient_1d(&t[i * 4], o);
      for (int j = 0; j < kSide; ++j) std::memcpy(z + (i * kSide + j) * ldz, &o[j], sizeof(V));
    }
  }

  // dw[k, c] = G^T dU[:, c, k] G for every k.
  void write_gradient(uint8_t* arena, const float* dU, int64_t c) const {
    const auto& st = dw_.strides;
    for (int64_t k = 0; k < K_; ++k) {
      float u[kSide][kSide], h[3][kSide];
      for (int i = 0; i < kSide; ++i)
        for (int j = 0; j < kSide; ++j) u[i][j] = dU[((i * kSide + j) * tl_.C + c) * K_ + k];
      for (int a = 0; a < 3; ++a)
        for (int j = 0; j < kSide; ++j) {
          h[a][j] = 0.f;
          for (int i = 0; i < kSide; ++i) h[a][j] += kG[i][a] * u[i][j];
        }
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
          float v = 0.f;
          for (int j = 0; j < kSide; ++j) v += h[a][j] * kG[j][b];
          std::memcpy(arena + dw_.offset + k * st[0] + c * st[1] + a * st[2] + b * st[3], &v, sizeof(float));
        }
    }
  }

  Tiling tl_;
  View dy_;
  Buffer dw_;
  int64_t K_, threads_;
  Sgemm sgemm_ = sgemm_of(preferred_blas());
  size_t v_at_ = 0, z_at_ = 0, du_at_ = 0, x_at_ = 0, dy_at_ = 0;  // pieces of scratch
};

bool enabled() {
  const char* on = std::getenv("POPXL_WINOGRAD");
  return !(on && std::string(on) == "0");
}

}  // namespace

std::unique_ptr<Kernel> winograd_weight_grad(const Buffer& x, const Buffer& dy, const Buffer& dw, int64_t pad_top,
                                             int64_t pad_left) {
  if (!enabled() || dw.dtype != DType::F32 || dw.shape.size() != 4) return nullptr;
  View xv, dyv;
  if (!channels_last_view(x, false, xv) || !channels_last_view(dy, false, dyv)) return nullptr;
  const Tiling tiling(xv, x.shape, dy.shape, pad_top, pad_left);
  const int64_t C = x.shape[1], K = dy.shape[1];
  if (C < 16 || K < 16 || x.nelms == 0 || dy.nelms == 0) return nullptr;
  // Few tiles: the transforms cost more than the products they save; very many: V and Z would
  // take more scratch than the convolution's own operands are worth.
  if (tiling.T < 64 || kPos * tiling.T * (C + K) * static_cast<int64_t>(sizeof(float)) > kMaxGradBytes) return nullptr;
  return std::make_unique<WinogradWeightGradKernel>(tiling, dyv, dw);
}

std::unique_ptr<Kernel> winograd_conv(const WinogradSpec& s) {
  if (!enabled()) return nullptr;
  View x, y, r;
  if (!channels_last_view(*s.x, s.nhwc_x, x) || !channels_last_view(*s.y, s.nhwc_y, y)) return nullptr;
  // A residual is read in place, channels innermost (a staged y is written NHWC before it goes out).
  if (s.residual && (!channels_last_view(*s.residual, s.nhwc_residual, r) || r.staged || y.staged)) return nullptr;
  if (s.w->dtype != DType::F32 || (s.bias && s.bias->dtype != DType::F32)) return nullptr;
  const int64_t C = s.x->shape[1], K = s.y->shape[1];
  // Few channels: the transforms cost more than the products they save.
  if (C < 16 || K < 16 || s.x->nelms == 0 || s.y->nelms == 0) return nullptr;
  // Weights transformed on every run (not static): only where many tiles share them.
  const int64_t tiles = s.y->shape[0] * ((s.y->shape[2] + 3) / 4) * ((s.y->shape[3] + 3) / 4);
  if (!s.static_w && tiles < 256) return nullptr;
  return std::make_unique<WinogradConvKernel>(s, x, y, r);
}

}  // namespace popxl
