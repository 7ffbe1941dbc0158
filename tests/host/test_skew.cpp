// skew/: calibration (SVD skew, channel and RoPE-plane selection, union with keys, GQA groups),
// partial keys and partial queries in each RoPE mode, against naive fp64 references on seeded
// random data (never zeros; biases non-zero everywhere), plus the errors for bad input.
//
// Dot products of random vectors can sit near zero, so score errors are measured relative to
// |q| |k| (the scale of the terms), not to the score itself.

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kvscout/skew/calibrate.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"
#include "random_orthogonal.hpp"

namespace {

using kvscout::rope_mode;
using kvscout::rope_style;

constexpr float poison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> normal_vec(std::size_t n, std::mt19937& rng, double sigma = 1.0,
                              double mean = 0.0) {
  std::normal_distribution<double> dist(mean, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

double dot64(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}
double dot64(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float dot32(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
template <class T>
double norm64(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

/// fp64 RoPE of a full head vector at pos.
void rope64(std::vector<double>& x, int pos, const kvscout::rope_config& c) {
  for (int j = 0; j < c.head_dim / 2; ++j) {
    const kvscout::detail::rope_plane p = kvscout::detail::rope_plane_channels(c, j);
    const double ang = kvscout::detail::rope_angle(c, j, pos);
    const double a = x[p.a], b = x[p.b];
    x[p.a] = a * std::cos(ang) - b * std::sin(ang);
    x[p.b] = a * std::sin(ang) + b * std::cos(ang);
  }
}

/// fp64 q = W_h x + b_h for query head h; W [heads * D, d_model], b [heads * D] or empty.
std::vector<double> project64(const std::vector<float>& W, const std::vector<float>& b,
                              const float* x, int d_model, int D, int h) {
  std::vector<double> q(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d) {
    const std::size_t row = static_cast<std::size_t>(h) * D + d;
    q[d] = dot64(W.data() + row * d_model, x, d_model) + (b.empty() ? 0.0 : b[row]);
  }
  return q;
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

/// fp64 (v A)[:, S] with the plan's (float) A.
std::vector<double> skew64(const kvscout::skew_plan& p, const std::vector<double>& v) {
  std::vector<double> out(static_cast<std::size_t>(p.r), 0.0);
  for (int i = 0; i < p.r; ++i)
    for (int d = 0; d < p.head_dim; ++d)
      out[i] += v[d] * static_cast<double>(p.A[static_cast<std::size_t>(d) * p.head_dim +
                                               p.channels[i]]);
  return out;
}

/// Column sums of |X A| over the rows of X [rows, D], fp64 from the plan's float A.
std::vector<double> skewed_abs_sums(const kvscout::skew_plan& p, const std::vector<float>& X) {
  const int D = p.head_dim;
  const std::size_t rows = X.size() / D;
  std::vector<double> s(static_cast<std::size_t>(D), 0.0);
  for (std::size_t row = 0; row < rows; ++row)
    for (int j = 0; j < D; ++j) {
      double acc = 0;
      for (int d = 0; d < D; ++d)
        acc += static_cast<double>(X[row * D + d]) * p.A[static_cast<std::size_t>(d) * D + j];
      s[j] += std::abs(acc);
    }
  return s;
}

std::vector<int> rank_desc(const std::vector<double>& s) {
  std::vector<int> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] > s[b]; });
  return idx;
}

/// Channel sets must be the top-r by score; a swap is accepted only between (near-)tied scores.
void check_top_set(const std::vector<int>& chosen, const std::vector<double>& score, int r) {
  REQUIRE(static_cast<int>(chosen.size()) == r);
  REQUIRE(std::is_sorted(chosen.begin(), chosen.end()));
  REQUIRE(std::adjacent_find(chosen.begin(), chosen.end()) == chosen.end());
  const std::set<int> in(chosen.begin(), chosen.end());
  double min_in = std::numeric_limits<double>::infinity(), max_out = -1;
  for (int j = 0; j < static_cast<int>(score.size()); ++j) {
    if (in.count(j))
      min_in = std::min(min_in, score[j]);
    else
      max_out = std::max(max_out, score[j]);
  }
  CAPTURE(min_in, max_out);
  REQUIRE(min_in >= max_out * (1 - 1e-6));
}

kvscout::skew_plan calibrate(const std::vector<float>& q, const std::vector<float>& k, int n,
                             int g, int D, const kvscout::skew_options& o) {
  return kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, o);
}

/// Queries whose channels have very different scales, so the selection is not arbitrary.
std::vector<float> scaled_samples(std::size_t rows, int D, std::mt19937& rng) {
  std::vector<float> v = normal_vec(rows * D, rng);
  std::vector<float> scale = normal_vec(static_cast<std::size_t>(D), rng, 1.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) v[r * D + d] = v[r * D + d] * (0.2f + std::abs(scale[d])) + 0.1f;
  return v;
}

}  // namespace

TEST_CASE("default_partial_dim: head_dim / 4 up to a multiple of 8, at most head_dim",
          "[skew]") {
  CHECK(kvscout::detail::default_partial_dim(64) == 16);
  CHECK(kvscout::detail::default_partial_dim(128) == 32);
  CHECK(kvscout::detail::default_partial_dim(256) == 64);
  CHECK(kvscout::detail::default_partial_dim(96) == 24);
  CHECK(kvscout::detail::default_partial_dim(40) == 16);  // 10 -> 16
  CHECK(kvscout::detail::default_partial_dim(8) == 8);
  CHECK(kvscout::detail::default_partial_dim(6) == 6);  // capped at head_dim
  CHECK_THROWS_WITH(kvscout::detail::default_partial_dim(0), Catch::Contains("got 0"));

  // calibrate_skew uses it when opts.r == 0.
  std::mt19937 rng(1);
  for (int D : {64, 128, 256}) {
    CAPTURE(D);
    const auto q = normal_vec(static_cast<std::size_t>(16) * D, rng);
    const auto k = normal_vec(static_cast<std::size_t>(16) * D, rng);
    for (auto mode : {rope_mode::post_rope_skew, rope_mode::rope_planes,
                      rope_mode::pre_rope_folded}) {
      const auto p = calibrate(q, k, 16, 1, D, {.mode = mode});
      CHECK(p.r == D / 4);
      CHECK(p.channels.size() == static_cast<std::size_t>(D / 4));
    }
  }
}

TEST_CASE("A is orthogonal and skewing preserves q . k", "[skew]") {
  const int D = GENERATE(64, 128);
  const int g = GENERATE(1, 3, 8);
  // n * g < D gives a rank-deficient Q: V must still be a full orthogonal basis.
  const int n = GENERATE(5, 96);
  CAPTURE(D, g, n);
  std::mt19937 rng(static_cast<unsigned>(D * 100 + g * 10 + n));
  const auto q = scaled_samples(static_cast<std::size_t>(n) * g, D, rng);
  const auto k = normal_vec(static_cast<std::size_t>(n) * D, rng, 1.0, 0.3);
  const auto p = calibrate(q, k, n, g, D, {.r = D, .mode = rope_mode::pre_rope_folded});
  REQUIRE(p.A.size() == static_cast<std::size_t>(D) * D);

  double worst_aat = 0, worst_ata = 0;
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      double aat = 0, ata = 0;
      for (int t = 0; t < D; ++t) {
        aat += static_cast<double>(p.A[i * D + t]) * p.A[j * D + t];
        ata += static_cast<double>(p.A[t * D + i]) * p.A[t * D + j];
      }
      worst_aat = std::max(worst_aat, std::abs(aat - (i == j)));
      worst_ata = std::max(worst_ata, std::abs(ata - (i == j)));
    }
  CAPTURE(worst_aat, worst_ata);
  CHECK(worst_aat < 1e-6);
  CHECK(worst_ata < 1e-6);

  // (qA) . (kA) in fp32 (project_key with r = D is the full skewed vector) vs fp64 q . k.
  double worst_scale = 0, worst_rel = 0;
  std::vector<float> qa(static_cast<std::size_t>(D), poison), ka(qa);
  for (int t = 0; t < 200; ++t) {
    const auto qq = normal_vec(static_cast<std::size_t>(D), rng, 1.0, 0.2);
    auto kk = normal_vec(static_cast<std::size_t>(D), rng);
    if (t % 2 == 1)  // correlated pairs: q . k is of the order of |q| |k|
      for (int d = 0; d < D; ++d) kk[d] = qq[d] + 0.3f * kk[d];
    kvscout::project_key(p, qq.data(), qa.data());
    kvscout::project_key(p, kk.data(), ka.data());
    const double ref = dot64(qq.data(), kk.data(), D);
    const double err = std::abs(dot32(qa.data(), ka.data(), D) - ref);
    worst_scale = std::max(worst_scale, err / (norm64(qq) * norm64(kk)));
    if (t % 2 == 1) worst_rel = std::max(worst_rel, err / std::abs(ref));
  }
  CAPTURE(worst_scale, worst_rel);
  CHECK(worst_scale < 1e-5);
  CHECK(worst_rel < 1e-5);
}

TEST_CASE("channels are the r largest column sums of |qA|, ascending, with GQA rows stacked",
          "[skew]") {
  const int g = GENERATE(1, 3, 8);
  const auto mode = GENERATE(rope_mode::post_rope_skew, rope_mode::pre_rope_folded);
  const int D = 64, n = 40;
  const int r = GENERATE(5, 16, 64);
  CAPTURE(g, r, static_cast<int>(mode));
  std::mt19937 rng(static_cast<unsigned>(7 + g + r));
  const auto q = scaled_samples(static_cast<std::size_t>(n) * g, D, rng);
  const auto k = normal_vec(static_cast<std::size_t>(n) * D, rng);
  const auto p = calibrate(q, k, n, g, D, {.r = r, .mode = mode});
  CHECK(p.mode == mode);
  CHECK(p.head_dim == D);
  CHECK(p.r == r);
  CHECK(p.planes.empty());
  check_top_set(p.channels, skewed_abs_sums(p, q), r);

  // [n, g, D] is n * g rows of one matrix: the same rows as n * g samples of group 1 give the
  // same plan, bit for bit (keys do not enter without union_with_keys).
  const auto k_rows = normal_vec(static_cast<std::size_t>(n) * g * D, rng);
  const auto p1 = calibrate(q, k_rows, n * g, 1, D, {.r = r, .mode = mode});
  CHECK(p1.A == p.A);
  CHECK(p1.channels == p.channels);
}

TEST_CASE("union_with_keys: first r distinct of q_1, k_1, q_2, k_2, ...", "[skew]") {
  SECTION("rope_planes, constructed rankings") {
    // D = 16: 8 planes. q's plane norms fall with the plane index, k's rise.
    const int D = 16, n = 4;
    const auto style = GENERATE(rope_style::split_half, rope_style::interleaved);
    const kvscout::rope_config rope{.head_dim = D, .theta = 10000.f, .style = style};
    std::vector<float> q(static_cast<std::size_t>(n) * D), k(q.size()), k2(q.size());
    for (int s = 0; s < n; ++s)
      for (int j = 0; j < D / 2; ++j) {
        const auto pl = kvscout::detail::rope_plane_channels(rope, j);
        const float qa = static_cast<float>(8 - j) * (1.f + 0.1f * static_cast<float>(s));
        const float ka = static_cast<float>(1 + j) * (1.f + 0.05f * static_cast<float>(s));
        q[s * D + pl.a] = qa;
        q[s * D + pl.b] = -0.5f * qa;
        k[s * D + pl.a] = 0.7f * ka;
        k[s * D + pl.b] = ka;
        // k2 ranks planes 0, 2, 1, 3, ...: first choice coincides with q's.
        const float k2a = j == 0 ? 10.f : j == 1 ? 8.f : j == 2 ? 9.f : 1.f / static_cast<float>(j);
        k2[s * D + pl.a] = k2a;
        k2[s * D + pl.b] = 0.25f;
      }
    const auto planes = [&](const std::vector<float>& keys, int r, bool u) {
      return calibrate(q, keys, n, 1, D,
                       {.r = r, .union_with_keys = u, .mode = rope_mode::rope_planes, .rope = rope})
          .planes;
    };
    CHECK(planes(k, 4, false) == std::vector<int>{0, 1});
    CHECK(planes(k, 4, true) == std::vector<int>{0, 7});
    CHECK(planes(k, 8, false) == std::vector<int>{0, 1, 2, 3});
    CHECK(planes(k, 8, true) == std::vector<int>{0, 1, 6, 7});
    CHECK(planes(k, 6, true) == std::vector<int>{0, 1, 7});  // q1, k1, q2
    // Duplicates are skipped: q1 = k1 = plane 0, then q2 = 1, k2 = 2.
    CHECK(planes(k2, 6, true) == std::vector<int>{0, 1, 2});
    CHECK(planes(k2, 16, true) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  }
  SECTION("skew modes, against the naive rankings") {
    const int D = 64, n = 48, g = 3;
    std::mt19937 rng(99);
    const auto q = scaled_samples(static_cast<std::size_t>(n) * g, D, rng);
    const auto k = scaled_samples(static_cast<std::size_t>(n), D, rng);
    for (int r : {8, 16, 33}) {
      CAPTURE(r);
      const auto p = calibrate(q, k, n, g, D, {.r = r, .union_with_keys = true});
      const auto qr = rank_desc(skewed_abs_sums(p, q));
      const auto kr = rank_desc(skewed_abs_sums(p, k));
      std::vector<int> expect;
      for (int t = 0; static_cast<int>(expect.size()) < r; ++t)
        for (int c : {qr[t], kr[t]})
          if (static_cast<int>(expect.size()) < r &&
              std::find(expect.begin(), expect.end(), c) == expect.end())
            expect.push_back(c);
      std::sort(expect.begin(), expect.end());
      CHECK(p.r == r);
      CHECK(p.channels == expect);
      // The keys changed the choice: some key-ranked channel is not among the query top-r.
      const auto q_only = calibrate(q, k, n, g, D, {.r = r}).channels;
      CHECK(q_only != p.channels);
    }
  }
}

TEST_CASE("calibrate_skew and make_partial_query_weights reject bad input, naming the value",
          "[skew]") {
  const int D = 64, n = 8, g = 2;
  std::mt19937 rng(3);
  const auto q = normal_vec(static_cast<std::size_t>(n) * g * D, rng);
  const auto k = normal_vec(static_cast<std::size_t>(n) * D, rng);
  using kvscout::error;
  const auto cal = [&](const std::vector<float>& qq, const std::vector<float>& kk, int nn, int gg,
                       int dd, kvscout::skew_options o) { return calibrate(qq, kk, nn, gg, dd, o); };

  CHECK_THROWS_WITH(cal(q, k, n, g, D, {.r = -1}), Catch::Contains("got r = -1"));
  CHECK_THROWS_WITH(cal(q, k, n, g, D, {.r = 65}), Catch::Contains("r = 65 exceeds head_dim = 64"));
  CHECK_THROWS_WITH(cal(q, k, n, g, D, {.r = 15, .mode = rope_mode::rope_planes}),
                    Catch::Contains("r must be even, got r = 15"));
  CHECK_NOTHROW(cal(q, k, n, g, D, {.r = 15, .mode = rope_mode::post_rope_skew}));
  CHECK_THROWS_WITH(cal(q, k, 0, g, D, {}), Catch::Contains("n = 0"));
  CHECK_THROWS_WITH(cal(q, k, n, 0, D, {}), Catch::Contains("group = 0"));
  CHECK_THROWS_WITH(cal(q, k, n, g, 0, {}), Catch::Contains("got 0"));
  CHECK_THROWS_WITH(cal(q, k, n, 3, D, {}), Catch::Contains("q_samples has 1024 elements"));
  CHECK_THROWS_WITH(cal(q, q, n, g, D, {}), Catch::Contains("k_samples has 1024 elements"));
  CHECK_THROWS_WITH(cal(q, k, n, g, D, {.rope = {.head_dim = 128}}),
                    Catch::Contains("opts.rope.head_dim = 128"));
  CHECK_THROWS_WITH(cal(q, k, n, g, D, {.rope = {.head_dim = 0, .theta = -1.f}}),
                    Catch::Contains("got -1"));
  {
    const auto q63 = normal_vec(static_cast<std::size_t>(n) * g * 63, rng);
    const auto k63 = normal_vec(static_cast<std::size_t>(n) * 63, rng);
    CHECK_THROWS_WITH(cal(q63, k63, n, g, 63, {}), Catch::Contains("even head_dim, got 63"));
    CHECK_NOTHROW(cal(q63, k63, n, g, 63, {.mode = rope_mode::pre_rope_folded}));
  }
  {
    auto bad = q;
    bad[static_cast<std::size_t>(3) * g * D + 1 * D + 5] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(cal(bad, k, n, g, D, {}),
                      Catch::Contains("nan at sample 3, head 1, channel 5"));
    auto badk = k;
    badk[2 * D + 7] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(cal(q, badk, n, g, D, {}), Catch::Contains("inf at sample 2, channel 7"));
  }

  const auto p = cal(q, k, n, g, D, {});
  const int d_model = 24, heads = 4;
  const auto W = normal_vec(static_cast<std::size_t>(heads) * D * d_model, rng);
  const auto b = normal_vec(static_cast<std::size_t>(heads) * D, rng);
  const auto mk = [&](std::size_t w_size, std::size_t b_size, int dm, int qh) {
    return kvscout::make_partial_query_weights(p, {W.data(), w_size}, {b.data(), b_size}, dm, qh);
  };
  CHECK_NOTHROW(mk(W.size(), b.size(), d_model, 3));
  CHECK_NOTHROW(mk(W.size(), 0, d_model, 0));
  CHECK_THROWS_WITH(mk(W.size(), b.size(), d_model, 4), Catch::Contains("q_head 4 out of range"));
  CHECK_THROWS_WITH(mk(W.size(), b.size(), d_model, -1), Catch::Contains("q_head -1"));
  CHECK_THROWS_WITH(mk(W.size() - 1, b.size(), d_model, 0), Catch::Contains("W_Q has 6143"));
  CHECK_THROWS_WITH(mk(W.size(), b.size() - 1, d_model, 0), Catch::Contains("b_Q has 255"));
  CHECK_THROWS_WITH(mk(W.size(), b.size(), 0, 0), Catch::Contains("d_model must be positive"));
  auto broken = p;
  broken.channels.pop_back();
  CHECK_THROWS_WITH(kvscout::make_partial_query_weights(broken, {W.data(), W.size()}, {}, d_model, 0),
                    Catch::Contains("channels, expected r = 16"));
}

TEST_CASE("skew helps: low-rank queries rank tokens much better in the skewed basis", "[skew]") {
  // Queries: rank-4 structure (random D x 4 basis times N(0, 1) coefficients) plus small noise,
  // in a random rotation, so every raw channel carries a similar share of the energy.
  // Keys: isotropic. True scores q . k over N tokens; partial scores over r = D / 4 channels,
  // either the skewed channels of the plan or the r raw channels with the largest sum |q|
  // (InfiniGen's selection without the skew).
  const int D = 128, r = D / 4, rank = 4, n_cal = 512, n_eval = 64, N = 1000, top = N / 10;
  const int g = GENERATE(1, 3);
  CAPTURE(g);
  std::mt19937 rng(2024);
  const auto basis = normal_vec(static_cast<std::size_t>(D) * rank, rng);  // [D, rank]
  const auto R = kvtest::random_orthogonal_fp64(D, rng);  // columns orthonormal, fp64
  const auto sample_query = [&](float* out) {
    std::normal_distribution<double> nd;
    std::vector<double> v(static_cast<std::size_t>(D));
    double c[rank];
    for (double& x : c) x = nd(rng);
    for (int d = 0; d < D; ++d) {
      v[d] = 0.05 * nd(rng);
      for (int t = 0; t < rank; ++t) v[d] += basis[d * rank + t] * c[t];
    }
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int e = 0; e < D; ++e) acc += R[d * D + e] * v[e];
      out[d] = static_cast<float>(acc);
    }
  };
  std::vector<float> qcal(static_cast<std::size_t>(n_cal) * g * D);
  for (std::size_t row = 0; row < qcal.size() / D; ++row) sample_query(qcal.data() + row * D);
  const auto kcal = normal_vec(static_cast<std::size_t>(n_cal) * D, rng);
  const auto p = calibrate(qcal, kcal, n_cal, g, D, {.r = r, .mode = rope_mode::pre_rope_folded});

