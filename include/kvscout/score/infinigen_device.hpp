#pragma once
// Host-side part of the device speculation (score/infinigen.cuh): config, partial key cache
// layout, workspace layout and every check made before a launch. Host-compilable (no kernels), so
// it is tested without a GPU.
//
// Device partial key cache: the host partial_key_cache's tile layout, byte for byte, in a region
// of the speculator's workspace (docs/cuda_speculation.md):
//   [num_seqs, num_kv_heads, tiles, R, B], B = 64 / sizeof(T) tokens, tiles = ceil(max_tokens / B)
//   element (s, h, c, t) at (((s * H + h) * tiles + t / B) * R + c) * B + t % B
// R = cfg.key_r(): r, or correction_r with the speculation's r channels first.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvscout/cache/quantized_partial_key_cache.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/device_context.hpp"
#include "kvscout/score/infinigen_config.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

/// A view into the workspace (layout in the header comment).
template <compute_element T, class Space = device_space>
struct partial_key_view {
  static constexpr int block_tokens = static_cast<int>(64 / sizeof(T));

  span<T, Space> data;  // [num_seqs, num_kv_heads, tiles, r, block_tokens]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int r = 0;
  int max_tokens = 0;

  KVSCOUT_HOST_DEVICE static int tiles_for(int max_tokens) {
    return (max_tokens + block_tokens - 1) / block_tokens;
  }
  KVSCOUT_HOST_DEVICE static std::size_t elements_for(int num_seqs, int num_kv_heads, int r,
                                                      int max_tokens) {
    return static_cast<std::size_t>(num_seqs) * num_kv_heads * tiles_for(max_tokens) *
           static_cast<std::size_t>(r) * block_tokens;
  }
  KVSCOUT_HOST_DEVICE int tiles() const { return tiles_for(max_tokens); }
  KVSCOUT_HOST_DEVICE std::size_t tile_offset(int s, int h, int b) const {
    return ((static_cast<std::size_t>(s) * num_kv_heads + h) * tiles() + b) *
           static_cast<std::size_t>(r) * block_tokens;
  }
  KVSCOUT_HOST_DEVICE std::size_t offset(int s, int h, int c, int t) const {
    return tile_offset(s, h, t / block_tokens) + static_cast<std::size_t>(c) * block_tokens +
           t % block_tokens;
  }
};

namespace detail {
/// The host quantized_partial_key_cache's format byte for byte, plus the token counts, over three
/// regions of the speculator's workspace:
///   tiles    float [num_seqs, num_kv_heads, tiles, tile_floats]
///   staging  float [num_seqs, num_kv_heads, R, Group]: the newest incomplete group, exact
///   counts   int32 [num_seqs, num_kv_heads]: tokens appended
template <int Bits, int Group = 32, class Space = device_space>
struct quantized_key_view {
  static_assert(detail::supported_key_quantization(Bits, Group),
                "quantized partial keys support Bits of 2, 4 or 8 and groups of 16, 32, 64 or 128");
  static constexpr int bits = Bits;
  static constexpr int group_tokens = Group;
  static constexpr int levels = (1 << Bits) - 1;
  static constexpr int line_bytes = Group * Bits / 8;
  static constexpr int block_tokens = Group;

  span<float, Space> tile_data;
  span<float, Space> staging;
  span<std::int32_t, Space> counts;
  int num_seqs = 0;
  int num_kv_heads = 0;
  int r = 0;
  int max_tokens = 0;

