// Winograd's minimal filtering F(4x4, 3x3) for 3x3 stride-1 float32 convolutions (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
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
// Work is cut two ways. Many tiles: blocks of ~64 tiles, each transformed, multiplied and
// transformed back by one thread while its V and M stay in that core's cache. Few tiles (the
// transformed operands fit in L3 together): all tiles' transforms on all threads, then the 36
// GEMMs shared out, then the output transforms, so that every thread has work.
#include "winograd.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loops.hpp"

namespace popxl {
namespace {

// Eight float lanes (AVX); aligned(4): loaded and stored with memcpy at any float's address.
using v8 = float __attribute__((vector_size(32), aligned(4)));

constexpr int kSide = 6;            // a tile's input patch side (4 outputs + 2)
constexpr int kPos = kSide * kSide;  // transformed positions of a tile
constexpr int64_t kBlockTiles = 64;  // tiles a block, many-tile mode (best for 56x56x64 and 28x28x128)
constexpr int64_t kFewTilesBytes = int64_t(16) << 20;  // all of V and M within this: few-tile mode

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

// One column of A^T m: six products to four outputs.
template <class V>
inline void output_1d(const V* m, V* y) {
  const V a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], d = m[3] - m[4];
  y[0] = m[0] + a + c;
  y[1] = b + 2.f * d;
  y[2] = a + 4.f * c;
  y[3] = b + 8.f * d + m[5];
}

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
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t w = 0; w < images * row_pieces * col_pieces; ++w) {
    const int64_t n = w / (row_pieces * col_pieces), b0 = w / col_pieces % row_pieces * kRows,
                  a0 = w % col_pieces * kCols;
    const float* from = src + n * A * B + a0 * B + b0;
    float* to = dst + n * A * B + b0 * A + a0;
    stage_transposed(reinterpret_cast<uint8_t*>(to), A * f, reinterpret_cast<const uint8_t*>(from),
                     std::min(kRows, B - b0), std::min(kCols, A - a0), f, B * f);
  }
}

class WinogradConvKernel : public Kernel {
 public:
  WinogradConvKernel(const WinogradSpec& s, const View& x, const View& y, const View& r)
      : x_(x), y_(y), r_(r), w_(*s.w), has_bias_(s.bias), has_residual_(s.residual), relu_(s.relu),
        clip_(s.clip), static_w_(s.static_w) {
    if (s.bias) bias_at_ = s.bias->offset, bias_step_ = s.bias->strides[0] / static_cast<int64_t>(sizeof(float));
    N_ = s.x->shape[0], C_ = s.x->shape[1], H_ = s.x->shape[2], W_ = s.x->shape[3];
    K_ = s.y->shape[1], OH_ = s.y->shape[2], OW_ = s.y->shape[3];
    pt_ = s.pad_top, pl_ = s.pad_left;
    TH_ = (OH_ + 3) / 4, TW_ = (OW_ + 3) / 4, T_ = N_ * TH_ * TW_;
    threads_ = omp_get_max_threads();
    const int64_t f = sizeof(float);
    few_tiles_ = kPos * T_ * (C_ + K_) * f <= kFewTilesBytes || T_ < 2 * kBlockTiles * threads_;
    if (few_tiles_) {
      v_at_.push_back(scratch.reserve(kPos * T_ * C_ * f));
      m_at_.push_back(scratch.reserve(kPos * T_ * K_ * f));
    } else {  // blocks shared evenly over the threads
      int64_t blocks = (T_ + kBlockTiles - 1) / kBlockTiles;
      blocks = (blocks + threads_ - 1) / threads_ * threads_;
      block_ = (T_ + blocks - 1) / blocks;
      for (int64_t t = 0; t < threads_; ++t) {
        v_at_.push_back(scratch.reserve(kPos * block_ * C_ * f));
        m_at_.push_back(scratch.reserve(kPos * block_ * K_ * f));
      }
    }
    if (!static_w_) u_at_ = scratch.reserve(kPos * C_ * K_ * f);
    if (x_.staged) x_at_ = scratch.reserve(N_ * H_ * W_ * C_ * f);
    if (y_.staged) y_at_ = scratch.reserve(N_ * OH_ * OW_ * K_ * f);
  }

  std::string algorithm() const override { return "winograd F(4x4,3x3)"; }