  std::vector<double> raw_sum(static_cast<std::size_t>(D), 0.0);
  for (std::size_t i = 0; i < qcal.size(); ++i) raw_sum[i % D] += std::abs(qcal[i]);
  std::vector<int> raw = rank_desc(raw_sum);
  raw.resize(r);

  const auto keys = normal_vec(static_cast<std::size_t>(N) * D, rng);
  std::vector<float> pkeys(static_cast<std::size_t>(N) * r, poison);
  for (int t = 0; t < N; ++t) kvscout::project_key(p, keys.data() + t * D, pkeys.data() + t * r);

  const auto recall = [&](const std::vector<double>& truth, const std::vector<double>& approx) {
    const auto a = rank_desc(truth), b = rank_desc(approx);
    const std::set<int> want(a.begin(), a.begin() + top);
    int hit = 0;
    for (int i = 0; i < top; ++i) hit += static_cast<int>(want.count(b[i]));
    return static_cast<double>(hit) / top;
  };
  double recall_skew = 0, recall_raw = 0;
  std::vector<float> q(static_cast<std::size_t>(D)), qp(static_cast<std::size_t>(r), poison);
  std::vector<double> truth(static_cast<std::size_t>(N)), s_skew(truth), s_raw(truth);
  for (int e = 0; e < n_eval; ++e) {
    sample_query(q.data());
    kvscout::project_key(p, q.data(), qp.data());  // the partial query is the same projection
    for (int t = 0; t < N; ++t) {
      const float* kt = keys.data() + t * D;
      truth[t] = dot64(q.data(), kt, D);
      s_skew[t] = dot32(qp.data(), pkeys.data() + t * r, r);
      double sr = 0;
      for (int c : raw) sr += static_cast<double>(q[c]) * kt[c];
      s_raw[t] = sr;
    }
    recall_skew += recall(truth, s_skew) / n_eval;
    recall_raw += recall(truth, s_raw) / n_eval;
  }
  INFO("top-10% recall with r = " << r << " of D = " << D << ": skewed " << recall_skew
                                  << ", raw channels " << recall_raw);
  CAPTURE(recall_skew, recall_raw);
  CHECK(recall_skew >= 0.9);
  CHECK(recall_skew >= recall_raw + 0.3);
}

