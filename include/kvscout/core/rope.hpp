#pragma once
// Rotary position embedding (RoPE), written once for both backends.
//
// RoPE rotates each *plane* (a pair of channels) of a query or key by pos * w_j, with inverse
// frequency w_j = theta^(-2j / D) for plane j. Two channel conventions:
//   rope_style::split_half   plane j = channels (j, j + D/2)   (Hugging Face / GPT-NeoX)
//   rope_style::interleaved  plane j = channels (2j, 2j + 1)   (GPT-J; llama.cpp's LLaMA)
// A rotation keeps each plane's norm, so |q_plane| is the same before and after RoPE; RoPE-plane
// selection (skew/) relies on that.

#include <cmath>
#include <limits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout {

enum class rope_style : int { split_half = 0, interleaved = 1 };

struct rope_config {
  int head_dim = 0;
  float theta = 10000.f;
  rope_style style = rope_style::split_half;
};

// The planes and the rotation, written once for the host and the device.
namespace detail {

struct rope_plane {
  int a;
  int b;
};

KVSCOUT_HOST_DEVICE rope_plane rope_plane_channels(const rope_config& c, int j) {
  return c.style == rope_style::split_half ? rope_plane{j, j + c.head_dim / 2}
                                     : rope_plane{2 * j, 2 * j + 1};
}

KVSCOUT_HOST_DEVICE int rope_plane_of(const rope_config& c, int channel) {
  return c.style == rope_style::split_half ? channel % (c.head_dim / 2) : channel / 2;
}

KVSCOUT_HOST_DEVICE double rope_inv_freq(const rope_config& c, int j) {
  return pow(static_cast<double>(c.theta), -2.0 * j / c.head_dim);
}

KVSCOUT_HOST_DEVICE double rope_angle_at(double inv_freq, int pos) {
  return static_cast<double>(pos) * inv_freq;
}

/// Computed in double then rounded, so that host and device agree to the last bit of the float
/// angle.
KVSCOUT_HOST_DEVICE double rope_angle(const rope_config& c, int j, int pos) {
  return rope_angle_at(rope_inv_freq(c, j), pos);
}

KVSCOUT_HOST_DEVICE void rope_rotate(float& xa, float& xb, float cs, float sn) {
  const float a = xa, b = xb;
  xa = a * cs - b * sn;
  xb = a * sn + b * cs;
}

KVSCOUT_HOST_DEVICE void rope_rotate(float& xa, float& xb, double angle) {
  rope_rotate(xa, xb, static_cast<float>(cos(angle)), static_cast<float>(sin(angle)));
}

KVSCOUT_HOST_DEVICE void rope_cos_sin(double angle, float& cs, float& sn) {
  cs = static_cast<float>(cos(angle));
  sn = static_cast<float>(sin(angle));
}

/// What rope_table holds (the device speculation computes its tables with the same function).
KVSCOUT_HOST_DEVICE void rope_cos_sin(const rope_config& c, int j, int pos, float& cs, float& sn) {
  rope_cos_sin(rope_angle(c, j, pos), cs, sn);
}

}  // namespace detail

/// The inverse frequencies of a configuration's planes, computed once for every table filled from
/// them. Host only.
struct rope_frequencies {
  static constexpr int max_planes = 256;  // head_dim up to 512
  int planes = 0;                         // min(head_dim / 2, max_planes)
  double inv_freq[max_planes];

  rope_frequencies() = default;
  explicit rope_frequencies(const rope_config& c) {
    planes = c.head_dim / 2 < max_planes ? c.head_dim / 2 : max_planes;
    if (planes < 0) planes = 0;
    for (int j = 0; j < planes; ++j) inv_freq[j] = detail::rope_inv_freq(c, j);
  }
};

/// The cosine and sine of every plane's angle at one position, shared by every head (and layer)
/// with the same rope_config. Rotations through the table are bit-identical to
/// rope_rotate(xa, xb, rope_angle(c, j, pos)), whichever fill made it. fill() is host only.
struct rope_table {
  static constexpr int max_planes = rope_frequencies::max_planes;
  int planes = 0;
  float cs[max_planes];
  float sn[max_planes];

  void fill(const rope_config& c, int pos) { fill(rope_frequencies(c), pos); }

  /// From inverse frequencies computed beforehand: no pow.
  void fill(const rope_frequencies& f, int pos) {
    planes = f.planes;
    for (int j = 0; j < planes; ++j) fill_plane(f, j, pos);
  }

  /// Only the planes only[0, count) (repeats allowed), with the bits the full fill gives them.
  /// Every other plane holds NaN, so a rotation through a plane left out shows as NaN, never a
  /// wrong angle.
  void fill(const rope_frequencies& f, int pos, const int* only, int count) {
    KVSCOUT_EXPECTS(count >= 0 && (count == 0 || only != nullptr), "rope_table::fill: ", count,
                    " planes at ", static_cast<const void*>(only),
                    ", expected a list of count >= 0");
    planes = f.planes;
    for (int j = 0; j < planes; ++j) cs[j] = sn[j] = std::numeric_limits<float>::quiet_NaN();
    for (int i = 0; i < count; ++i) {
      const int j = only[i];
      KVSCOUT_EXPECTS(j >= 0 && j < planes, "rope_table::fill: plane ", j, " (entry ", i,
                      ") is outside [0, ", planes, ")");
      fill_plane(f, j, pos);
    }
  }
  void fill(const rope_config& c, int pos, const int* only, int count) {
    fill(rope_frequencies(c), pos, only, count);
  }

 private:
  void fill_plane(const rope_frequencies& f, int j, int pos) {
    detail::rope_cos_sin(detail::rope_angle_at(f.inv_freq[j], pos), cs[j], sn[j]);
  }
};

KVSCOUT_HOST_DEVICE void apply_rope(float* x, int pos, const rope_config& c) {
  for (int j = 0; j < c.head_dim / 2; ++j) {
    const detail::rope_plane p = detail::rope_plane_channels(c, j);
    detail::rope_rotate(x[p.a], x[p.b], detail::rope_angle(c, j, pos));
  }
}

namespace detail {
/// Applies RoPE at `pos` to a partial vector of whole planes: x[2 * i] and x[2 * i + 1] are the
/// channels (a, b) of plane planes[i] (a RoPE-plane partial query / key).
KVSCOUT_HOST_DEVICE void apply_rope_planes(float* x, const int* planes, int num_planes, int pos,
                                           const rope_config& c) {
  for (int i = 0; i < num_planes; ++i) {
    detail::rope_rotate(x[2 * i], x[2 * i + 1], detail::rope_angle(c, planes[i], pos));
  }
}
}  // namespace detail

}  // namespace kvscout