  KVSCOUT_HOST_DEVICE static int tiles_for(int max_tokens) { return (max_tokens + Group - 1) / Group; }
  KVSCOUT_HOST_DEVICE static std::size_t tile_floats_for(int r) {
    const std::size_t raw = static_cast<std::size_t>(r) * (8 + line_bytes);
    return (raw + 63) / 64 * 16;
  }
  KVSCOUT_HOST_DEVICE static std::size_t tile_elements_for(int num_seqs, int num_kv_heads, int r,
                                                           int max_tokens) {
    return static_cast<std::size_t>(num_seqs) * num_kv_heads * tiles_for(max_tokens) *
           tile_floats_for(r);
  }
  KVSCOUT_HOST_DEVICE static std::size_t staging_elements_for(int num_seqs, int num_kv_heads, int r) {
    return static_cast<std::size_t>(num_seqs) * num_kv_heads * static_cast<std::size_t>(r) * Group;
  }
  KVSCOUT_HOST_DEVICE int tiles() const { return tiles_for(max_tokens); }
  KVSCOUT_HOST_DEVICE std::size_t tile_offset(int s, int h, int b) const {
    return ((static_cast<std::size_t>(s) * num_kv_heads + h) * tiles() + b) * tile_floats_for(r);
  }
  KVSCOUT_HOST_DEVICE std::size_t staging_offset(int s, int h) const {
    return (static_cast<std::size_t>(s) * num_kv_heads + h) * static_cast<std::size_t>(r) * Group;
  }
};

/// How a partial key format lives in device memory: the view the kernels read, the bytes of the
/// workspace's key region and the view over such a region.
template <class PkT>
struct device_key_format {
  using view = partial_key_view<PkT>;
  static constexpr bool quantized = false;
  static std::size_t bytes(int S, int H, int R, int T) {
    return sizeof(PkT) * partial_key_view<PkT>::elements_for(S, H, R, T);
  }
  static view make(std::byte* base, int S, int H, int R, int T) {
    return {device_span<PkT>(reinterpret_cast<PkT*>(base), partial_key_view<PkT>::elements_for(S, H, R, T)),
            S, H, R, T};
  }
};
template <int Bits, int Group>
struct device_key_format<quantized_keys<Bits, Group>> {
  using view = detail::quantized_key_view<Bits, Group>;
  static constexpr bool quantized = true;
  static std::size_t round(std::size_t n) { return (n + 255) / 256 * 256; }
  static std::size_t tile_bytes(int S, int H, int R, int T) {
    return round(sizeof(float) * view::tile_elements_for(S, H, R, T));
  }
  static std::size_t staging_bytes(int S, int H, int R) {
    return round(sizeof(float) * view::staging_elements_for(S, H, R));
  }
  static std::size_t bytes(int S, int H, int R, int T) {
    return tile_bytes(S, H, R, T) + staging_bytes(S, H, R) +
           sizeof(std::int32_t) * static_cast<std::size_t>(S) * H;
  }
  static view make(std::byte* base, int S, int H, int R, int T) {
    view v;
    v.tile_data = device_span<float>(reinterpret_cast<float*>(base), view::tile_elements_for(S, H, R, T));
    v.staging = device_span<float>(reinterpret_cast<float*>(base + tile_bytes(S, H, R, T)),
                                   view::staging_elements_for(S, H, R));
    v.counts = device_span<std::int32_t>(
        reinterpret_cast<std::int32_t*>(base + tile_bytes(S, H, R, T) + staging_bytes(S, H, R)),
        static_cast<std::size_t>(S) * H);
    v.num_seqs = S, v.num_kv_heads = H, v.r = R, v.max_tokens = T;
    return v;
  }
};

/// partial_key_view<PkT>, or quantized_key_view<Bits, Group> for quantized_keys<Bits, Group>.
template <class PkT>
using device_key_view = typename device_key_format<PkT>::view;

inline constexpr int spec_block_threads = 128;   // threads of a scoring block
inline constexpr int spec_tokens_per_thread = 8;  // tokens a scoring thread handles (16 bytes
                                                  // of a 16-bit key channel, 32 of a float one)
inline constexpr int spec_tokens_per_block = spec_block_threads * spec_tokens_per_thread;
inline constexpr int spec_gemv_warps = 8;         // rows of W per GEMV block (one per warp)
inline constexpr int spec_gemv_threads = 32 * spec_gemv_warps;
inline constexpr int spec_finish_lanes = 16;      // threads sharing one partial-query element
inline constexpr int spec_finish_outputs = 4;     // partial-query elements per finish block
inline constexpr int spec_finish_threads = spec_finish_lanes * spec_finish_outputs;
inline constexpr int spec_max_grid_yz = 65535;    // kv heads (y) and sequences (z) of a grid
inline constexpr std::size_t spec_max_group_smem = 32 * 1024;  // g * r floats in shared memory
inline constexpr std::size_t spec_max_quantize_smem = 32 * 1024;  // R * Group floats

///   weights   WT [num_q_heads, rows, d_model]     partial W_Q rows (make_partial_query_weights)
///   bias      float [num_q_heads, rows]
///   rotation  float [num_kv_heads, head_dim, R]   A[:, S] per kv head (not for rope_planes)
///   channels  int32 [num_kv_heads, R]             S per kv head
///   planes    int32 [num_kv_heads, r / 2]         the speculation's RoPE planes (rope_planes only)
///   y         float [num_seqs, num_q_heads, rows] GEMV output (W x + b), scratch
///   q         float [num_seqs, num_q_heads, R]    scaled partial queries, scratch
///   stats     float2 [num_seqs, num_kv_heads, chunks, g] softmax (max, sum) per block (sum_prob)
///   keys      T [partial_key_view layout]          the partial key cache
/// rows = head_dim for post_rope_skew (the whole query is rotated), r otherwise; R = key_r().
struct infinigen_cuda_layout {
  int rows = 0;
  int chunks = 0;  // scoring blocks per row at max_tokens
  std::size_t weights = 0, bias = 0, rotation = 0, channels = 0, planes = 0, y = 0, q = 0,
              stats = 0, keys = 0, total = 0;
  std::size_t key_elements = 0;  // partial_key_view's elements (0 for quantised keys)
};

inline std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

/// The grids score() launches for num_seqs sequences of up to max_len tokens. Host code, so the
/// shapes are tested without a GPU.
struct spec_launch_shapes {
  long long gemv_blocks = 0;
  long long finish[3] = {0, 0, 0};
  long long score[3] = {0, 0, 0};
  [[nodiscard]] static long long count(const long long (&g)[3]) { return g[0] * g[1] * g[2]; }
};
inline spec_launch_shapes spec_shapes(const infinigen_config& c, int rows, int num_seqs,
                                      int max_len) {
  spec_launch_shapes l;
  const long long total_rows = static_cast<long long>(c.shape.num_q_heads) * rows;
  l.gemv_blocks = (total_rows + spec_gemv_warps - 1) / spec_gemv_warps;
  l.finish[0] = num_seqs;
  l.finish[1] = c.shape.num_q_heads;
  l.finish[2] = (c.r + spec_finish_outputs - 1) / spec_finish_outputs;
  l.score[0] = (static_cast<long long>(max_len) + spec_tokens_per_block - 1) / spec_tokens_per_block;
  l.score[1] = c.shape.num_kv_heads;
  l.score[2] = num_seqs;
  return l;
}

inline void check_infinigen_cuda_config(const infinigen_config& c) {
  KVSCOUT_EXPECTS(c.shape.num_seqs > 0 && c.shape.num_kv_heads > 0 && c.shape.max_tokens > 0,
                  "infinigen_policy_cuda needs positive sizes, got seqs ", c.shape.num_seqs,
                  ", kv heads ", c.shape.num_kv_heads, ", max_tokens ", c.shape.max_tokens);
  check_infinigen_config(c);  // what the host policy checks too (infinigen_config.hpp)
  const int g = c.shape.num_q_heads / c.shape.num_kv_heads;
  KVSCOUT_EXPECTS(c.shape.num_q_heads <= spec_max_grid_yz, "num_q_heads = ", c.shape.num_q_heads,
                  " exceeds the grid limit ", spec_max_grid_yz, " (the finish kernel's grid.y)");
  KVSCOUT_EXPECTS(c.shape.head_dim <= 2 * rope_table::max_planes, "head_dim ", c.shape.head_dim,
                  " exceeds the device speculation's limit ", 2 * rope_table::max_planes);
  if (c.mode != rope_mode::pre_rope_folded) {
    KVSCOUT_EXPECTS(c.shape.head_dim % 2 == 0, "RoPE modes need an even head_dim, got ",
                    c.shape.head_dim);
  }
  KVSCOUT_EXPECTS(c.shape.num_seqs <= spec_max_grid_yz && c.shape.num_kv_heads <= spec_max_grid_yz,
                  "num_seqs = ", c.shape.num_seqs, " and num_kv_heads = ", c.shape.num_kv_heads,
                  " must be at most ", spec_max_grid_yz, " (grid limit)");
  const std::size_t group_bytes = sizeof(float) * static_cast<std::size_t>(g) * c.key_r();
  KVSCOUT_EXPECTS(group_bytes <= spec_max_group_smem, "a GQA group's partial queries (g = ", g,
                  ", r = ", c.key_r(), ": ", group_bytes, " bytes) exceed the ", spec_max_group_smem,
                  " bytes of shared memory a scoring block uses");
}

template <class PkT, class WT = float>
infinigen_cuda_layout infinigen_cuda_layout_of(const infinigen_config& c) {
  check_infinigen_cuda_config(c);
  infinigen_cuda_layout l;
  const std::size_t S = static_cast<std::size_t>(c.shape.num_seqs);
  const std::size_t H = static_cast<std::size_t>(c.shape.num_kv_heads);
  const std::size_t Hq = static_cast<std::size_t>(c.shape.num_q_heads);
  const std::size_t g = Hq / H;
  const std::size_t r = static_cast<std::size_t>(c.r);
  const std::size_t R = static_cast<std::size_t>(c.key_r());
  l.rows = c.mode == rope_mode::post_rope_skew ? c.shape.head_dim : c.r;
  l.chunks = (c.shape.max_tokens + spec_tokens_per_block - 1) / spec_tokens_per_block;
  l.key_elements = 0;
  if constexpr (!device_key_format<PkT>::quantized)
    l.key_elements = partial_key_view<PkT>::elements_for(c.shape.num_seqs, c.shape.num_kv_heads,
                                                         c.key_r(), c.shape.max_tokens);
  std::size_t at = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at = align_up(at + bytes, 256);
    return here;
  };
  const std::size_t rows = static_cast<std::size_t>(l.rows);
  l.weights = take(sizeof(WT) * Hq * rows * static_cast<std::size_t>(c.shape.d_model));
  l.bias = take(sizeof(float) * Hq * rows);
  l.rotation = take(c.mode == rope_mode::rope_planes
                        ? 0
                        : sizeof(float) * H * static_cast<std::size_t>(c.shape.head_dim) * R);
  l.channels = take(sizeof(std::int32_t) * H * R);
  l.planes = take(c.mode == rope_mode::rope_planes ? sizeof(std::int32_t) * H * (r / 2) : 0);
  l.y = take(sizeof(float) * S * Hq * rows);
  l.q = take(sizeof(float) * S * Hq * R);
  l.stats = take(c.aggregation == gqa_aggregation::sum_prob || c.late_aggregation() == gqa_aggregation::sum_prob
                     ? 2 * sizeof(float) * S * H * static_cast<std::size_t>(l.chunks) * g
                     : 0);
  if constexpr (device_key_format<PkT>::quantized) {
    const std::size_t group_bytes = sizeof(float) * static_cast<std::size_t>(c.key_r()) * PkT::group;
    KVSCOUT_EXPECTS(group_bytes <= spec_max_quantize_smem, "quantised partial keys: a group of ",
                    PkT::group, " tokens x ", c.key_r(), " channels is ", group_bytes,
                    " bytes of floats, over the ", spec_max_quantize_smem,
                    " bytes of shared memory the quantising kernel uses; use a smaller group or r");
  }
  l.keys = take(device_key_format<PkT>::bytes(c.shape.num_seqs, c.shape.num_kv_heads, c.key_r(),
                                              c.shape.max_tokens));
  l.total = at;
  return l;
}

