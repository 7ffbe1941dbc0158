#pragma once
// Decode attention on the host: one new query per (sequence, query head) against the rows of a
// row source (attention/rows.hpp) plus, optionally, the current token's own K / V.
//
//   out[s, qh, :] = sum_i softmax_i(scale * q[s, qh] . k_i) v_i,   kv head h = qh / (Hq / H)
//
// with k_i and v_i the stored values times k_scale and v_scale (fp8 caches). The same routine is
// the dense reference (layout_rows_host) and sparse attention (gathered_rows_host). Each K / V row
// is loaded once per group of up to 16 query heads; the softmax is online, so nothing is
// allocated. Acc = double accumulates in fp64, one row at a time in the plain order.
//
// A logit that overflows float in the float path makes that head's output NaN rather than a wrong
// finite value, and with probs the group's probabilities of that (sequence, kv head) too; NaN keys
// or queries do the same. A logit of -inf only gets weight 0.
//
//   kvscout::layout_rows_host rows(kv);                       // kv: kv_view<layout, host_space>
//   kvscout::decode_attention_host(rows, kvscout::current_token<kvscout::half>{k_cur, v_cur}, q,
//                                  out, {.num_q_heads = 9, .scale = 0.125f});
//
// Optional `probs` [num_seqs, num_kv_heads, probs_stride]: each row's attention probability summed
// over the group's query heads (the current token, when given, is the entry after the last row).
// Optional `exec.pool`: the (sequence, kv head) pairs are split over its threads (the same bits);
// the rows' loads then run there and must not throw.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kvscout/attention/rows.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/thread_pool.hpp"
#include "kvscout/core/detail/online_softmax.hpp"
#include "kvscout/core/detail/overlap.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

struct attention_params {
  int num_q_heads = 0;
  float scale = 0.f;  // usually 1 / sqrt(head_dim)
  // Dequantisation scales of a cache that stores K / scale and V / scale (fp8 caches): every key
  // and value attention reads, the current token's included, is multiplied back.
  float k_scale = 1.f;
  float v_scale = 1.f;
};

/// The current token's K / V [num_seqs, num_kv_heads, head_dim] in the cache's element type (the
/// exact values the cache will hold). Empty: none.
template <kv_element T, class Space = host_space>
struct current_token {
  span<const T, Space> k;
  span<const T, Space> v;
  [[nodiscard]] bool present() const { return k.data() != nullptr; }
};

namespace detail {
/// Each positive and finite, and their product scale * k_scale (in float) too.
inline void check_attention_scales(const attention_params& p) {
  KVSCOUT_EXPECTS(std::isfinite(p.scale) && p.scale > 0.f, "scale must be positive and finite, got ",
                  p.scale);
  KVSCOUT_EXPECTS(std::isfinite(p.k_scale) && p.k_scale > 0.f && std::isfinite(p.v_scale) &&
                      p.v_scale > 0.f,
                  "k_scale and v_scale must be positive and finite, got ", p.k_scale, " and ",
                  p.v_scale);
  KVSCOUT_EXPECTS(std::isfinite(p.scale * p.k_scale) && p.scale * p.k_scale > 0.f,
                  "scale * k_scale = ", p.scale, " * ", p.k_scale,
                  " must be positive and finite in float (it scales the logits)");
}
}  // namespace detail

namespace detail {
/// The rows' element type where the source names one, else float, so that `{}` (no current token)
/// needs no type.
template <class Rows>
struct rows_element {
  using type = float;
};
template <class Rows>
  requires requires { typename Rows::element_type; }
struct rows_element<Rows> {
  using type = typename Rows::element_type;
};
}  // namespace detail

