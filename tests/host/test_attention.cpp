// Decode attention on the host: dense (layout rows) and sparse (gathered rows) against an fp64
// reference written from the definition; GQA groups of 1, 3, 8 and 20 (more than one chunk of
// query heads); row counts that are not multiples of the float path's blocks of 16; head dims
// that are not multiples of the vector width; the current token; attention probabilities;
// overflowing logits; bad input.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <random>
#include <type_traits>
#include <vector>

#include "kvscout/attention/cache_rows.hpp"
#include "kvscout/attention/decode.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"

namespace {

template <class T, int HeadDim = 64>
struct attn_fixture {
  static constexpr int D = HeadDim;
  using layout = kvscout::contiguous_layout<T, D, kvscout::hnd>;
  int S, H, Hq, cap;
  std::vector<int32_t> lens;
  std::vector<T> k, v, kc, vc;
  std::vector<float> q;
  layout l;

  attn_fixture(std::vector<int32_t> seq_lens, int heads, int group, std::uint32_t seed)
      : S(static_cast<int>(seq_lens.size())), H(heads), Hq(heads * group), lens(std::move(seq_lens)) {
    cap = 1;
    for (int x : lens) cap = std::max(cap, x);
    l = layout::padded(H, cap, lens.data(), S);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const std::size_t n = static_cast<std::size_t>(S) * H * cap * D;
    k.resize(n), v.resize(n);
    for (auto& x : k) x = kvscout::from_float<T>(nd(rng));
    for (auto& x : v) x = kvscout::from_float<T>(nd(rng));
    kc.resize(static_cast<std::size_t>(S) * H * D), vc.resize(kc.size());
    for (auto& x : kc) x = kvscout::from_float<T>(nd(rng));
    for (auto& x : vc) x = kvscout::from_float<T>(nd(rng));
    q.resize(static_cast<std::size_t>(S) * Hq * D);
    for (auto& x : q) x = 2.f * nd(rng);  // sharp enough that the softmax is not uniform
  }
  kvscout::kv_view<layout, kvscout::host_space> view() const {
    return {l, kvscout::as_bytes(kvscout::host_span<const T>(k.data(), k.size())),
            kvscout::as_bytes(kvscout::host_span<const T>(v.data(), v.size()))};
  }
  kvscout::current_token<T> current() const { return {{kc.data(), kc.size()}, {vc.data(), vc.size()}}; }

  // fp64 reference over the given token subset per (s, h) (+ current token when asked); also the
  // probabilities summed over the group.
  // Keys and values are the stored elements times k_scale / v_scale (fp8 caches).
  void reference(const std::vector<std::vector<int>>& tokens, bool with_current, float scale,
                 std::vector<double>& out, std::vector<std::vector<double>>& probs,
                 double k_scale = 1.0, double v_scale = 1.0) const {
    const int g = Hq / H;
    out.assign(q.size(), 0.0);
    probs.assign(static_cast<std::size_t>(S) * H, {});
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const auto& ts = tokens[static_cast<std::size_t>(s) * H + h];
        const int n = static_cast<int>(ts.size()) + (with_current ? 1 : 0);
        auto key = [&](int i, int c) -> double {
          if (i < static_cast<int>(ts.size()))
            return k_scale * kvscout::to_float(k[l.k_offset(s, ts[i], h) / sizeof(T) + c]);
          return k_scale * kvscout::to_float(kc[(static_cast<std::size_t>(s) * H + h) * D + c]);
        };
        auto val = [&](int i, int c) -> double {
          if (i < static_cast<int>(ts.size()))
            return v_scale * kvscout::to_float(v[l.v_offset(s, ts[i], h) / sizeof(T) + c]);
          return v_scale * kvscout::to_float(vc[(static_cast<std::size_t>(s) * H + h) * D + c]);
        };
        auto& pr = probs[static_cast<std::size_t>(s) * H + h];
        pr.assign(n, 0.0);
        for (int j = 0; j < g; ++j) {
          const int qh = h * g + j;
          const float* qq = &q[(static_cast<std::size_t>(s) * Hq + qh) * D];
          std::vector<double> z(n);
          double m = -INFINITY;
          for (int i = 0; i < n; ++i) {
            double d = 0;
            for (int c = 0; c < D; ++c) d += static_cast<double>(qq[c]) * key(i, c);
            z[i] = d * scale;
            m = std::max(m, z[i]);
          }
          double sum = 0;
          for (auto& x : z) sum += (x = std::exp(x - m));
          for (int i = 0; i < n; ++i) {
            pr[i] += z[i] / sum;
            for (int c = 0; c < D; ++c)
              out[(static_cast<std::size_t>(s) * Hq + qh) * D + c] += z[i] / sum * val(i, c);
          }
        }
      }
  }
};

