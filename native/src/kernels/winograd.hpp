// 3x3 stride-1 float32 convolutions and their gradients by Winograd's minimal filtering F(4x4, 3x3),
// used by the conv and conv_grad kernels in conv.cpp where it pays.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "../engine.hpp"

namespace popxl {

// A convolution y = conv(x, w) [+ bias] [+ residual] [relu] [clip], NCHW shapes; `nhwc_*`: the
// operand's bytes are channels-last (keep_channels_last), otherwise its strides say where its
// values are. The caller has checked the geometry: groups 1, 3x3 window, strides and dilations 1.
struct WinogradSpec {
  const Buffer *x, *w, *bias, *residual, *y;  // bias and residual may be null
  bool nhwc_x, nhwc_y, nhwc_residual;
  int64_t pad_top, pad_left;
  bool relu;
  std::optional<std::pair<float, float>> clip;  // applied after the relu
  bool static_w;  // w lies in static storage (OpInstr::static_inputs)
};

// The kernel, or nullptr when the operands do not suit it (not float32; neither channels-innermost
// nor dense NCHW, which is staged; a residual not channels-innermost or with a staged y)
// or the direct convolution would be as fast (few channels; few tiles to share transformed
// weights that change every run), or the environment says POPXL_WINOGRAD=0.
std::unique_ptr<Kernel> winograd_conv(const WinogradSpec& spec);

// dw (K, C, 3, 3) of such a convolution from x (N, C, H, W) and dy (N, K, OH, OW), NCHW or
// channels-innermost (no keep_channels_last layouts), padded by pad_top, pad_left; or nullptr when
// they do not suit it or the tiles would be too few or too many (see winograd.cpp).
std::unique_ptr<Kernel> winograd_weight_grad(const Buffer& x, const Buffer& dy, const Buffer& dw, int64_t pad_top,
                                             int64_t pad_left);

}  // namespace popxl