namespace detail {
/// Every size, overlap and scale decode_attention_host needs, checked before anything is written.
template <class Rows, class T>
void check_decode_attention(const Rows& rows, const current_token<T>& cur, host_span<const float> q,
                            host_span<float> out, const attention_params& p,
                            host_span<float> probs, int probs_stride) {
  constexpr int D = Rows::head_dim;
  const int S = rows.num_seqs();
  const int H = rows.num_kv_heads();
  const int Hq = p.num_q_heads;
  KVSCOUT_EXPECTS(Hq >= 1 && Hq % H == 0, "num_q_heads = ", Hq,
                  " must be a positive multiple of num_kv_heads = ", H);
  check_attention_scales(p);
  const std::size_t q_elems = static_cast<std::size_t>(S) * Hq * D;
  KVSCOUT_EXPECTS(q.size() >= q_elems, "q holds ", q.size(), " floats, expected [", S, ", ", Hq,
                  ", ", D, "] = ", q_elems);
  KVSCOUT_EXPECTS(out.size() >= q_elems, "out holds ", out.size(), " floats, expected ", q_elems);
  const auto overlap = [](const float* a, std::size_t an, const float* b, std::size_t bn) {
    return bytes_overlap(a, an * sizeof(float), b, bn * sizeof(float));
  };
  // Each group of query heads is read before its outputs are written, so out may be q itself (not
  // shifted against it, and not with probs, whose pass reads the queries again).
  const bool in_place = out.data() == q.data() && probs.data() == nullptr;
  KVSCOUT_EXPECTS(in_place || !overlap(out.data(), q_elems, q.data(), q_elems),
                  "out overlaps q: only out == q without probs is allowed (the probabilities "
                  "pass reads the queries again)");
  const std::size_t cur_elems = static_cast<std::size_t>(S) * H * D;
  if (cur.present()) {
    KVSCOUT_EXPECTS(cur.k.size() >= cur_elems && cur.v.size() >= cur_elems,
                    "current token K / V hold ", cur.k.size(), " / ", cur.v.size(),
                    " elements, expected [", S, ", ", H, ", ", D, "] = ", cur_elems);
  }
  if (probs.data() != nullptr) {
    int most = 0;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) most = std::max(most, rows.rows(s, h) + (cur.present() ? 1 : 0));
    KVSCOUT_EXPECTS(probs_stride >= most, "probs_stride = ", probs_stride,
                    " is smaller than the longest row set (", most, ")");
    const std::size_t probs_elems = static_cast<std::size_t>(S) * H * probs_stride;
    KVSCOUT_EXPECTS(probs.size() >= probs_elems, "probs holds ", probs.size(),
                    " floats, expected ", probs_elems);
    KVSCOUT_EXPECTS(!overlap(probs.data(), probs_elems, q.data(), q_elems) &&
                        !overlap(probs.data(), probs_elems, out.data(), q_elems),
                    "probs overlaps q or out");
  }
}

/// One (sequence, kv head) pair of decode_attention_host: its group of query heads, 16 at a time,
/// over the pair's rows and the current token. Pairs share nothing, so each gets the same bits on
/// any thread.
template <class Acc, class Rows, class T>
class decode_pair {
 public:
  static constexpr int D = Rows::head_dim;
  static constexpr int chunk = 16;  // query heads sharing one load of a row
  static constexpr int R = 16;      // rows per block of the float path

  decode_pair(const Rows& rows, const current_token<T>& cur, host_span<const float> q,
              host_span<float> out, const attention_params& p, host_span<float> probs,
              int probs_stride)
      : rows_(rows),
        cur_(cur),
        q_(q),
        out_(out),
        probs_(probs),
        probs_stride_(probs_stride),
        H_(rows.num_kv_heads()),
        Hq_(p.num_q_heads),
        g_(p.num_q_heads / rows.num_kv_heads()),
        logit_scale_(static_cast<Acc>(p.scale) * static_cast<Acc>(p.k_scale)),
        v_scale_(static_cast<Acc>(p.v_scale)) {}