template <class T>
double tolerance() {
  return 2e-5;  // the inputs are exact in float; only the float accumulation differs
}

}  // namespace

// layout_rows_host reads full-precision rows through a layout; a KIVI layout's rows are packed codes,
// so it is refused at compile time (cache_rows_t picks kivi_layout_rows_host for it), as is the host
// pipeline over a KIVI cache.
template <class L>
concept has_layout_rows = requires { typename kvscout::layout_rows_host<L>; };
static_assert(has_layout_rows<kvscout::contiguous_layout<float, 64, kvscout::hnd>>);
static_assert(!has_layout_rows<kvscout::kivi_layout<kvscout::half, 64, 2>>);
static_assert(
    std::is_same_v<kvscout::detail::cache_rows_t<kvscout::kivi_layout<kvscout::half, 64, 2>>,
                   kvscout::kivi_layout_rows_host<kvscout::kivi_layout<kvscout::half, 64, 2>>>);
// current_token's memory space defaults to the host.
static_assert(std::is_same_v<kvscout::current_token<kvscout::half>,
                             kvscout::current_token<kvscout::half, kvscout::host_space>>);

TEMPLATE_TEST_CASE("dense decode attention matches the fp64 definition", "[attention]", float,
                   kvscout::half, kvscout::bfloat16, kvscout::fp8_e4m3, kvscout::fp8_e5m2) {
  for (int group : {1, 3, 8, 20}) {
    attn_fixture<TestType> f({1, 37, 200}, 2, group, 17u + group);
    CAPTURE(group);
    const float scale = 1.f / 8.f;
    std::vector<std::vector<int>> all(f.S * f.H);
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h)
        for (int t = 0; t < f.lens[s]; ++t) all[s * f.H + h].push_back(t);
    for (bool with_current : {false, true}) {
      std::vector<double> ref;
      std::vector<std::vector<double>> ref_probs;
      f.reference(all, with_current, scale, ref, ref_probs);
      std::vector<float> out(f.q.size(), -7.f);
      const int stride = f.cap + 1;
      std::vector<float> probs(static_cast<std::size_t>(f.S) * f.H * stride, -7.f);
      const auto cur = with_current ? f.current() : kvscout::current_token<TestType>{};
      kvscout::decode_attention_host(kvscout::layout_rows_host(f.view()), cur, {f.q.data(), f.q.size()},
                                     {out.data(), out.size()}, {f.Hq, scale},
                                     {probs.data(), probs.size()}, stride);
      double worst = 0;
      for (std::size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
      CAPTURE(with_current, worst);
      REQUIRE(worst <= tolerance<TestType>());
      for (int s = 0; s < f.S; ++s)
        for (int h = 0; h < f.H; ++h) {
          const auto& rp = ref_probs[s * f.H + h];
          double sum = 0;
          for (std::size_t i = 0; i < rp.size(); ++i) {
            REQUIRE(std::abs(probs[(s * f.H + h) * stride + i] - rp[i]) <= 1e-5);
            sum += probs[(s * f.H + h) * stride + i];
          }
          REQUIRE(std::abs(sum - group) <= 1e-4 * group);  // each query head's mass sums to 1
        }
      // fp64 accumulation is as close as the inputs allow.
      std::vector<float> out64(f.q.size());
      kvscout::decode_attention_host<double>(kvscout::layout_rows_host(f.view()), cur,
                                             {f.q.data(), f.q.size()}, {out64.data(), out64.size()},
                                             {f.Hq, scale});
      double worst64 = 0;
      for (std::size_t i = 0; i < out.size(); ++i) worst64 = std::max(worst64, std::abs(out64[i] - ref[i]));
      REQUIRE(worst64 <= 1e-6);
    }
  }
}