TEST_CASE("post_rope_skew: partial query = (RoPE(Wx + b)) A_S, and r = D gives the full RoPE'd q . k",
          "[skew]") {
  const auto style = GENERATE(rope_style::split_half, rope_style::interleaved);
  const int D = 64, d_model = 48, g = 3, n = 64;
  CAPTURE(static_cast<int>(style));
  const kvscout::rope_config rope{.head_dim = D, .theta = 10000.f, .style = style};
  std::mt19937 rng(11 + static_cast<unsigned>(style));
  // W_Q [g * D, d_model] for the g query heads of kv head 0, W_K [D, d_model]; non-zero biases.
  const auto WQ = normal_vec(static_cast<std::size_t>(g) * D * d_model, rng, 0.2);
  const auto bQ = normal_vec(static_cast<std::size_t>(g) * D, rng, 0.5, 0.1);
  const auto WK = normal_vec(static_cast<std::size_t>(D) * d_model, rng, 0.2);
  const auto bK = normal_vec(static_cast<std::size_t>(D), rng, 0.5, -0.1);
  std::uniform_int_distribution<int> posd(0, 4000);

  // RoPE'd samples, [n, g, D] and [n, D].
  std::vector<float> qs(static_cast<std::size_t>(n) * g * D), ks(static_cast<std::size_t>(n) * D);
  for (int s = 0; s < n; ++s) {
    const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.2);
    const int pos = posd(rng);
    for (int h = 0; h < g; ++h) {
      auto q = project64(WQ, bQ, x.data(), d_model, D, h);
      rope64(q, pos, rope);
      std::copy(q.begin(), q.end(), qs.begin() + (static_cast<std::ptrdiff_t>(s) * g + h) * D);
    }
    auto kk = project64(WK, bK, x.data(), d_model, D, 0);
    rope64(kk, pos, rope);
    std::copy(kk.begin(), kk.end(), ks.begin() + static_cast<std::ptrdiff_t>(s) * D);
  }

  for (int r : {0, D}) {
    const auto p = calibrate(qs, ks, n, g, D, {.r = r, .mode = rope_mode::post_rope_skew, .rope = rope});
    CAPTURE(p.r);
    REQUIRE(p.rope.head_dim == D);
    std::vector<float> qp(static_cast<std::size_t>(p.r)), pk(qp);
    double worst_q = 0, worst_score = 0;
    for (int h = 0; h < g; ++h) {
      const auto w = kvscout::make_partial_query_weights(p, {WQ.data(), WQ.size()},
                                                         {bQ.data(), bQ.size()}, d_model, h);
      CHECK(w.rows() == D);
      for (int t = 0; t < 6; ++t) {
        const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.2);
        const auto xk = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.2);
        const int pq = posd(rng), pkp = posd(rng);
        std::fill(qp.begin(), qp.end(), poison);
        kvscout::partial_query(w, x.data(), pq, qp.data());
        auto q64 = project64(WQ, bQ, x.data(), d_model, D, h);
        rope64(q64, pq, rope);
        const auto ref = skew64(p, q64);
        for (int i = 0; i < p.r; ++i)
          worst_q = std::max(worst_q, std::abs(qp[i] - ref[i]) / norm64(q64));
        // The key as the model caches it: projected in fp32 and RoPE'd at its position.
        auto k32 = to_float(project64(WK, bK, xk.data(), d_model, D, 0));
        kvscout::apply_rope(k32.data(), pkp, rope);
        std::fill(pk.begin(), pk.end(), poison);
        kvscout::project_key(p, k32.data(), pk.data());
        if (p.r == D) {
          auto k64 = project64(WK, bK, xk.data(), d_model, D, 0);
          rope64(k64, pkp, rope);
          const double full = dot64(q64.data(), k64.data(), D);
          worst_score = std::max(worst_score, std::abs(dot32(qp.data(), pk.data(), p.r) - full) /
                                                  (norm64(q64) * norm64(k64)));
        }
      }
    }
    CAPTURE(worst_q, worst_score);
    CHECK(worst_q < 1e-5);
    CHECK(worst_score < 1e-4);
  }
}

