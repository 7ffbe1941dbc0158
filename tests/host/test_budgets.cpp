// Per-layer budgets (issue 32, part 2): add_mass_curve against its definition, and
// layer_budget_shares against brute force over every allocation of the steps.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kvscout/select/budgets.hpp"

namespace {
// Brute force: every allocation of `steps` steps (each layer at most bins) over the layers,
// scored by f (a functional of each layer's curve value at its steps); the best score.
double best_allocation(const std::vector<std::vector<double>>& c, int bins, int steps, int floor_steps,
                       const std::function<double(const std::vector<double>&)>& f) {
  const int L = static_cast<int>(c.size());
  std::vector<int> u(static_cast<std::size_t>(L), 0);
  double best = -std::numeric_limits<double>::infinity();
  for (;;) {
    int sum = 0;
    for (int x : u) sum += x;
    bool floor_ok = true;
    for (int x : u) floor_ok = floor_ok && x >= floor_steps;
    if (sum == steps && floor_ok) {
      std::vector<double> v;
      for (int l = 0; l < L; ++l) v.push_back(u[static_cast<std::size_t>(l)] ? c[static_cast<std::size_t>(l)][static_cast<std::size_t>(u[static_cast<std::size_t>(l)] - 1)] : 0.0);
      best = std::max(best, f(v));
    }
    int l = 0;
    while (l < L && ++u[static_cast<std::size_t>(l)] > bins) u[static_cast<std::size_t>(l++)] = 0;
    if (l == L) break;
  }
  return best;
}
}  // namespace

TEST_CASE("add_mass_curve: the share of the mass the best rows hold, per bin", "[budgets]") {
  const std::vector<float> m{4, 1, 3, 2};
  std::vector<float> scratch(4);
  std::vector<double> c4(4, 0.0), c3(3, 0.0);
  kvscout::detail::add_mass_curve({m.data(), m.size()}, {scratch.data(), scratch.size()},
                                  {c4.data(), c4.size()});
  REQUIRE(c4[0] == Approx(0.4));
  REQUIRE(c4[1] == Approx(0.7));
  REQUIRE(c4[2] == Approx(0.9));
  REQUIRE(c4[3] == Approx(1.0));
  // 3 bins over 4 rows: the best ceil(4 / 3) = 2, ceil(8 / 3) = 3, 4 rows.
  kvscout::detail::add_mass_curve({m.data(), m.size()}, {scratch.data(), scratch.size()},
                                  {c3.data(), c3.size()});
  REQUIRE(c3[0] == Approx(0.7));
  REQUIRE(c3[1] == Approx(0.9));
  REQUIRE(c3[2] == Approx(1.0));
  // Summed over rows; random rows against a double brute force.
  std::mt19937 rng(3301);
  std::exponential_distribution<float> ed(1.f);
  std::vector<double> c(7, 0.0), ref(7, 0.0);
  for (int r = 0; r < 20; ++r) {
    const int n = 1 + static_cast<int>(rng() % 50);
    std::vector<float> row(static_cast<std::size_t>(n));
    for (auto& x : row) x = ed(rng);
    std::vector<float> s(row.size());
    kvscout::detail::add_mass_curve({row.data(), row.size()}, {s.data(), s.size()},
                                    {c.data(), c.size()});
    std::vector<double> d(row.begin(), row.end());
    std::sort(d.rbegin(), d.rend());
    double total = 0;
    for (double x : d) total += x;
    for (int b = 0; b < 7; ++b) {
      const int k = static_cast<int>(std::ceil((b + 1) * n / 7.0 - 1e-9));
      double a = 0;
      for (int i = 0; i < k; ++i) a += d[static_cast<std::size_t>(i)];
      ref[static_cast<std::size_t>(b)] += a / total;
    }
  }
  for (int b = 0; b < 7; ++b) REQUIRE(c[static_cast<std::size_t>(b)] == Approx(ref[static_cast<std::size_t>(b)]).epsilon(1e-6));
  // A row of zero mass adds nothing.
  const std::vector<float> z(5, 0.f);
  std::vector<double> cz(3, 0.0);
  std::vector<float> sz(5);
  kvscout::detail::add_mass_curve({z.data(), z.size()}, {sz.data(), sz.size()},
                                  {cz.data(), cz.size()});
  REQUIRE(cz == std::vector<double>(3, 0.0));
}