namespace {
// Dense attention with and without the current token and probabilities at head dim D, against
// the fp64 definition: the float path's channel loops have a tail past the last whole register
// (D = 12: past 8 and 16 floats; D = 40: past 16) or none (D = 128).
template <class T, int D>
void check_head_dim() {
  CAPTURE(D);
  attn_fixture<T, D> f({5, 16, 33, 100}, 2, 4, 31u + D);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<std::vector<int>> all(f.S * f.H);
  for (int s = 0; s < f.S; ++s)
    for (int h = 0; h < f.H; ++h)
      for (int t = 0; t < f.lens[s]; ++t) all[s * f.H + h].push_back(t);
  for (const bool with_current : {false, true}) {
    CAPTURE(with_current);
    std::vector<double> ref;
    std::vector<std::vector<double>> ref_probs;
    f.reference(all, with_current, scale, ref, ref_probs);
    const int stride = f.cap + 1;
    std::vector<float> out(f.q.size(), -7.f), probs(static_cast<std::size_t>(f.S) * f.H * stride);
    const auto cur = with_current ? f.current() : kvscout::current_token<T>{};
    kvscout::decode_attention_host(kvscout::layout_rows_host(f.view()), cur, {f.q.data(), f.q.size()},
                                   {out.data(), out.size()}, {f.Hq, scale},
                                   {probs.data(), probs.size()}, stride);
    double worst = 0, worst_p = 0;
    for (std::size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
    for (int r = 0; r < f.S * f.H; ++r)
      for (std::size_t i = 0; i < ref_probs[r].size(); ++i)
        worst_p = std::max(worst_p, std::abs(probs[r * stride + i] - ref_probs[r][i]));
    CAPTURE(worst, worst_p);
    REQUIRE(worst <= 2e-5);
    REQUIRE(worst_p <= 1e-5);
  }
}
}  // namespace

TEST_CASE("decode attention at head dims that are not a multiple of the vector width",
          "[attention]") {
  check_head_dim<float, 12>();
  check_head_dim<kvscout::half, 40>();
  check_head_dim<kvscout::bfloat16, 128>();
}

// A logit that overflows float (q . k past 3.4e38) makes its head's output NaN in the float path,
// never a finite wrong value; the fp64 reference, where it does not overflow, gives that row's V.
// The other kv head's outputs are untouched.
TEST_CASE("decode attention: an overflowing logit gives NaN, not a wrong value", "[attention]") {
  attn_fixture<float> f({40}, 2, 2, 77);
  const int row = 21;  // inside the second block of 16 rows
  for (int c = 0; c < f.D; ++c) {
    f.k[f.l.k_offset(0, row, 0) / sizeof(float) + c] = 1e30f;
  }
  for (int c = 0; c < f.D; ++c) f.q[c] = 1e10f;  // query head 0 (kv head 0)
  std::vector<float> out(f.q.size()), out64(f.q.size());
  const kvscout::attention_params p{f.Hq, 0.125f};
  kvscout::decode_attention_host(kvscout::layout_rows_host(f.view()), {}, {f.q.data(), f.q.size()},
                                 {out.data(), out.size()}, p);
  kvscout::decode_attention_host<double>(kvscout::layout_rows_host(f.view()), {},
                                         {f.q.data(), f.q.size()}, {out64.data(), out64.size()}, p);
  const int D = f.D;
  for (int c = 0; c < D; ++c) {
    REQUIRE(std::isnan(out[c]));
    REQUIRE(out64[c] == f.v[f.l.v_offset(0, row, 0) / sizeof(float) + c]);
  }
  // Query head 1 shares head 0's blocks of keys and logits: its logits are finite (about
  // +-1e31 against the big row), so it gets the reference's answer. Query heads 2 and 3: kv head 1.
  for (std::size_t i = D; i < out.size(); ++i) {
    REQUIRE(std::isfinite(out[i]));
    REQUIRE(std::abs(out[i] - out64[i]) <= 2e-5);
  }
}

TEST_CASE("decode attention split over a thread pool gives the bits it gives alone",
          "[attention][threads]") {
  // 3 sequences x 3 kv heads = 9 (sequence, kv head) pairs over pools of 2, 4 and 16 threads
  // (16: more threads than pairs, some get none); with and without the current token, with the
  // probabilities, and in place (out == q). Each pair is computed as without a pool.
  attn_fixture<kvscout::half> f({50, 9, 130}, 3, 3, 15);
  const kvscout::layout_rows_host<typename attn_fixture<kvscout::half>::layout> rows(f.view());
  const kvscout::attention_params p{f.Hq, 0.125f};
  const int stride = f.cap + 1;
  const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const bool with_current : {true, false}) {
    CAPTURE(with_current);
    const kvscout::current_token<kvscout::half> cur =
        with_current ? f.current() : kvscout::current_token<kvscout::half>{};
    // Probabilities past a row's count are not written: both buffers start at -1.
    std::vector<float> out1(f.q.size()), probs1(static_cast<std::size_t>(f.S) * f.H * stride, -1.f);
    kvscout::decode_attention_host(rows, cur, {f.q.data(), f.q.size()}, {out1.data(), out1.size()},
                                   p, {probs1.data(), probs1.size()}, stride);
    std::vector<float> plain1(f.q.size());
    kvscout::decode_attention_host(rows, cur, {f.q.data(), f.q.size()},
                                   {plain1.data(), plain1.size()}, p);
    for (int threads : {2, 4, 16}) {
      CAPTURE(threads);
      kvscout::thread_pool pool(threads);
      std::vector<float> out(f.q.size(), -1.f), probs(probs1.size(), -1.f);
      kvscout::decode_attention_host(rows, cur, {f.q.data(), f.q.size()}, {out.data(), out.size()},
                                     p, {probs.data(), probs.size()}, stride,
                                     kvscout::host_exec{&pool});
      REQUIRE(bits_equal(out, out1));
      REQUIRE(bits_equal(probs, probs1));
      std::vector<float> in_place = f.q;  // out == q
      kvscout::decode_attention_host(rows, cur, {in_place.data(), in_place.size()},
                                     {in_place.data(), in_place.size()}, p, {}, 0,
                                     kvscout::host_exec{&pool});
      REQUIRE(bits_equal(in_place, plain1));
    }
  }
}