TEST_CASE("rope_planes: the partial score is exactly the selected planes' share of q . k",
          "[skew]") {
  const auto style = GENERATE(rope_style::split_half, rope_style::interleaved);
  const int D = 64, d_model = 40, g = 2, n = 50;
  CAPTURE(static_cast<int>(style));
  const kvscout::rope_config rope{.head_dim = D, .theta = 10000.f, .style = style};
  std::mt19937 rng(21 + static_cast<unsigned>(style));
  // Rows of W_Q scaled per plane, so plane norms differ clearly; non-zero biases.
  auto WQ = normal_vec(static_cast<std::size_t>(g) * D * d_model, rng, 0.2);
  const auto plane_scale = normal_vec(static_cast<std::size_t>(D / 2), rng);
  for (int h = 0; h < g; ++h)
    for (int d = 0; d < D; ++d)
      for (int i = 0; i < d_model; ++i)
        WQ[(static_cast<std::size_t>(h) * D + d) * d_model + i] *=
            0.1f + std::abs(plane_scale[kvscout::detail::rope_plane_of(rope, d)]);
  const auto bQ = normal_vec(static_cast<std::size_t>(g) * D, rng, 0.3, 0.1);
  std::uniform_int_distribution<int> posd(0, 8000);

  // Samples un-rotated and RoPE'd: the same planes must come out.
  std::vector<float> q_pre(static_cast<std::size_t>(n) * g * D), q_post(q_pre.size());
  for (int s = 0; s < n; ++s) {
    const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.1);
    const int pos = posd(rng);
    for (int h = 0; h < g; ++h) {
      auto q = project64(WQ, bQ, x.data(), d_model, D, h);
      const std::ptrdiff_t at = (static_cast<std::ptrdiff_t>(s) * g + h) * D;
      std::copy(q.begin(), q.end(), q_pre.begin() + at);
      rope64(q, pos, rope);
      std::copy(q.begin(), q.end(), q_post.begin() + at);
    }
  }
  const auto k_s = normal_vec(static_cast<std::size_t>(n) * D, rng);

  // Naive plane ranking over the un-rotated samples.
  std::vector<double> plane_norm(static_cast<std::size_t>(D / 2), 0.0);
  for (std::size_t row = 0; row < q_pre.size() / D; ++row)
    for (int j = 0; j < D / 2; ++j) {
      const auto pl = kvscout::detail::rope_plane_channels(rope, j);
      plane_norm[j] += std::hypot(static_cast<double>(q_pre[row * D + pl.a]),
                                  static_cast<double>(q_pre[row * D + pl.b]));
    }

  for (int r : {16, 0, D}) {
    const kvscout::skew_options o{.r = r, .mode = rope_mode::rope_planes, .rope = rope};
    const auto p = calibrate(q_pre, k_s, n, g, D, o);
    const auto p_post = calibrate(q_post, k_s, n, g, D, o);
    CAPTURE(p.r);
    CHECK(p.planes == p_post.planes);
    check_top_set(p.planes, plane_norm, p.r / 2);
    // channels: (a, b) of each plane in order; A = identity.
    REQUIRE(p.channels.size() == static_cast<std::size_t>(p.r));
    for (std::size_t i = 0; i < p.planes.size(); ++i) {
      const auto pl = kvscout::detail::rope_plane_channels(rope, p.planes[i]);
      CHECK(p.channels[2 * i] == pl.a);
      CHECK(p.channels[2 * i + 1] == pl.b);
    }
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) REQUIRE(p.A[i * D + j] == (i == j ? 1.f : 0.f));

    std::vector<float> qp(static_cast<std::size_t>(p.r)), pk(qp);
    double worst_q = 0, worst_score = 0;
    for (int h = 0; h < g; ++h) {
      const auto w = kvscout::make_partial_query_weights(p, {WQ.data(), WQ.size()},
                                                         {bQ.data(), bQ.size()}, d_model, h);
      CHECK(w.rows() == p.r);
      for (int t = 0; t < 8; ++t) {
        const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.1);
        const auto k_raw = normal_vec(static_cast<std::size_t>(D), rng, 1.0, 0.2);
        const int pq = posd(rng), pkp = t == 0 ? pq : posd(rng);
        std::fill(qp.begin(), qp.end(), poison);
        kvscout::partial_query(w, x.data(), pq, qp.data());
        auto k32 = k_raw;
        kvscout::apply_rope(k32.data(), pkp, rope);
        std::fill(pk.begin(), pk.end(), poison);
        kvscout::project_key(p, k32.data(), pk.data());

        auto q64 = project64(WQ, bQ, x.data(), d_model, D, h);
        rope64(q64, pq, rope);
        std::vector<double> k64(k_raw.begin(), k_raw.end());
        rope64(k64, pkp, rope);
        double ref = 0;  // selected planes' contributions to the RoPE'd q . k
        for (int j : p.planes) {
          const auto pl = kvscout::detail::rope_plane_channels(rope, j);
          ref += q64[pl.a] * k64[pl.a] + q64[pl.b] * k64[pl.b];
        }
        for (int i = 0; i < p.r; ++i)
          worst_q = std::max(worst_q, std::abs(qp[i] - q64[p.channels[i]]) / norm64(q64));
        const double scale = norm64(q64) * norm64(k64);
        worst_score =
            std::max(worst_score, std::abs(dot32(qp.data(), pk.data(), p.r) - ref) / scale);
        if (p.r == D)  // all planes: the full RoPE'd score
          CHECK(std::abs(ref - dot64(q64.data(), k64.data(), D)) < 1e-12 * scale);
      }
    }
    CAPTURE(worst_q, worst_score);
    CHECK(worst_q < 1e-5);
    CHECK(worst_score < 1e-5);
  }
}