  void operator()(int s, int h) const {
    state st;
    const int n = rows_.rows(s, h);
    const int total = n + (cur_.present() ? 1 : 0);
    float* prow = probs_.data() != nullptr
                      ? probs_.data() + (static_cast<std::size_t>(s) * H_ + h) * probs_stride_
                      : nullptr;
    if (prow != nullptr) std::fill(prow, prow + total, 0.f);
    for (int j0 = 0; j0 < g_; j0 += chunk) {
      const int gj = std::min(chunk, g_ - j0);
      const float* qs = q_.data() + (static_cast<std::size_t>(s) * Hq_ + h * g_ + j0) * D;
      for (int j = 0; j < gj; ++j) {
        st.m[j] = -std::numeric_limits<Acc>::infinity();
        st.l[j] = 0;
        for (int c = 0; c < D; ++c) st.acc[j][c] = 0;
      }
      if constexpr (std::is_same_v<Acc, float>) {
        blocks(st, s, h, n, total, qs, gj);
      } else {
        plain(st, s, h, n, total, qs, gj);
      }
      for (int j = 0; j < gj; ++j) {
        float* o = out_.data() + (static_cast<std::size_t>(s) * Hq_ + h * g_ + j0 + j) * D;
        for (int c = 0; c < D; ++c)
          o[c] = total > 0 ? static_cast<float>(st.acc[j][c] / st.l[j] * v_scale_) : 0.f;
      }
      if (prow != nullptr) probabilities(st, s, h, n, total, qs, gj, prow);
    }
  }

 private:
  struct state {
    Acc m[chunk], l[chunk], acc[chunk][D];
    alignas(64) float kblk[std::is_same_v<Acc, float> ? R : 1][D];
    alignas(64) float vblk[std::is_same_v<Acc, float> ? R : 1][D];
    alignas(64) float logit_blk[chunk][R];
  };

  // Row i of the pair (the current token at i == n) into dst, K or V.
  void load(int s, int h, int n, int i, bool key, float* dst) const {
    if (i < n) {
      key ? rows_.load_k(s, h, i, dst) : rows_.load_v(s, h, i, dst);
    } else {
      const T* src = (key ? cur_.k.data() : cur_.v.data()) +
                     (static_cast<std::size_t>(s) * H_ + h) * D;
      for (int c = 0; c < D; ++c) dst[c] = to_float(src[c]);
    }
  }

  Acc logit_of(const float* qs, int j, const float* k) const {
    Acc dot = 0;
    const float* qj = qs + static_cast<std::size_t>(j) * D;
    for (int c = 0; c < D; ++c) dot += static_cast<Acc>(qj[c]) * static_cast<Acc>(k[c]);
    return dot * logit_scale_;
  }

  // The float path: blocks of R rows, the block's logits for the whole group, one rescale per head
  // and block, then the block's V rows multiply-added a register of channels at a time.
  void blocks(state& st, int s, int h, int n, int total, const float* qs, int gj) const {
    for (int i0 = 0; i0 < total; i0 += R) {
      const int nb = std::min(R, total - i0);
      for (int b = 0; b < nb; ++b) load(s, h, n, i0 + b, true, st.kblk[b]);
      dot_rows_multi(&st.kblk[0][0], D, qs, D, gj, D, nb, &st.logit_blk[0][0], R);
      for (int b = 0; b < nb; ++b) load(s, h, n, i0 + b, false, st.vblk[b]);
      for (int j = 0; j < gj; ++j) {
        const float* x = st.logit_blk[j];  // q . k, unscaled
        float bm = st.m[j];
        for (int b = 0; b < nb; ++b) {
          const float xs = x[b] * logit_scale_;
          bm = xs > bm ? xs : bm;  // a NaN logit is not a maximum (it poisons l below)
        }
        float f = 1.f;
        if (softmax_raise(st.m[j], st.l[j], bm, &f))
          for (int c = 0; c < D; ++c) st.acc[j][c] *= f;
        float w[R];
        for (int b = 0; b < nb; ++b) {
          w[b] = std::exp(madd(-st.m[j], x[b], logit_scale_));  // as the probs pass
          st.l[j] += w[b];
        }
        int c = 0;
        for (; c + host_float_lanes <= D; c += host_float_lanes) {
          host_vec a;
          std::memcpy(&a, &st.acc[j][c], sizeof a);
          for (int b = 0; b < nb; ++b) {
            host_vec v;
            std::memcpy(&v, &st.vblk[b][c], sizeof v);
            a = madd(a, v, w[b]);
          }
          std::memcpy(&st.acc[j][c], &a, sizeof a);
        }
        for (; c < D; ++c)
          for (int b = 0; b < nb; ++b) st.acc[j][c] = madd(st.acc[j][c], st.vblk[b][c], w[b]);
      }
    }
  }