TEMPLATE_TEST_CASE("sparse attention over gathered rows matches the definition on the subset",
                   "[attention]", float, kvscout::half, kvscout::fp8_e4m3) {
  using T = TestType;
  attn_fixture<T> f({50, 9, 130}, 3, 3, 5);
  const float scale = 0.125f;
  // A random ascending subset per (s, h), then gathered by the host executor.
  std::mt19937 rng(9);
  const int cap = f.cap;
  std::vector<int32_t> idx(static_cast<std::size_t>(f.S) * f.H * cap, -1), counts(f.S * f.H);
  std::vector<std::vector<int>> subset(f.S * f.H);
  for (int s = 0; s < f.S; ++s)
    for (int h = 0; h < f.H; ++h) {
      auto& ts = subset[s * f.H + h];
      for (int t = 0; t < f.lens[s]; ++t)
        if (rng() % 3 == 0) ts.push_back(t);
      counts[s * f.H + h] = static_cast<int32_t>(ts.size());
      std::copy(ts.begin(), ts.end(), idx.begin() + (s * f.H + h) * cap);
    }
  using layout = typename attn_fixture<T>::layout;
  kvscout::host_gather_config gc{{.num_seqs = f.S, .num_kv_heads = f.H}, cap, 1};
  auto ws = kvscout::make_workspace<kvscout::gather_executor_host<layout>>(gc);
  kvscout::gather_executor_host<layout> ex(gc, ws.span());
  std::vector<T> dk(idx.size() * 64), dv(dk.size());
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()}, {counts.data(), counts.size()}, f.S, f.H, cap};
  const kvscout::gather_destination<kvscout::host_space> dst{
      kvscout::as_writable_bytes(kvscout::host_span<T>(dk)),
      kvscout::as_writable_bytes(kvscout::host_span<T>(dv))};
  ex.submit(f.view(), sel, dst).wait();
  const kvscout::gathered_rows_host<T, 64> rows(sel, {dk.data(), dk.size()}, {dv.data(), dv.size()});
  {
    // The same rows read through the executor's own byte destination.
    const kvscout::gathered_rows_host<T, 64> same(sel, dst);
    float a[64], b[64];
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h)
        for (int i = 0; i < same.rows(s, h); ++i) {
          rows.load_v(s, h, i, a);
          same.load_v(s, h, i, b);
          REQUIRE(std::equal(a, a + 64, b));
        }
    if constexpr (alignof(T) > 1) {
      const kvscout::gather_destination<kvscout::host_space> off{dst.k.subspan(1, dst.k.size() - 1),
                                                                dst.v};
      REQUIRE_THROWS_WITH((kvscout::gathered_rows_host<T, 64>(sel, off)),
                          Catch::Contains("-byte aligned for their element type"));
    }
    const kvscout::gather_destination<kvscout::host_space> small{dst.k.subspan(0, sizeof(T) * 64),
                                                                 dst.v};
    REQUIRE_THROWS_WITH((kvscout::gathered_rows_host<T, 64>(sel, small)),
                        Catch::Contains("gathered K / V rows hold 64 / "));
    // The layout form takes T and head_dim from the cache's layout (a mismatch does not compile:
    // tests/compile_fail/gathered_rows_wrong_head_dim.cpp) and checks the selection's shape.
    const auto layout_of = f.view().layout;
    const kvscout::gathered_rows_host from_layout(layout_of, sel, dst);
    static_assert(std::is_same_v<std::remove_const_t<decltype(from_layout)>,
                                 kvscout::gathered_rows_host<T, 64>>);
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h) {
        REQUIRE(from_layout.rows(s, h) == rows.rows(s, h));
        for (int i = 0; i < rows.rows(s, h); ++i) {
          rows.load_k(s, h, i, a);
          from_layout.load_k(s, h, i, b);
          REQUIRE(std::equal(a, a + 64, b));
        }
      }
    auto fewer = sel;
    fewer.num_seqs = f.S - 1;
    REQUIRE_THROWS_WITH((kvscout::gathered_rows_host(layout_of, fewer, dst)),
                        Catch::Contains("selection shape [2, 3] differs from the layout's [3, 3]"));
  }
  std::vector<float> out(f.q.size());
  kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()}, {out.data(), out.size()},
                                 {f.Hq, scale});
  std::vector<double> ref;
  std::vector<std::vector<double>> rp;
  f.reference(subset, true, scale, ref, rp);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
  CAPTURE(worst);
  REQUIRE(worst <= 2e-5);
  for (int s = 0; s < f.S; ++s)
    for (int h = 0; h < f.H; ++h)
      for (int i = 0; i < counts[s * f.H + h]; ++i) REQUIRE(rows.token(s, h, i) == subset[s * f.H + h][i]);

  SECTION("every row selected: sparse equals dense exactly") {
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h) {
        counts[s * f.H + h] = f.lens[s];
        for (int t = 0; t < f.lens[s]; ++t) idx[(s * f.H + h) * cap + t] = t;
      }
    ex.submit(f.view(), sel,
              {kvscout::as_writable_bytes(kvscout::host_span<T>(dk.data(), dk.size())),
               kvscout::as_writable_bytes(kvscout::host_span<T>(dv.data(), dv.size()))})
        .wait();
    std::vector<float> sparse(f.q.size()), dense(f.q.size());
    kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()}, {sparse.data(), sparse.size()}, {f.Hq, scale});
    kvscout::decode_attention_host(kvscout::layout_rows_host(f.view()), f.current(), {f.q.data(), f.q.size()},
                                   {dense.data(), dense.size()}, {f.Hq, scale});
    REQUIRE(sparse == dense);
    // Without a current token, `{}` needs no element type (it defaults to the rows' own), and
    // gives the bits of an explicitly typed empty current token.
    std::vector<float> none(f.q.size()), typed(f.q.size());
    kvscout::decode_attention_host(rows, {}, {f.q.data(), f.q.size()}, {none.data(), none.size()},
                                   {f.Hq, scale});
    kvscout::decode_attention_host(rows, kvscout::current_token<T>{}, {f.q.data(), f.q.size()},
                                   {typed.data(), typed.size()}, {f.Hq, scale});
    REQUIRE(none == typed);
    REQUIRE(none != sparse);
  }
}