TEST_CASE("pre_rope_folded: partial query = (Wx + b) A_S from folded weights, and r = D gives q . k",
          "[skew]") {
  const int D = GENERATE(64, 24);
  const int d_model = 56, g = 2, n = 60;
  CAPTURE(D);
  std::mt19937 rng(31 + static_cast<unsigned>(D));
  const auto WQ = normal_vec(static_cast<std::size_t>(g) * D * d_model, rng, 0.2);
  const auto bQ = normal_vec(static_cast<std::size_t>(g) * D, rng, 0.5, 0.2);
  const auto WK = normal_vec(static_cast<std::size_t>(D) * d_model, rng, 0.2);
  const auto bK = normal_vec(static_cast<std::size_t>(D), rng, 0.5, -0.1);
  std::vector<float> qs(static_cast<std::size_t>(n) * g * D), ks(static_cast<std::size_t>(n) * D);
  for (int s = 0; s < n; ++s) {
    const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.1);
    for (int h = 0; h < g; ++h) {
      const auto q = project64(WQ, bQ, x.data(), d_model, D, h);
      std::copy(q.begin(), q.end(), qs.begin() + (static_cast<std::ptrdiff_t>(s) * g + h) * D);
    }
    const auto kk = project64(WK, bK, x.data(), d_model, D, 0);
    std::copy(kk.begin(), kk.end(), ks.begin() + static_cast<std::ptrdiff_t>(s) * D);
  }

  for (int r : {0, 7, D}) {
    const auto p = calibrate(qs, ks, n, g, D, {.r = r, .mode = rope_mode::pre_rope_folded});
    CAPTURE(p.r);
    std::vector<float> qp(static_cast<std::size_t>(p.r)), qp2(qp), pk(qp);
    double worst_q = 0, worst_nobias = 0, worst_score = 0;
    const std::vector<float> no_bias;
    for (int h = 0; h < g; ++h) {
      const auto w = kvscout::make_partial_query_weights(p, {WQ.data(), WQ.size()},
                                                         {bQ.data(), bQ.size()}, d_model, h);
      const auto w0 = kvscout::make_partial_query_weights(p, {WQ.data(), WQ.size()}, {}, d_model, h);
      CHECK(w.rows() == p.r);
      CHECK(w.weight.size() == static_cast<std::size_t>(p.r) * d_model);
      for (int t = 0; t < 8; ++t) {
        const auto x = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.1);
        const auto xk = normal_vec(static_cast<std::size_t>(d_model), rng, 1.0, 0.1);
        std::fill(qp.begin(), qp.end(), poison);
        kvscout::partial_query(w, x.data(), 123, qp.data());
        std::fill(qp2.begin(), qp2.end(), poison);
        kvscout::partial_query(w, x.data(), 4567, qp2.data());
        CHECK(qp == qp2);  // no RoPE: the position does not matter
        const auto q64 = project64(WQ, bQ, x.data(), d_model, D, h);
        const auto ref = skew64(p, q64);
        for (int i = 0; i < p.r; ++i)
          worst_q = std::max(worst_q, std::abs(qp[i] - ref[i]) / norm64(q64));

        std::fill(qp2.begin(), qp2.end(), poison);
        kvscout::partial_query(w0, x.data(), 0, qp2.data());
        const auto q64_nb = project64(WQ, no_bias, x.data(), d_model, D, h);
        const auto ref_nb = skew64(p, q64_nb);
        for (int i = 0; i < p.r; ++i)
          worst_nobias = std::max(worst_nobias, std::abs(qp2[i] - ref_nb[i]) / norm64(q64_nb));

        const auto k64 = project64(WK, bK, xk.data(), d_model, D, 0);
        const auto k32 = to_float(k64);
        std::fill(pk.begin(), pk.end(), poison);
        kvscout::project_key(p, k32.data(), pk.data());
        const auto pk_ref = skew64(p, k64);
        for (int i = 0; i < p.r; ++i) REQUIRE(std::abs(pk[i] - pk_ref[i]) < 1e-5 * norm64(k64));
        if (p.r == D) {
          const double full = dot64(q64.data(), k64.data(), D);
          worst_score = std::max(worst_score, std::abs(dot32(qp.data(), pk.data(), D) - full) /
                                                  (norm64(q64) * norm64(k64)));
        }
      }
    }
    CAPTURE(worst_q, worst_nobias, worst_score);
    CHECK(worst_q < 1e-5);
    CHECK(worst_nobias < 1e-5);
    CHECK(worst_score < 1e-5);
  }
}