  // The fp64 reference: one row at a time, every sum in Acc, in the plain order.
  void plain(state& st, int s, int h, int n, int total, const float* qs, int gj) const {
    for (int i = 0; i < total; ++i) {
      load(s, h, n, i, true, st.kblk[0]);
      load(s, h, n, i, false, st.vblk[0]);
      for (int j = 0; j < gj; ++j) {
        const softmax_factors<Acc> f = softmax_push(st.m[j], st.l[j], logit_of(qs, j, st.kblk[0]));
        for (int c = 0; c < D; ++c) st.acc[j][c] = st.acc[j][c] * f.f + f.w * st.vblk[0][c];
      }
    }
  }

  // A second pass over K only, each row's probability summed over the group. The float path forms
  // each exponent by the first pass's explicit multiply-add (no contraction in one only).
  void probabilities(state& st, int s, int h, int n, int total, const float* qs, int gj,
                     float* prow) const {
    if constexpr (std::is_same_v<Acc, float>) {
      for (int i0 = 0; i0 < total; i0 += R) {
        const int nb = std::min(R, total - i0);
        for (int b = 0; b < nb; ++b) load(s, h, n, i0 + b, true, st.kblk[b]);
        dot_rows_multi(&st.kblk[0][0], D, qs, D, gj, D, nb, &st.logit_blk[0][0], R);
        for (int j = 0; j < gj; ++j)
          for (int b = 0; b < nb; ++b)
            prow[i0 + b] += std::exp(madd(-st.m[j], st.logit_blk[j][b], logit_scale_)) / st.l[j];
      }
    } else {
      for (int i = 0; i < total; ++i) {
        load(s, h, n, i, true, st.kblk[0]);
        for (int j = 0; j < gj; ++j)
          prow[i] += static_cast<float>(std::exp(logit_of(qs, j, st.kblk[0]) - st.m[j]) / st.l[j]);
      }
    }
  }

  const Rows& rows_;
  const current_token<T>& cur_;
  host_span<const float> q_;
  host_span<float> out_;
  host_span<float> probs_;
  int probs_stride_, H_, Hq_, g_;
  Acc logit_scale_, v_scale_;
};
}  // namespace detail

template <class Acc = float, attention_rows Rows,
          kv_element T = typename detail::rows_element<Rows>::type>
void decode_attention_host(const Rows& rows, const current_token<T>& cur, host_span<const float> q,
                           host_span<float> out, const attention_params& p,
                           host_span<float> probs = {}, int probs_stride = 0,
                           host_exec exec = {}) {
  detail::check_decode_attention(rows, cur, q, out, p, probs, probs_stride);
  const detail::decode_pair<Acc, Rows, T> one_pair(rows, cur, q, out, p, probs, probs_stride);
  const int H = rows.num_kv_heads();
  const int pairs = rows.num_seqs() * H;
  thread_pool* const pool = exec.pool;
  if (pool == nullptr || pool->size() == 1 || pairs < 2) {
    for (int i = 0; i < pairs; ++i) one_pair(i / H, i % H);
    return;
  }
  // thread_pool::run requires a task that does not throw: a row source's loads must not.
  pool->run([&](int part, int parts) noexcept {
    const int i1 = static_cast<int>(static_cast<std::int64_t>(pairs) * (part + 1) / parts);
    for (int i = static_cast<int>(static_cast<std::int64_t>(pairs) * part / parts); i < i1; ++i)
      one_pair(i / H, i % H);
  });
}

}  // namespace kvscout