  void run(uint8_t* arena) override {
    const float* U = transformed_weights(arena);
    auto at = [this](size_t offset) { return reinterpret_cast<float*>(scratch.at(offset)); };
    const int th = static_cast<int>(threads_);
    const uint8_t* xbase = x_.staged ? scratch.at(x_at_) : arena + x_.offset;
    uint8_t* ybase = y_.staged ? scratch.at(y_at_) : arena + y_.offset;
    if (x_.staged)
      transpose_images(at(x_at_), reinterpret_cast<const float*>(arena + x_.offset), N_, C_, H_ * W_, th);
    tiles(arena, xbase, ybase, U);
    if (y_.staged)
      transpose_images(reinterpret_cast<float*>(arena + y_.offset), at(y_at_), N_, OH_ * OW_, K_, th);
  }

 private:
  // The convolution from x's channels-last values at `xbase` into y's at `ybase`.
  void tiles(uint8_t* arena, const uint8_t* xbase, uint8_t* ybase, const float* U) {
    auto at = [this](size_t offset) { return reinterpret_cast<float*>(scratch.at(offset)); };
    if (few_tiles_) {
      float *V = at(v_at_[0]), *M = at(m_at_[0]);
      const int64_t ldv = T_ * C_, ldm = T_ * K_;
#pragma omp parallel num_threads(static_cast<int>(threads_))
      {
        const int64_t th = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t t0 = T_ * id / th, t1 = T_ * (id + 1) / th;
        input_tiles(xbase, t0, t1 - t0, V + t0 * C_, ldv);
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < kPos; ++p) gemm(p, T_, V, ldv, U, M, ldm);
        output_tiles(arena, ybase, t0, t1 - t0, M + t0 * K_, ldm);
      }
      return;
    }
    const int64_t blocks = (T_ + block_ - 1) / block_;
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(threads_))
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t id = static_cast<size_t>(omp_get_thread_num());
      float *V = at(v_at_[id]), *M = at(m_at_[id]);
      const int64_t t0 = b * block_, count = std::min(block_, T_ - t0);
      input_tiles(xbase, t0, count, V, count * C_);
      for (int p = 0; p < kPos; ++p) gemm(p, count, V, count * C_, U, M, count * K_);
      output_tiles(arena, ybase, t0, count, M, count * K_);
    }
  }

  // M[p] (tiles x K) = V[p] (tiles x C) @ U[p] (C x K); ldv, ldm: the position strides.
  void gemm(int p, int64_t tiles, const float* V, int64_t ldv, const float* U, float* M, int64_t ldm) const {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tiles), static_cast<int>(K_),
                      static_cast<int>(C_), 1.f, V + p * ldv, static_cast<int>(C_), U + p * C_ * K_,
                      static_cast<int>(K_), 0.f, M + p * ldm, static_cast<int>(K_));
  }

  // The tile's image and its first output row and column.
  void tile_origin(int64_t t, int64_t& n, int64_t& oy, int64_t& ox) const {
    n = t / (TH_ * TW_);
    oy = (t / TW_) % TH_ * 4;
    ox = t % TW_ * 4;
  }

  // Tiles [t0, t0 + count): position p of tile t0 + i, channel c, at V[p * ldv + i * C + c].
  void input_tiles(const uint8_t* xbase, int64_t t0, int64_t count, float* V, int64_t ldv) const {
    for (int64_t i = 0; i < count; ++i) {
      int64_t n, oy, ox;
      tile_origin(t0 + i, n, oy, ox);
      const int64_t r0 = oy - pt_, c0 = ox - pl_;
      const bool inside = r0 >= 0 && c0 >= 0 && r0 + kSide <= H_ && c0 + kSide <= W_;
      const uint8_t* image = xbase + n * x_.n;
      float* v = V + i * C_;
      int64_t c = 0;
      for (; c + 8 <= C_; c += 8) input_tile<v8>(image + c * 4, r0, c0, inside, v + c, ldv);
      for (; c < C_; ++c) input_tile<float>(image + c * 4, r0, c0, inside, v + c, ldv);
    }
  }

  // `src`: channel(s) c of the image at row 0, column 0.
  template <class V>
  void input_tile(const uint8_t* src, int64_t r0, int64_t c0, bool inside, float* v, int64_t ldv) const {
    V d[kPos], t[kPos];
    for (int i = 0; i < kSide; ++i)
      for (int j = 0; j < kSide; ++j) {
        const int64_t r = r0 + i, q = c0 + j;
        if (inside || (r >= 0 && r < H_ && q >= 0 && q < W_))
          std::memcpy(&d[i * kSide + j], src + r * x_.h + q * x_.w, sizeof(V));
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

  // Tiles [t0, t0 + count) from M (as V in input_tiles, K channels) into y, with the epilogue.
  void output_tiles(const uint8_t* arena, uint8_t* ybase, int64_t t0, int64_t count, const float* M,
                    int64_t ldm) const {
    for (int64_t i = 0; i < count; ++i) {
      int64_t n, oy, ox;
      tile_origin(t0 + i, n, oy, ox);
      uint8_t* out = ybase + n * y_.n + oy * y_.h + ox * y_.w;
      const uint8_t* res = has_residual_ ? arena + r_.offset + n * r_.n + oy * r_.h + ox * r_.w : nullptr;
      const int64_t rows = std::min<int64_t>(4, OH_ - oy), cols = std::min<int64_t>(4, OW_ - ox);
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
    static constexpr float G[kSide][3] = {{1.f / 4, 0, 0},           {-1.f / 6, -1.f / 6, -1.f / 6},
                                          {-1.f / 6, 1.f / 6, -1.f / 6}, {1.f / 24, 1.f / 12, 1.f / 6},
                                          {1.f / 24, -1.f / 12, 1.f / 6}, {0, 0, 1}};
    const uint8_t* w = arena + w_.offset;
    const auto& st = w_.strides;
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(threads_))
    for (int64_t c = 0; c < C_; ++c)
      for (int64_t k = 0; k < K_; ++k) {
        float g[3][3], gt[kSide][3];
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 3; ++b)
            std::memcpy(&g[a][b], w + k * st[0] + c * st[1] + a * st[2] + b * st[3], sizeof(float));
        for (int i = 0; i < kSide; ++i)
          for (int b = 0; b < 3; ++b) gt[i][b] = G[i][0] * g[0][b] + G[i][1] * g[1][b] + G[i][2] * g[2][b];
        for (int i = 0; i < kSide; ++i)
          for (int j = 0; j < kSide; ++j)
            U[((i * kSide + j) * C_ + c) * K_ + k] = gt[i][0] * G[j][0] + gt[i][1] * G[j][1] + gt[i][2] * G[j][2];
      }
  }

  // Static weights: a transformed copy per arena, made again when the weights epoch moves on
  // (as the reordered weights of the oneDNN kernels are). Otherwise transformed on every run.
  const float* transformed_weights(const uint8_t* arena) {
    if (!static_w_) {
      float* U = reinterpret_cast<float*>(scratch.at(u_at_));
      transform_weights(arena, U);
      return U;
    }
    const uint64_t now = weights_epoch ? *weights_epoch : 0;
    Kept* use = nullptr;
    for (Kept& k : kept_)
      if (k.arena == arena) use = &k;
    if (!use)  // a new arena takes over a copy of an arena no longer in use
      for (Kept& k : kept_)
        if (k.epoch != now) use = &k;
    if (!use) {
      kept_.emplace_back();
      use = &kept_.back();
      use->data.resize(static_cast<size_t>(kPos * C_ * K_));
    }
    if (use->arena != arena || use->epoch != now || !weights_epoch) {
      transform_weights(arena, use->data.data());
      use->arena = arena;
      use->epoch = now;
    }
    return use->data.data();
  }

  struct Kept {
    const uint8_t* arena = nullptr;
    uint64_t epoch = 0;
    std::vector<float> data;
  };

  View x_, y_, r_;
  Buffer w_;
  bool has_bias_, has_residual_, relu_;
  std::optional<std::pair<float, float>> clip_;
  bool static_w_;
  int64_t bias_at_ = 0, bias_step_ = 1;  // the bias: byte offset, element stride
  int64_t N_, C_, H_, W_, K_, OH_, OW_, pt_, pl_, TH_, TW_, T_;
  int64_t threads_, block_ = 0;
  bool few_tiles_;
  std::vector<size_t> v_at_, m_at_;  // V and M in scratch: one pair, or one a thread
  size_t u_at_ = 0;                  // non-static weights: U in scratch
  size_t x_at_ = 0, y_at_ = 0;       // staged x, y: their channels-last copies in scratch
  std::vector<Kept> kept_;
};

}  // namespace

std::unique_ptr<Kernel> winograd_conv(const WinogradSpec& s) {
  static const bool single_threaded_blas = [] {
    scipy_openblas_set_num_threads(1);  // the kernel parallelises; OpenBLAS must not add threads
    return true;
  }();
  (void)single_threaded_blas;
  if (const char* on = std::getenv("POPXL_WINOGRAD"); on && std::string(on) == "0") return nullptr;
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