TEST_CASE("partial_queries: a batch of sequences gets the bits partial_query gives each alone",
          "[skew]") {
  // The batched GEMV reads the weights once per 4 sequences (then 3, 2 or 1); every sequence has
  // its own input (row stride past d_model), its own position and an output stride past r. The
  // post_rope_skew rows must also be post_rope_skew_element's sums (the device's form).
  const int D = 64, d_model = 40, g = 2, n = 60;
  std::mt19937 rng(17);
  const auto WQ = normal_vec(static_cast<std::size_t>(g) * D * d_model, rng, 0.2);
  const auto bQ = normal_vec(static_cast<std::size_t>(g) * D, rng, 0.5, 0.2);
  const auto qs = normal_vec(static_cast<std::size_t>(n) * g * D, rng);
  const auto ks = normal_vec(static_cast<std::size_t>(n) * D, rng);
  const kvscout::rope_config rope{D, 10000.f, rope_style::interleaved};
  for (auto mode :
       {rope_mode::post_rope_skew, rope_mode::rope_planes, rope_mode::pre_rope_folded}) {
    CAPTURE(kvscout::to_string(mode));
    const auto p = calibrate(qs, ks, n, g, D, {.r = 16, .mode = mode, .rope = rope});
    const auto w = kvscout::make_partial_query_weights(p, {WQ.data(), WQ.size()},
                                                       {bQ.data(), bQ.size()}, d_model, 1);
    for (const int count : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      CAPTURE(count);
      const std::size_t ldx = d_model + 3, ldq = static_cast<std::size_t>(p.r) + 5;
      const auto x = normal_vec(ldx * count, rng, 1.0, 0.1);
      std::vector<kvscout::rope_table> rt(static_cast<std::size_t>(count));
      for (int v = 0; v < count; ++v) rt[v].fill(p.rope, 100 + 977 * v);
      std::vector<float> q(ldq * count + 1, poison), one(static_cast<std::size_t>(p.r));
      kvscout::partial_queries(w, x.data(), ldx, count, rt.data(), q.data(), ldq);
      for (int v = 0; v < count; ++v) {
        kvscout::partial_query(w, x.data() + v * ldx, rt[v], one.data());
        for (int i = 0; i < p.r; ++i) REQUIRE(std::bit_cast<std::uint32_t>(q[v * ldq + i]) ==
                                              std::bit_cast<std::uint32_t>(one[i]));
        for (std::size_t i = p.r; i < ldq; ++i) REQUIRE(std::isnan(q[v * ldq + i]));
      }
      REQUIRE(std::isnan(q[ldq * count]));
    }
    if (mode == rope_mode::post_rope_skew) {
      const auto y = normal_vec(static_cast<std::size_t>(D), rng, 1.0, 0.1);
      kvscout::rope_table rt;
      rt.fill(p.rope, 4321);
      std::vector<float> row(static_cast<std::size_t>(p.r));
      kvscout::detail::post_rope_skew_row(y.data(), p.rope, rt.cs, rt.sn, w.rotation.data(), D,
                                          p.r, row.data());
      for (int i = 0; i < p.r; ++i) {
        const float e = kvscout::detail::post_rope_skew_element(y.data(), p.rope, rt.cs, rt.sn,
                                                                w.rotation.data(), D, p.r, i);
        // The same sums in the same order; a build that contracts the vector and the scalar
        // form differently into FMAs may differ in the last bits.
        REQUIRE(row[i] == Approx(e).margin(1e-6 * norm64(y)));
      }
    }
  }
}

