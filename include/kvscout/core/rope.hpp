#pragma once
// Rotary position embedding (RoPE), written once for both backends.
//
// RoPE rotates each *plane* (a pair of channels) of a query or key by an angle proportional to the
// token position: plane j with inverse frequency w_j = theta^(-2j / D) is rotated by pos * w_j.
// Two channel conventions exist and both are supported:
//   rope_style::split_half         plane j = channels (j, j + D/2)   (Hugging Face / GPT-NeoX "rotate_half")
//   rope_style::interleaved  plane j = channels (2j, 2j + 1)   (GPT-J; llama.cpp's LLaMA "norm" mode)
// A rotation keeps each plane's norm, so |q_plane| measured before RoPE equals |q_plane| after it;
// RoPE-plane selection (skew/) relies on that.
//
//   kvscout::rope_config rope{.head_dim = 64, .theta = 10000.f, .style = kvscout::rope_style::split_half};
//   kvscout::apply_rope(q, /*pos=*/17, rope);        // q: float[64], in place

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

/// The two channels of plane j (0 <= j < head_dim / 2).
struct rope_plane {
  int a;
  int b;
};

KVSCOUT_HOST_DEVICE rope_plane rope_plane_channels(const rope_config& c, int j) {
  return c.style == rope_style::split_half ? rope_plane{j, j + c.head_dim / 2}
                                     : rope_plane{2 * j, 2 * j + 1};
}

/// The plane a channel belongs to.
KVSCOUT_HOST_DEVICE int rope_plane_of(const rope_config& c, int channel) {
  return c.style == rope_style::split_half ? channel % (c.head_dim / 2) : channel / 2;
}

/// Plane j's inverse frequency theta^(-2j / head_dim), in double.
KVSCOUT_HOST_DEVICE double rope_inv_freq(const rope_config& c, int j) {
  return pow(static_cast<double>(c.theta), -2.0 * j / c.head_dim);
}

/// The angle at position pos of a plane whose inverse frequency is inv_freq: rope_angle's double.
KVSCOUT_HOST_DEVICE double rope_angle_at(double inv_freq, int pos) {
  return static_cast<double>(pos) * inv_freq;
}

/// Rotation angle of plane j at position pos, computed in double then rounded, so that host and
/// device agree to the last bit of the float angle.
KVSCOUT_HOST_DEVICE double rope_angle(const rope_config& c, int j, int pos) {
  return rope_angle_at(rope_inv_freq(c, j), pos);
}

/// Rotates the pair (xa, xb) by the angle whose cosine and sine are cs and sn.
KVSCOUT_HOST_DEVICE void rope_rotate(float& xa, float& xb, float cs, float sn) {
  const float a = xa, b = xb;
  xa = a * cs - b * sn;
  xb = a * sn + b * cs;
}

/// Rotates the pair (x[a], x[b]) of plane j by the angle for `pos`.
KVSCOUT_HOST_DEVICE void rope_rotate(float& xa, float& xb, double angle) {
  rope_rotate(xa, xb, static_cast<float>(cos(angle)), static_cast<float>(sin(angle)));
}

/// The cosine and sine of an angle, rounded to float.
KVSCOUT_HOST_DEVICE void rope_cos_sin(double angle, float& cs, float& sn) {
  cs = static_cast<float>(cos(angle));
  sn = static_cast<float>(sin(angle));
}

/// The cosine and sine of plane j's angle at `pos`, rounded to float: what rope_table holds
/// (the device speculation computes its tables with the same function).
KVSCOUT_HOST_DEVICE void rope_cos_sin(const rope_config& c, int j, int pos, float& cs, float& sn) {
  rope_cos_sin(rope_angle(c, j, pos), cs, sn);
}

/// The inverse frequencies of a configuration's planes (rope_inv_freq, a pow each), computed once
/// for every table filled from them: whoever fills a table per decoded token keeps one per
/// configuration (infinigen_policy_host keeps one per layer). Host only.
struct rope_frequencies {
  static constexpr int max_planes = 256;  // head_dim up to 512
  int planes = 0;                         // min(head_dim / 2, max_planes)
  double inv_freq[max_planes];

  rope_frequencies() = default;
  explicit rope_frequencies(const rope_config& c) {
    planes = c.head_dim / 2 < max_planes ? c.head_dim / 2 : max_planes;
    if (planes < 0) planes = 0;
    for (int j = 0; j < planes; ++j) inv_freq[j] = rope_inv_freq(c, j);
  }
};

/// The cosine and sine of every plane's angle at one position. A decoded token's table is
/// computed once and shared by every head (and layer) with the same rope_config, instead of two
/// transcendental functions per plane per head. Rotations through the table are bit-identical to
/// rope_rotate(xa, xb, rope_angle(c, j, pos)), whichever fill made it. The struct is plain data
/// (device code names max_planes); fill() is host only.
struct rope_table {
  static constexpr int max_planes = rope_frequencies::max_planes;
  int planes = 0;
  float cs[max_planes];
  float sn[max_planes];

  /// Every plane, its inverse frequency computed here.
  void fill(const rope_config& c, int pos) { fill(rope_frequencies(c), pos); }

  /// Every plane, from inverse frequencies computed beforehand: a cosine and a sine per plane,
  /// no pow (the pow were about half of a fill's time, measured: docs/performance.md).
  void fill(const rope_frequencies& f, int pos) {
    planes = f.planes;
    for (int j = 0; j < planes; ++j) fill_plane(f, j, pos);
  }

  /// Only the planes only[0, count) (each in [0, planes); repeats allowed), with the bits the
  /// full fill gives them: a RoPE-plane speculation rotates r / 2 planes per head. Every other
  /// plane holds NaN, so a rotation through a plane left out shows as NaN, never as a wrong angle.
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
    rope_cos_sin(rope_angle_at(f.inv_freq[j], pos), cs[j], sn[j]);
  }
};

/// Applies RoPE at `pos` to a full head vector x[head_dim], in place.
KVSCOUT_HOST_DEVICE void apply_rope(float* x, int pos, const rope_config& c) {
  for (int j = 0; j < c.head_dim / 2; ++j) {
    const rope_plane p = rope_plane_channels(c, j);
    rope_rotate(x[p.a], x[p.b], rope_angle(c, j, pos));
  }
}

/// Applies RoPE at `pos` to a partial vector that holds whole planes: x[2 * i] and x[2 * i + 1]
/// are the two channels (a, b) of plane planes[i]. This is the layout of a RoPE-plane partial
/// query / key (skew/).
KVSCOUT_HOST_DEVICE void apply_rope_planes(float* x, const int* planes, int num_planes, int pos,
                                           const rope_config& c) {
  for (int i = 0; i < num_planes; ++i) {
    rope_rotate(x[2 * i], x[2 * i + 1], rope_angle(c, planes[i], pos));
  }
}

}  // namespace kvscout