TEST_CASE("layer_budget_shares: coverage is the best smallest share, mass the most in all", "[budgets]") {
  std::mt19937 rng(3302);
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 3), bins = 6, first = static_cast<int>(rng() % 2);
    // Concave curves (rows of different sharpness, bins dividing the row length).
    std::vector<std::vector<double>> c(static_cast<std::size_t>(L), std::vector<double>(bins, 0.0));
    for (int l = 0; l < L; ++l) {
      std::exponential_distribution<float> ed(1.f);
      std::vector<float> row(36), s(36);
      const float sharp = 1.f + 3.f * static_cast<float>(rng() % 4);
      for (auto& x : row) x = std::pow(ed(rng), sharp);
      kvscout::detail::add_mass_curve(
          {row.data(), row.size()}, {s.data(), s.size()},
          {c[static_cast<std::size_t>(l)].data(), static_cast<std::size_t>(bins)});
    }
    std::vector<double> flat;
    for (const auto& x : c) flat.insert(flat.end(), x.begin(), x.end());
    const double budget = (1 + static_cast<int>(rng() % 5)) / 6.0;  // whole steps
    const int per = static_cast<int>(std::llround(budget * bins));
    const std::vector<std::vector<double>> used(c.begin() + first, c.end());
    const int steps = per * static_cast<int>(used.size());
    for (auto rule : {kvscout::layer_budget_rule::coverage, kvscout::layer_budget_rule::mass})
    for (double min_share : {0.0, 0.5}) {
      // The documented floor: at least min_share of the even share, in whole steps.
      int floor_steps = 0;
      while (floor_steps < per && static_cast<double>(floor_steps) / per < min_share) ++floor_steps;
      std::vector<double> sh(static_cast<std::size_t>(L), -1.0);
      kvscout::layer_budget_shares({flat.data(), flat.size()}, L, bins, first, budget, rule, {sh.data(), sh.size()},
                                   min_share);
      INFO("trial " << trial << " rule " << rule << " min_share " << min_share);
      double mean = 0, lo = 1e9, sum = 0;
      for (int l = 0; l < L; ++l) {
        if (l < first) {
          REQUIRE(sh[static_cast<std::size_t>(l)] == 1.0);
          continue;
        }
        const double u = sh[static_cast<std::size_t>(l)] * budget * bins;
        REQUIRE(u == Approx(std::round(u)));
        const int ui = static_cast<int>(std::lround(u));
        REQUIRE(ui >= floor_steps);
        const double v = ui ? c[static_cast<std::size_t>(l)][static_cast<std::size_t>(ui - 1)] : 0.0;
        mean += sh[static_cast<std::size_t>(l)], lo = std::min(lo, v), sum += v;
      }
      REQUIRE(mean / static_cast<double>(used.size()) == Approx(1.0));  // the same rows in all
      if (rule == kvscout::layer_budget_rule::coverage)
        REQUIRE(lo == Approx(best_allocation(used, bins, steps, floor_steps, [](const std::vector<double>& v) {
                  return *std::min_element(v.begin(), v.end());
                })));
      else
        REQUIRE(sum == Approx(best_allocation(used, bins, steps, floor_steps, [](const std::vector<double>& v) {
                  double a = 0;
                  for (double x : v) a += x;
                  return a;
                })));
    }
  }
}

TEST_CASE("layer shares average 1 and keep their floor when budget * bins is not whole", "[budgets]") {
  // 3 layers from layer 1, 32 bins, budget 0.10: 3 steps per layer (3.2 rounded).
  std::vector<double> curves;
  for (int l = 0; l < 4; ++l)
    for (int b = 0; b < 32; ++b) curves.push_back(std::min(1.0, (b + 1) * (0.02 + 0.05 * l)));
  for (double min_share : {0.0, 0.5, 1.0}) {
    std::vector<double> sh(4);
    kvscout::layer_budget_shares({curves.data(), curves.size()}, 4, 32, 1, 0.10,
                                 kvscout::layer_budget_rule::coverage, {sh.data(), sh.size()}, min_share);
    INFO("min_share " << min_share);
    REQUIRE(sh[0] == 1.0);
    REQUIRE((sh[1] + sh[2] + sh[3]) / 3 == Approx(1.0));
    for (int l = 1; l < 4; ++l) REQUIRE(sh[static_cast<std::size_t>(l)] >= min_share - 1e-12);
  }
}

TEST_CASE("mass curves and layer shares refuse bad input by name", "[budgets]") {
  std::vector<float> row{1.f, -2.f}, s(2);
  std::vector<double> c(4, 0.0), out(2);
  REQUIRE_THROWS_WITH(
      kvscout::detail::add_mass_curve({row.data(), 2}, {s.data(), 2}, {c.data(), 4}),
      Catch::Contains("mass[1] = -2: expected a finite non-negative weight"));
  REQUIRE_THROWS_WITH(
      kvscout::detail::add_mass_curve({row.data(), 2}, {s.data(), 1}, {c.data(), 4}),
      Catch::Contains("scratch holds 1 floats"));
  std::vector<double> curves{0.5, 0.4, 0.6, 1.0};  // layer 0 falls
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 0, 0.5, kvscout::layer_budget_rule::coverage, {out.data(), 2}),
                      Catch::Contains("curves[0, 1] = 0.4"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 1, 1.5, kvscout::layer_budget_rule::coverage, {out.data(), 2}),
                      Catch::Contains("budget = 1.5"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 2, 0.5, kvscout::layer_budget_rule::coverage, {out.data(), 2}),
                      Catch::Contains("first_layer = 2 is outside [0, num_layers = 2)"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 3}, 2, 2, 1, 0.5, kvscout::layer_budget_rule::coverage, {out.data(), 2}),
                      Catch::Contains("curves holds 3 values, expected num_layers * bins = 4"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 1, 0.5, static_cast<kvscout::layer_budget_rule>(9), {out.data(), 2}),
                      Catch::Contains("rule = layer_budget_rule(9)"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 1, 0.5, kvscout::layer_budget_rule::mass, {out.data(), 2}, 1.5),
                      Catch::Contains("min_share = 1.5"));
  REQUIRE_THROWS_WITH(kvscout::layer_budget_shares({curves.data(), 4}, 2, 2, 1, 0.2, kvscout::layer_budget_rule::mass, {out.data(), 2}),
                      Catch::Contains("must round to at least 1 step per layer"));
}