TEST_CASE("partial_queries rejects bad counts, strides and rotations, naming the value", "[skew]") {
  const int D = 64, d_model = 24, n = 8;
  std::mt19937 rng(4);
  const auto q = normal_vec(static_cast<std::size_t>(n) * D, rng);
  const auto k = normal_vec(static_cast<std::size_t>(n) * D, rng);
  const auto W = normal_vec(static_cast<std::size_t>(D) * d_model, rng);
  const auto x = normal_vec(static_cast<std::size_t>(d_model) * 4, rng);
  const auto p = calibrate(q, k, n, 1, D, {.r = 16, .mode = rope_mode::rope_planes});
  const auto w = kvscout::make_partial_query_weights(p, {W.data(), W.size()}, {}, d_model, 0);
  std::vector<kvscout::rope_table> rt(2);
  rt[0].fill(p.rope, 5);
  rt[1].fill(p.rope, 6);
  std::vector<float> out(64, poison);
  const auto untouched = [&] {
    return std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); });
  };
  CHECK_THROWS_WITH(kvscout::partial_queries(w, x.data(), d_model, -1, rt.data(), out.data(), 16),
                    Catch::Contains("count must be >= 0, got -1"));
  CHECK_NOTHROW(kvscout::partial_queries(w, x.data(), d_model, 0, nullptr, nullptr, 0));
  const auto batch = [&](std::size_t ldx, const kvscout::rope_table* tables, std::size_t ldq) {
    kvscout::partial_queries(w, x.data(), ldx, 2, tables, out.data(), ldq);
  };
  CHECK_THROWS_WITH(batch(d_model - 1, rt.data(), 16), Catch::Contains("ldx = 23"));
  CHECK_THROWS_WITH(batch(d_model, rt.data(), 15), Catch::Contains("ldq = 15"));
  CHECK_THROWS_WITH(batch(d_model, nullptr, 16),
                    Catch::Contains("needs one rope_table per sequence"));
  rt[1].planes = 3;
  CHECK_THROWS_WITH(batch(d_model, rt.data(), 16),
                    Catch::Contains("rope_table 1 holds 3 planes, expected head_dim / 2 = 32"));
  CHECK(untouched());
  // pre_rope_folded has no RoPE: no tables needed.
  const auto pf = calibrate(q, k, n, 1, D, {.r = 16, .mode = rope_mode::pre_rope_folded});
  const auto wf = kvscout::make_partial_query_weights(pf, {W.data(), W.size()}, {}, d_model, 0);
  CHECK_NOTHROW(kvscout::partial_queries(wf, x.data(), d_model, 2, nullptr, out.data(), 16));
  CHECK(std::none_of(out.begin(), out.begin() + 32, [](float v) { return std::isnan(v); }));
}

TEST_CASE("rope_table::fill of some planes: fill()'s bits for those, NaN for the rest",
          "[skew][rope]") {
  for (const auto style : {rope_style::split_half, rope_style::interleaved}) {
    const kvscout::rope_config c{.head_dim = 128, .theta = 500000.f, .style = style};
    for (const int pos : {0, 1, 4097, 131071}) {
      CAPTURE(static_cast<int>(style), pos);
      kvscout::rope_table all, some;
      all.fill(c, pos);
      const std::vector<int> only{63, 0, 17, 17, 5};  // any order, repeats allowed
      some.fill(c, pos, only.data(), static_cast<int>(only.size()));
      REQUIRE(some.planes == all.planes);
      for (int j = 0; j < all.planes; ++j) {
        CAPTURE(j);
        if (std::find(only.begin(), only.end(), j) != only.end()) {
          REQUIRE(std::bit_cast<std::uint32_t>(some.cs[j]) ==
                  std::bit_cast<std::uint32_t>(all.cs[j]));
          REQUIRE(std::bit_cast<std::uint32_t>(some.sn[j]) ==
                  std::bit_cast<std::uint32_t>(all.sn[j]));
        } else {
          REQUIRE((std::isnan(some.cs[j]) && std::isnan(some.sn[j])));
        }
      }
      // A table refilled with fewer planes forgets the others.
      const int one = 17;
      some.fill(c, pos, &one, 1);
      REQUIRE(std::isnan(some.cs[63]));
      REQUIRE(std::bit_cast<std::uint32_t>(some.cs[17]) ==
              std::bit_cast<std::uint32_t>(all.cs[17]));
    }
  }
  // Tables filled from frequencies computed beforehand, one table refilled across
  // configurations: rope_cos_sin's bits (from rope_angle) in every plane.
  {
    const kvscout::rope_config a{.head_dim = 64, .theta = 10000.f};
    const kvscout::rope_config b{.head_dim = 128, .theta = 10000.f};
    const kvscout::rope_config d{.head_dim = 128, .theta = 1000000.f};
    const kvscout::rope_frequencies fa(a), fb(b), fd(d);
    kvscout::rope_table reused;
    const std::pair<const kvscout::rope_config*, const kvscout::rope_frequencies*> order[] = {
        {&a, &fa}, {&b, &fb}, {&d, &fd}, {&a, &fa}, {&d, &fd}, {&b, &fb}};
    for (const auto& [c, f] : order) {
      CAPTURE(c->head_dim, c->theta);
      reused.fill(*f, 3001);
      REQUIRE(reused.planes == c->head_dim / 2);
      for (int j = 0; j < reused.planes; ++j) {
        float cs, sn;
        kvscout::detail::rope_cos_sin(*c, j, 3001, cs, sn);
        REQUIRE(std::bit_cast<std::uint32_t>(reused.cs[j]) == std::bit_cast<std::uint32_t>(cs));
        REQUIRE(std::bit_cast<std::uint32_t>(reused.sn[j]) == std::bit_cast<std::uint32_t>(sn));
      }
    }
  }
  const kvscout::rope_config c{.head_dim = 64};
  kvscout::rope_table rt;
  const std::vector<int> bad{3, 32};
  CHECK_THROWS_WITH(rt.fill(c, 9, bad.data(), 2),
                    Catch::Contains("plane 32 (entry 1) is outside [0, 32)"));
  const int neg = -1;
  CHECK_THROWS_WITH(rt.fill(c, 9, &neg, 1), Catch::Contains("plane -1 (entry 0)"));
  CHECK_THROWS_WITH(rt.fill(c, 9, bad.data(), -2), Catch::Contains("-2 planes"));
  CHECK_THROWS_WITH(rt.fill(c, 9, nullptr, 2), Catch::Contains("2 planes at"));
  CHECK_NOTHROW(rt.fill(c, 9, nullptr, 0));
  REQUIRE(std::isnan(rt.cs[0]));
}