// An fp8 cache stores K / k_scale and V / v_scale; attention multiplies them back, for the cached
// rows and the current token alike. Scales that are not powers of two, so that a scale applied
// twice, to the wrong side, or not at all moves the output far past the tolerance.
TEMPLATE_TEST_CASE("attention over an fp8 cache applies k_scale and v_scale", "[attention][fp8]",
                   kvscout::fp8_e4m3, kvscout::fp8_e5m2) {
  using T = TestType;
  attn_fixture<T> f({3, 70, 129}, 2, 3, 23);
  const float scale = 0.125f, k_scale = 0.37f, v_scale = 2.7f;
  std::vector<std::vector<int>> all(f.S * f.H);
  for (int s = 0; s < f.S; ++s)
    for (int h = 0; h < f.H; ++h)
      for (int t = 0; t < f.lens[s]; ++t) all[s * f.H + h].push_back(t);
  std::vector<double> ref, unscaled;
  std::vector<std::vector<double>> rp, rp1;
  f.reference(all, true, scale, ref, rp, k_scale, v_scale);
  f.reference(all, true, scale, unscaled, rp1);
  const int stride = f.cap + 1;
  std::vector<float> out(f.q.size()), probs(static_cast<std::size_t>(f.S) * f.H * stride);
  kvscout::attention_params p{f.Hq, scale};
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  kvscout::decode_attention_host(kvscout::layout_rows_host(f.view()), f.current(),
                                 {f.q.data(), f.q.size()}, {out.data(), out.size()}, p,
                                 {probs.data(), probs.size()}, stride);
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, std::abs(out[i] - ref[i]));
    moved = std::max(moved, std::abs(ref[i] - unscaled[i]));
  }
  CAPTURE(worst, moved);
  REQUIRE(worst <= 5e-5);
  REQUIRE(moved > 0.5);  // the scales matter at this tolerance
  for (int r = 0; r < f.S * f.H; ++r)
    for (std::size_t i = 0; i < rp[r].size(); ++i)
      REQUIRE(std::abs(probs[r * stride + i] - rp[r][i]) <= 1e-5);
}