inline constexpr std::size_t infinigen_workspace_alignment = 256;

/// Size, null, alignment; its contents are not read.
inline void check_infinigen_cuda_workspace(device_span<std::byte> workspace, std::size_t need) {
  KVSCOUT_EXPECTS(workspace.size() >= need, "workspace holds ", workspace.size(),
                  " bytes, expected at least workspace_bytes(config) = ", need);
  KVSCOUT_EXPECTS(workspace.data() != nullptr, "workspace is null but ", need, " bytes are needed");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) %
                          infinigen_workspace_alignment == 0,
                  "workspace must be ", infinigen_workspace_alignment,
                  "-byte aligned (cudaMalloc is), got address ",
                  static_cast<const void*>(workspace.data()));
}

/// The checks score() and score_query() share.
inline void check_infinigen_cuda_scores(const infinigen_config& c,
                                        const score_context<device_space>& ctx,
                                        const score_buffer<device_space>& out) {
  const int S = out.num_seqs;
  KVSCOUT_EXPECTS(S >= 1 && S <= c.shape.num_seqs, "score buffer num_seqs = ", S,
                  " is outside [1, config num_seqs = ", c.shape.num_seqs, "]");
  KVSCOUT_EXPECTS(ctx.max_seq_len >= 0 && ctx.max_seq_len <= c.shape.max_tokens, "max_seq_len = ",
                  ctx.max_seq_len, " is outside [0, max_tokens = ", c.shape.max_tokens, "]");
  check_device_score_call(c.shape.num_kv_heads, ctx, out);
}