TEST_CASE("the usage examples of skew/calibrate.hpp and skew/plan.hpp run", "[skew]") {
  const int n = 32, g = 3, D = 64, d_model = 32, q_head = 4, kv_head = 1, layer = 0, pos = 900;
  const kvscout::rope_config model_rope{.head_dim = D, .theta = 500000.f,
                                        .style = rope_style::interleaved};
  std::mt19937 rng(5);
  const auto q = normal_vec(static_cast<std::size_t>(n) * g * D, rng);
  const auto k = normal_vec(static_cast<std::size_t>(n) * D, rng);
  const auto Wq = normal_vec(static_cast<std::size_t>(2 * g) * D * d_model, rng);
  const auto bq = normal_vec(static_cast<std::size_t>(2 * g) * D, rng);
  const kvscout::host_span<const float> W_Q(Wq.data(), Wq.size()), b_Q(bq.data(), bq.size());
  const auto xv = normal_vec(static_cast<std::size_t>(d_model), rng);
  auto kv = normal_vec(static_cast<std::size_t>(D), rng);
  kvscout::apply_rope(kv.data(), 17, model_rope);
  const float* x = xv.data();
  const float* k_roped = kv.data();

  std::vector<std::vector<kvscout::skew_plan>> plans;  // [layer][kv_head]
  {  // skew/calibrate.hpp
    kvscout::skew_options opt{.r = 0 /* default: D/4 up to a multiple of 8 */,
                              .mode = kvscout::rope_mode::rope_planes, .rope = model_rope};
    kvscout::skew_plan plan = kvscout::calibrate_skew(
        {q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
    plans = {{plan, plan}};
  }
  {  // skew/plan.hpp
    const kvscout::skew_plan& plan = plans[layer][kv_head];               // from calibrate_skew
    auto w = kvscout::make_partial_query_weights(plan, W_Q, b_Q, d_model, q_head);  // once
    std::vector<float> pk(plan.r), qp(plan.r);
    kvscout::project_key(plan, k_roped, pk.data());          // at prefill / append, per token
    kvscout::partial_query(w, x, pos, qp.data());            // at decode, per step
    float s = 0; for (int i = 0; i < plan.r; ++i) s += qp[i] * pk[i];   // then * 1/sqrt(D)
    CHECK(plan.r == 16);
    CHECK(std::isfinite(s));
    // The batch form: two copies of x at pos, so both rows are qp.
    const int count = 2;
    const auto ldx = static_cast<std::size_t>(d_model);
    const auto ldq = static_cast<std::size_t>(plan.r);
    std::vector<float> Xv(x, x + d_model), Q(ldq * count);
    Xv.insert(Xv.end(), x, x + d_model);
    const float* X = Xv.data();
    std::vector<kvscout::rope_table> tables(count);
    for (auto& t : tables) t.fill(plan.rope, pos);
    kvscout::partial_queries(w, X, ldx, count, tables.data(), Q.data(), ldq);
    CHECK(std::equal(qp.begin(), qp.end(), Q.begin()));
    CHECK(std::equal(qp.begin(), qp.end(), Q.begin() + plan.r));
  }
}

TEST_CASE("rope_planes_plan keeps the given planes and checks them", "[skew]") {
  using Catch::Contains;
  for (const auto style : {kvscout::rope_style::split_half, kvscout::rope_style::interleaved}) {
    const kvscout::rope_config rope{64, 10000.f, style};
    const kvscout::skew_plan p = kvscout::rope_planes_plan(rope, {1, 5, 31});
    REQUIRE(p.mode == rope_mode::rope_planes);
    REQUIRE(p.head_dim == 64);
    REQUIRE(p.r == 6);
    REQUIRE(p.planes == std::vector<int>{1, 5, 31});
    for (int i = 0; i < 3; ++i) {
      const kvscout::detail::rope_plane ch =
          kvscout::detail::rope_plane_channels(rope, p.planes[i]);
      REQUIRE(p.channels[2 * i] == ch.a);
      REQUIRE(p.channels[2 * i + 1] == ch.b);
    }
    for (int d = 0; d < 64; ++d)
      for (int e = 0; e < 64; ++e) REQUIRE(p.A[static_cast<std::size_t>(d) * 64 + e] == (d == e ? 1.f : 0.f));
    kvscout::detail::check_plan(p);  // what decode code relies on
  }
  const kvscout::rope_config rope{64, 10000.f, kvscout::rope_style::split_half};
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan(rope, {}), Contains("no planes given"));
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan(rope, {3, 32}),
                      Contains("plane 32 (entry 1) is outside [0, 32)"));
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan(rope, {-1}), Contains("plane -1 (entry 0)"));
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan(rope, {4, 4}),
                      Contains("strictly ascending: 4 then 4"));
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan({63, 10000.f, kvscout::rope_style::split_half}, {0}),
                      Contains("head_dim must be a positive even number, got 63"));
}

TEST_CASE(
    "calibrate_skew_layers: each (layer, kv head) plan is calibrate_skew's on its own samples",
    "[skew]") {
  std::mt19937 rng(46);
  constexpr int L = 3, H = 2, Hq = 4, D = 16, n = 24, g = Hq / H;
  const kvscout::decode_shape shape{
      .num_layers = L, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D};
  std::vector<std::vector<float>> qs, ks;  // per layer: [n, Hq, D] and [n, H, D]
  for (int l = 0; l < L; ++l) {
    qs.push_back(normal_vec(static_cast<std::size_t>(n) * Hq * D, rng));
    ks.push_back(normal_vec(static_cast<std::size_t>(n) * H * D, rng));
  }
  for (const kvscout::rope_mode mode :
       {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes}) {
    kvscout::skew_options opt;
    opt.r = 4;
    opt.mode = mode;
    opt.rope = {.head_dim = D};
    const auto plans = kvscout::calibrate_skew_layers(shape, qs, ks, n, opt, 1);
    REQUIRE(plans.size() == L);
    CHECK(plans[0].empty());  // below first_layer
    for (int l = 1; l < L; ++l) {
      REQUIRE(plans[l].size() == H);
      for (int h = 0; h < H; ++h) {
        // The reference: the group's heads and the kv head's key gathered by hand.
        std::vector<float> q, k;
        for (int t = 0; t < n; ++t) {
          const float* qt = qs[l].data() + (static_cast<std::size_t>(t) * Hq + h * g) * D;
          q.insert(q.end(), qt, qt + g * D);
          const float* kt = ks[l].data() + (static_cast<std::size_t>(t) * H + h) * D;
          k.insert(k.end(), kt, kt + D);
        }
        const kvscout::skew_plan want =
            kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
        CHECK(plans[l][h].channels == want.channels);
        CHECK(plans[l][h].A == want.A);
        CHECK(plans[l][h].r == want.r);
      }
    }
  }
  kvscout::skew_options opt;
  opt.r = 4;
  opt.rope = {.head_dim = D};
  using Catch::Contains;
  CHECK_THROWS_WITH(kvscout::calibrate_skew_layers(shape, {qs[0]}, ks, n, opt),
                    Contains("got 1 query and 3 key sample sets, expected one per layer"));
  auto short_k = ks;
  short_k[2].pop_back();
  CHECK_THROWS_WITH(kvscout::calibrate_skew_layers(shape, qs, short_k, n, opt),
                    Contains("layer 2 has 1536 query and 767 key floats"));
  auto bad = shape;
  bad.num_q_heads = 3;
  CHECK_THROWS_WITH(kvscout::calibrate_skew_layers(bad, qs, ks, n, opt), Contains("num_q_heads 3"));
  CHECK_THROWS_WITH(kvscout::calibrate_skew_layers(shape, qs, ks, n, opt, L + 1),
                    Contains("first_layer = 4 is outside [0, num_layers = 3]"));
}