TEST_CASE("decode attention rejects bad input", "[attention][errors]") {
  attn_fixture<float> f({4}, 2, 2, 3);
  std::vector<float> out(f.q.size());
  const auto rows = kvscout::layout_rows_host(f.view());
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()},
                                                     {out.data(), out.size()}, {3, 0.1f}),
                      Catch::Contains("num_q_heads = 3 must be a positive multiple of num_kv_heads = 2"));
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size() - 1},
                                                     {out.data(), out.size()}, {4, 0.1f}),
                      Catch::Contains("q holds 255 floats"));
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()},
                                                     {out.data(), out.size()}, {4, -1.f}),
                      Catch::Contains("scale must be positive"));
  for (auto [ks, vs] : {std::pair{0.f, 1.f}, std::pair{1.f, -2.f},
                        std::pair{std::numeric_limits<float>::quiet_NaN(), 1.f},
                        std::pair{1.f, std::numeric_limits<float>::infinity()}}) {
    kvscout::attention_params p{4, 0.1f};
    p.k_scale = ks;
    p.v_scale = vs;
    CAPTURE(ks, vs);
    REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()},
                                                       {out.data(), out.size()}, p),
                        Catch::Contains("k_scale and v_scale must be positive and finite"));
  }
  {
    kvscout::attention_params p{4, 1e30f};
    p.k_scale = 1e20f;  // each finite, the product not
    REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()},
                                                       {out.data(), out.size()}, p),
                        Catch::Contains("scale * k_scale = 1e+30 * 1e+20 must be positive"));
  }
  std::vector<float> probs(100);
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, f.current(), {f.q.data(), f.q.size()},
                                                     {out.data(), out.size()}, {4, 0.1f},
                                                     {probs.data(), probs.size()}, 4),
                      Catch::Contains("probs_stride = 4 is smaller than the longest row set (5)"));
}