inline void check_infinigen_cuda_score(const infinigen_config& c,
                                       const score_context<device_space>& ctx,
                                       const score_buffer<device_space>& out) {
  check_infinigen_cuda_scores(c, ctx, out);
  const std::size_t s = static_cast<std::size_t>(out.num_seqs);
  const std::size_t x_need = s * static_cast<std::size_t>(c.shape.d_model);
  KVSCOUT_EXPECTS(ctx.x.size() >= x_need && ctx.x.data() != nullptr, "x holds ", ctx.x.size(),
                  " floats, expected num_seqs * d_model = ", x_need);
  KVSCOUT_EXPECTS(ctx.positions.size() >= s && ctx.positions.data() != nullptr,
                  "positions holds ", ctx.positions.size(), " entries, expected num_seqs = ", s);
}

inline void check_infinigen_cuda_score_query(const infinigen_config& c, std::size_t q_size,
                                             bool q_present, const score_context<device_space>& ctx,
                                             const score_buffer<device_space>& out) {
  KVSCOUT_EXPECTS(c.mode != rope_mode::pre_rope_folded, "score_query: the plans are "
                  "pre_rope_folded (partial keys before RoPE); a query after RoPE needs "
                  "post_rope_skew or rope_planes plans");
  check_infinigen_cuda_scores(c, ctx, out);
  const int S = out.num_seqs;
  const std::size_t need = static_cast<std::size_t>(S) * c.shape.num_q_heads *
                           static_cast<std::size_t>(c.shape.head_dim);
  KVSCOUT_EXPECTS(q_size >= need && q_present, "q holds ", q_size, " floats, expected [", S, ", ",
                  c.shape.num_q_heads, ", ", c.shape.head_dim, "]");
}

inline void check_infinigen_cuda_append(const infinigen_config& c, std::size_t key_elements,
                                        bool keys_present, device_span<const int32_t> seq_ids,
                                        device_span<const int32_t> token_ids, int count) {
  KVSCOUT_EXPECTS(count >= 0, "count must be non-negative, got ", count);
  const std::size_t n = static_cast<std::size_t>(count);
  const std::size_t key_need =
      n * c.shape.num_kv_heads * static_cast<std::size_t>(c.shape.head_dim);
  KVSCOUT_EXPECTS(key_elements >= key_need && (keys_present || n == 0), "keys holds ",
                  key_elements, " elements, expected count * num_kv_heads * head_dim = ",
                  key_need);
  KVSCOUT_EXPECTS(seq_ids.size() >= n && (seq_ids.data() != nullptr || n == 0), "seq_ids holds ",
                  seq_ids.size(), " entries, expected count = ", n);
  KVSCOUT_EXPECTS(token_ids.size() >= n && (token_ids.data() != nullptr || n == 0),
                  "token_ids holds ", token_ids.size(), " entries, expected count = ", n);
}

}  // namespace detail
}  // namespace kvscout
