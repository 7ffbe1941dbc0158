// cache/host_pool.hpp: the bounded host pool (InfiniGen's counter / LRU eviction).
//
// Two hand-worked sequences give the eviction order of both policies step by step (InfiniGen's
// window, its widening, ties, pinned sinks, slot reuse); a reference written here from the
// header's definition (std::map of resident tokens to their counter or last-use step, the victim
// by std::min_element over (key, token)) is compared with the pool after every step of seeded
// random runs: several layers, sequences and heads, continuous-batching row orders, capacities
// from 1 to past the length. Bad input is an error naming the value, and leaves the pool as it
// was.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvscout/cache/host_pool.hpp"
#include "kvscout/core/configured.hpp"
#include "kvscout/core/workspace.hpp"

using Catch::Contains;
using kvscout::eviction;
using kvscout::host_pool;

static_assert(kvscout::configured<host_pool>);

namespace {

// One (sequence, kv head) selection for a pool of 1 layer, 1 sequence, 1 head.
struct one_row {
  std::vector<int32_t> idx;
  std::vector<int32_t> cnt{0};
  kvscout::selection_view<kvscout::host_space> view(int capacity = -1) {
    cnt[0] = static_cast<int32_t>(idx.size());
    if (idx.empty()) idx.push_back(-99), cnt[0] = 0;  // a poisoned entry past the count
    return {{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, 1, 1,
            capacity < 0 ? static_cast<int>(idx.size()) : capacity};
  }
};

void step(host_pool& p, std::vector<int32_t> selected, int t) {
  one_row r{std::move(selected)};
  p.observe(0, r.view());
  p.append(0, 0, t);
}

std::vector<int> resident_tokens(const host_pool& p, int layer, int s, int h) {
  std::vector<int32_t> out(static_cast<std::size_t>(p.length(layer, s)));
  const int n = p.live_tokens(layer, s, h, out);
  return {out.begin(), out.begin() + n};
}

}  // namespace

TEST_CASE("host_pool: eviction order of a hand-worked sequence, counter and LRU", "[host_pool]") {
  // Capacity 4, no pinned sinks. Selections before tokens 0..7 enter:
  //   {}, {0}, {1}, {0, 2}, {3}, {}, {2, 3}, {3, 4}
  // Counters when token 4 enters: 0:2 1:1 2:1 3:1. InfiniGen's window before token t is
  // [0, floor((t - 1) / 2)); it widens to [0, t - floor(4 / 2)) when it holds no resident token.
  //   t = 4: window {0}: 0 goes (the largest counter, but the only candidate)
  //   t = 5: window {0, 1}: 1
  //   t = 6: window {0, 1} is empty -> [0, 4) = {2, 3}, counters 2 / 2, LRU steps 7 / 7: tie, 2
  //   t = 7: window {0, 1, 2} is empty -> [0, 5) = {3, 4}: counters 3 / 1 -> 4; LRU 8 / 8 -> 3
  const std::vector<std::vector<int32_t>> sel = {{}, {0}, {1}, {0, 2}, {3}, {}, {2, 3}, {3, 4}};
  for (eviction policy : {eviction::counter, eviction::lru}) {
    CAPTURE(kvscout::to_string(policy));
    host_pool p({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 16}, 4, policy,
                 0});
    std::vector<int> victims;
    for (int t = 0; t < 8; ++t) {
      step(p, sel[static_cast<std::size_t>(t)], t);
      if (p.evicted(0, 0, 0) >= 0) victims.push_back(p.evicted(0, 0, 0));
      CHECK(p.resident_count(0, 0, 0) == std::min(t + 1, 4));
    }
    const bool counter = policy == eviction::counter;
    CHECK(victims == (counter ? std::vector<int>{0, 1, 2, 4} : std::vector<int>{0, 1, 2, 3}));
    CHECK(resident_tokens(p, 0, 0, 0) == (counter ? std::vector<int>{3, 5, 6, 7} : std::vector<int>{4, 5, 6, 7}));
    // Slots: 0..3 while filling, then each new token takes its victim's slot.
    CHECK(p.slot(0, 0, 0, 5) == 1);  // 1's slot
    CHECK(p.slot(0, 0, 0, 6) == 2);  // 2's slot
    CHECK(p.slot(0, 0, 0, 7) == (counter ? 0 : 3));  // 4's slot (4 had 0's) / 3's slot
    if (counter) {
      CHECK(p.slot(0, 0, 0, 3) == 3);
      CHECK(p.key(0, 0, 0, 3) == 3);  // selected at three steps
      CHECK(p.key(0, 0, 0, 7) == 0);
    } else {
      CHECK(p.slot(0, 0, 0, 4) == 0);
      CHECK(p.key(0, 0, 0, 4) == 8);  // last selected at the 8th observe()
      CHECK(p.key(0, 0, 0, 5) == 0);  // never selected
    }
    for (int t : {0, 1, 2}) CHECK_FALSE(p.resident(0, 0, 0, t));
    for (int i = 0; i < 4; ++i) CHECK(p.slot(0, 0, 0, p.token_in_slot(0, 0, 0, i)) == i);
  }
}

TEST_CASE("host_pool: pinned sinks are never evicted, never-selected tokens go first", "[host_pool]") {
  // Capacity 3, token 0 pinned, nothing ever selected: every victim comes from the widened window
  // [1, t - floor((3 - 1) / 2)) = [1, t - 1), lowest index first.
  host_pool p({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 12}, 3,
               eviction::lru, 1});
  std::vector<int> victims;
  for (int t = 0; t < 8; ++t) {
    step(p, {}, t);
    if (p.evicted(0, 0, 0) >= 0) victims.push_back(p.evicted(0, 0, 0));
  }
  CHECK(victims == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(resident_tokens(p, 0, 0, 0) == std::vector<int>{0, 6, 7});

  // LRU: InfiniGen's window before token 4 holds only token 0, which goes although it was
  // just selected; later victims come from the widened window, never-selected tokens by index.
  host_pool q({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 12}, 4,
               eviction::lru, 0});
  for (int t = 0; t < 4; ++t) step(q, {}, t);  // 0..3, none selected
  step(q, {0}, 4);  // window before 4: {0}; 0 was just selected, but it is the only candidate
  CHECK(q.evicted(0, 0, 0) == 0);
  for (int t = 5; t < 9; ++t) step(q, {}, t);
  // Before 5: window [0, 2) -> 1. Before 6: [0, 2) empty -> [0, 4) = {2, 3} -> 2. Before 7:
  // [0, 3) empty -> [0, 5) = {3, 4} -> 3. Before 8: [0, 3) empty -> [0, 6) = {4, 5} -> 4.
  CHECK(resident_tokens(q, 0, 0, 0) == std::vector<int>{5, 6, 7, 8});
}

TEST_CASE("host_pool: capacity at or above the length evicts nothing", "[host_pool]") {
  std::mt19937 rng(7);
  for (eviction policy : {eviction::counter, eviction::lru}) {
    host_pool p({{.num_layers = 2, .num_seqs = 2, .num_kv_heads = 3, .max_tokens = 40}, 40, policy,
                 4});
    std::vector<int32_t> idx(2 * 3 * 40), cnt(2 * 3);
    for (int t = 0; t < 40; ++t)
      for (int layer = 0; layer < 2; ++layer) {
        for (int r = 0; r < 6; ++r) {
          int n = 0;
          for (int x = 0; x < t; ++x)
            if (rng() % 3 == 0) idx[static_cast<std::size_t>(r) * 40 + static_cast<std::size_t>(n++)] = x;
          cnt[static_cast<std::size_t>(r)] = n;
        }
        p.observe(layer, {{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, 2, 3, 40});
        for (int s = 0; s < 2; ++s) {
          p.append(layer, s, t);
          for (int h = 0; h < 3; ++h) CHECK(p.evicted(layer, s, h) == -1);
        }
      }
    for (int layer = 0; layer < 2; ++layer)
      for (int s = 0; s < 2; ++s)
        for (int h = 0; h < 3; ++h) {
          CHECK(p.resident_count(layer, s, h) == 40);
          const auto sl = p.slots(layer, s, h);
          REQUIRE(sl.size() == 40);
          for (int t = 0; t < 40; ++t) CHECK(sl[static_cast<std::size_t>(t)] == t);
        }
  }
}

namespace {

// The reference: per (layer, sequence, kv head), the resident tokens and their keys in a
// std::map, the slot of each, the victim by std::min_element over (key, token) in the window.
struct reference_pool {
  int C, sinks;
  eviction policy;
  std::map<int, std::int64_t> live;  // token -> counter or last-use step
  std::map<int, int> slot;            // token -> slot
  std::int64_t clock = 0;
  int len = 0;

  void observe(const std::vector<int>& selected) {
    ++clock;
    for (int t : selected) {
      auto it = live.find(t);
      REQUIRE(it != live.end());
      it->second = policy == eviction::counter ? it->second + 1 : clock;
    }
  }
  int append() {
    const int t = len++;
    int victim = -1, free_slot = static_cast<int>(live.size());
    if (static_cast<int>(live.size()) == C) {
      auto pick = [&](int hi) {
        std::vector<std::pair<std::int64_t, int>> cand;
        for (const auto& [tok, key] : live)
          if (tok >= sinks && tok < hi) cand.emplace_back(key, tok);
        if (cand.empty()) return -1;
        return std::min_element(cand.begin(), cand.end())->second;
      };
      victim = pick(t >= 1 ? (t - 1) / 2 : 0);
      if (victim < 0) victim = pick(t - (C - sinks) / 2);
      REQUIRE(victim >= 0);
      free_slot = slot.at(victim);
      live.erase(victim);
      slot.erase(victim);
    }
    live[t] = 0;
    slot[t] = free_slot;
    return victim;
  }
};

}  // namespace

TEST_CASE("host_pool: matches a std::map reference over seeded random runs", "[host_pool]") {
  constexpr int L = 2, S = 3, H = 2, T = 150;
  for (unsigned seed : {1u, 2u, 3u}) {
    for (int C : {1, 2, 5, 17, 64, 149, 150}) {
      for (eviction policy : {eviction::counter, eviction::lru}) {
        const int sinks = seed == 2 ? std::min(3, C - 1) : 0;
        CAPTURE(seed, C, kvscout::to_string(policy), sinks);
        std::mt19937 rng(seed * 1000 + static_cast<unsigned>(C));
        host_pool p({{.num_layers = L, .num_seqs = S, .num_kv_heads = H, .max_tokens = T}, C,
                     policy, sinks});
        std::vector<reference_pool> ref(static_cast<std::size_t>(L * S * H), reference_pool{C, sinks, policy, {}, {}});
        auto R = [&](int l, int s, int h) -> reference_pool& {
          return ref[static_cast<std::size_t>((l * S + s) * H + h)];
        };
        const int cap = T;
        std::vector<int32_t> idx(static_cast<std::size_t>(S * H * cap)), cnt(static_cast<std::size_t>(S * H));
        for (int t = 0; t < T; ++t) {
          for (int l = 0; l < L; ++l) {
            // Rows in a shuffled sequence order (continuous batching); each row selects a random
            // subset of its resident tokens, denser among the old ones so keys tie and differ.
            std::vector<int32_t> ids = {0, 1, 2};
            std::shuffle(ids.begin(), ids.end(), rng);
            const double density = 0.05 + 0.5 * static_cast<double>(rng() % 4) / 3.0;
            for (int r = 0; r < S; ++r)
              for (int h = 0; h < H; ++h) {
                const int s = ids[static_cast<std::size_t>(r)];
                std::vector<int> chosen;
                for (const auto& [tok, key] : R(l, s, h).live)
                  if (std::uniform_real_distribution<double>(0, 1)(rng) < density * (tok < t / 2 ? 1.0 : 0.5))
                    chosen.push_back(tok);
                for (std::size_t i = 0; i < chosen.size(); ++i)
                  idx[static_cast<std::size_t>((r * H + h) * cap) + i] = chosen[i];
                cnt[static_cast<std::size_t>(r * H + h)] = static_cast<int32_t>(chosen.size());
                R(l, s, h).observe(chosen);
              }
            p.observe(l, {{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, S, H, cap}, ids);
            for (int s = 0; s < S; ++s) {
              p.append(l, s, t);
              for (int h = 0; h < H; ++h) REQUIRE(p.evicted(l, s, h) == R(l, s, h).append());
            }
          }
          if (t % 7 != 0 && t != T - 1) continue;
          for (int l = 0; l < L; ++l)
            for (int s = 0; s < S; ++s)
              for (int h = 0; h < H; ++h) {
                const reference_pool& rp = R(l, s, h);
                REQUIRE(p.resident_count(l, s, h) == static_cast<int>(rp.live.size()));
                std::vector<int> want;
                for (const auto& [tok, key] : rp.live) want.push_back(tok);
                REQUIRE(resident_tokens(p, l, s, h) == want);
                const auto sl = p.slots(l, s, h);
                for (int x = 0; x <= t; ++x) {
                  const auto it = rp.slot.find(x);
                  REQUIRE(sl[static_cast<std::size_t>(x)] == (it == rp.slot.end() ? -1 : it->second));
                  if (it != rp.slot.end()) {
                    REQUIRE(p.key(l, s, h, x) == rp.live.at(x));
                    REQUIRE(p.token_in_slot(l, s, h, it->second) == x);
                  }
                }
                for (int x = 0; x < sinks && x <= t; ++x) REQUIRE(p.resident(l, s, h, x));
              }
        }
      }
    }
  }
}

TEST_CASE("host_pool: drop_evicted and live_tokens below a bound", "[host_pool]") {
  host_pool p({{.num_layers = 1, .num_seqs = 2, .num_kv_heads = 1, .max_tokens = 32}, 6,
               eviction::counter, 2});
  for (int t = 0; t < 20; ++t)
    for (int s = 0; s < 2; ++s) p.append(0, s, t);
  const std::vector<int> live = resident_tokens(p, 0, 0, 0);
  REQUIRE(live.size() == 6);
  // A selection of every token of both sequences, in batch row order {1, 0}.
  std::vector<int32_t> idx(2 * 20), cnt{20, 20}, ids{1, 0};
  for (int r = 0; r < 2; ++r)
    for (int x = 0; x < 20; ++x) idx[static_cast<std::size_t>(r * 20 + x)] = x;
  const kvscout::selection_buffers<kvscout::host_space> sel{{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, 2, 1, 20};
  CHECK(p.drop_evicted(0, sel, ids) == 2 * 14);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cnt[static_cast<std::size_t>(r)] == 6);
    CHECK(std::vector<int>(idx.begin() + r * 20, idx.begin() + r * 20 + 6) ==
          resident_tokens(p, 0, ids[static_cast<std::size_t>(r)], 0));
  }
  p.observe(0, sel.view(), ids);  // now every entry is resident
  std::vector<int32_t> out(6);
  const int n = p.live_tokens(0, 0, 0, out, 10);
  CHECK(std::vector<int>(out.begin(), out.begin() + n) ==
        std::vector<int>(live.begin(), std::find_if(live.begin(), live.end(), [](int x) { return x >= 10; })));
}

TEST_CASE("host_pool: bad input names the value and changes nothing", "[host_pool][bad_input]") {
  using cfg = host_pool::config;
  REQUIRE_THROWS_WITH(host_pool(cfg{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                                    .max_tokens = 8}, 0, eviction::lru, 0}),
                      Contains("host_pool capacity 0 must be in [1, max_tokens = 8]"));
  REQUIRE_THROWS_WITH(
      host_pool(cfg{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 8},
                    -3,
                    eviction::lru,
                    0}),
      Contains("capacity -3"));
  REQUIRE_THROWS_WITH(
      host_pool(cfg{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 8},
                    9,
                    eviction::lru,
                    0}),
      Contains("capacity 9 must be in [1, max_tokens = 8]"));
  REQUIRE_THROWS_WITH(
      host_pool(cfg{{.num_layers = 1, .num_seqs = 0, .num_kv_heads = 1, .max_tokens = 8},
                    4,
                    eviction::lru,
                    0}),
      Contains("num_seqs 0"));
  REQUIRE_THROWS_WITH(
      host_pool(cfg{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1, .max_tokens = 8},
                    4,
                    eviction::lru,
                    4}),
      Contains("pinned_sinks 4 must be in [0, capacity = 4)"));
  REQUIRE_THROWS_WITH(host_pool(cfg{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                                    .max_tokens = 8}, 4, static_cast<eviction>(5), 0}),
                      Contains("eviction policy 5 is not eviction::counter"));

  host_pool p({{.num_layers = 2, .num_seqs = 2, .num_kv_heads = 1, .max_tokens = 8}, 3,
               eviction::counter, 0});
  for (int t = 0; t < 5; ++t) p.append(1, 0, t);  // layer 1, sequence 0: tokens 0..4, 0 and 1 evicted
  REQUIRE_THROWS_WITH(p.append(2, 0, 0), Contains("layer 2 is out of range [0, 2)"));
  REQUIRE_THROWS_WITH(p.append(1, 2, 0), Contains("sequence 2 is out of range [0, 2)"));
  REQUIRE_THROWS_WITH(p.append(1, 0, 7), Contains("token 7 appended to sequence 0 of layer 1: expected the next token, length = 5"));
  for (int t = 5; t < 8; ++t) p.append(1, 0, t);
  REQUIRE_THROWS_WITH(p.append(1, 0, 8), Contains("token 8 of sequence 0 is out of range [0, max_tokens = 8)"));
  REQUIRE_THROWS_WITH(p.slot(1, 0, 0, 8), Contains("token 8 of sequence 0 of layer 1 is out of range [0, length = 8)"));
  REQUIRE_THROWS_WITH(p.slot(0, 0, 0, 0), Contains("token 0 of sequence 0 of layer 0 is out of range [0, length = 0)"));
  REQUIRE_THROWS_WITH(p.slot(1, 0, 1, 0), Contains("kv_head 1 is out of range [0, 1)"));
  REQUIRE_THROWS_WITH(p.token_in_slot(1, 0, 0, 3), Contains("slot 3 is out of range [0, capacity = 3)"));
  std::vector<int32_t> small(2);
  REQUIRE_THROWS_WITH(p.live_tokens(1, 0, 0, small), Contains("out holds 2 entries"));
  REQUIRE_THROWS_WITH(p.live_tokens(1, 0, 0, small, 9), Contains("live_tokens below 9"));

  // Selections: sequence 0 resident {5, 6, 7} (counter, nothing selected: lowest index first),
  // sequence 1 empty. Row 1 is checked after row 0 was valid: nothing may be counted.
  REQUIRE(resident_tokens(p, 1, 0, 0) == std::vector<int>{5, 6, 7});
  std::vector<int32_t> idx{5, 6, 7, 0, 0, 0}, cnt{3, 0}, ids{0, 1};
  auto view = [&](int seqs, int heads, int capacity) {
    return kvscout::selection_view<kvscout::host_space>{{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, seqs, heads, capacity};
  };
  auto unchanged = [&] {
    for (int t : {5, 6, 7}) CHECK(p.key(1, 0, 0, t) == 0);
  };
  cnt = {3, 1};  // sequence 1 has no token 0 yet: a selection past its length
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3)),
                      Contains("selected token 0 (entry 0) for sequence 1, kv_head 0 is out of range [0, length = 0) of layer 1"));
  unchanged();
  cnt = {3, 0};
  idx = {5, 9, 7, 0, 0, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3)), Contains("selected token 9 (entry 1) for sequence 0, kv_head 0 is out of range [0, length = 8)"));
  idx = {6, 5, 7, 0, 0, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3)), Contains("expected strictly ascending indices"));
  idx = {1, 5, 7, 0, 0, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3)), Contains("selected token 1 (entry 0) for sequence 0, kv_head 0 of layer 1 was evicted"));
  idx = {5, 6, 7, 0, 0, 0};
  cnt = {4, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3)), Contains("selection count 4 of row 0, kv_head 0 is out of range [0, capacity = 3]"));
  cnt = {3, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(3, 1, 2)), Contains("selection holds 3 sequences, expected [0, the pool's num_seqs = 2]"));
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 2, 1)), Contains("selection has 2 kv heads, the pool 1"));
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 4)), Contains("selection indices hold 6 entries, expected [2, 1, 4] = 8"));
  ids = {0, 0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3), ids), Contains("seq_ids[0] and seq_ids[1] both name sequence 0"));
  ids = {0, 2};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3), ids), Contains("seq_ids[1] = 2 is out of range [0, 2)"));
  ids = {0};
  REQUIRE_THROWS_WITH(p.observe(1, view(2, 1, 3), ids), Contains("seq_ids holds 1 entries, expected none or num_seqs = 2"));
  REQUIRE_THROWS_WITH(p.observe(-1, view(2, 1, 3)), Contains("layer -1 is out of range [0, 2)"));
  unchanged();
  p.observe(1, view(2, 1, 3));
  for (int t : {5, 6, 7}) CHECK(p.key(1, 0, 0, t) == 1);
  p.reset(0);
  CHECK(p.length(1, 0) == 0);
  CHECK(p.resident_count(1, 0, 0) == 0);
  REQUIRE_THROWS_WITH(p.reset(5), Contains("sequence 5 is out of range [0, 2)"));
}

TEST_CASE("host_pool: its state in the caller's memory is the same pool", "[host_pool][workspace]") {
  constexpr int L = 2, S = 2, H = 2, T = 60, C = 9;
  const host_pool::config cfg{{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                               .max_tokens = T},
                              C, eviction::lru, 2};
  const std::size_t need = host_pool::workspace_bytes(cfg);
  // 8 bytes per key and per layer's clock, 4 per slot of a token, per token of a slot, per count.
  const std::size_t rows = static_cast<std::size_t>(L) * S * H;
  REQUIRE(need == 8 * (rows * T + L) + 4 * (rows * T + rows * C + 2 * rows + static_cast<std::size_t>(L) * S));
  REQUIRE(host_pool::workspace_alignment == 8);
  // The caller's memory, dirty, with a tail that must stay untouched.
  kvscout::host_workspace mem(need + 16, 64);
  std::memset(mem.span().data(), 0xAB, mem.span().size());
  host_pool theirs(cfg, mem.span().subspan(0, need));
  host_pool own(cfg);
  std::mt19937 rng(7);
  std::vector<int32_t> idx(static_cast<std::size_t>(S * H * T)), cnt(static_cast<std::size_t>(S * H));
  for (int t = 0; t < T; ++t)
    for (int l = 0; l < L; ++l) {
      // Each row selects a seeded subset of its resident tokens (the same for both pools).
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < H; ++h) {
          std::vector<int32_t> live(static_cast<std::size_t>(std::max(1, own.length(l, s))));
          const int n = own.length(l, s) == 0 ? 0 : own.live_tokens(l, s, h, live);
          int c = 0;
          for (int i = 0; i < n; ++i)
            if (rng() % 3 == 0) idx[static_cast<std::size_t>((s * H + h) * T + c++)] = live[static_cast<std::size_t>(i)];
          cnt[static_cast<std::size_t>(s * H + h)] = c;
        }
      const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, S, H, T};
      own.observe(l, sel);
      theirs.observe(l, sel);
      for (int s = 0; s < S; ++s) {
        own.append(l, s, t);
        theirs.append(l, s, t);
        for (int h = 0; h < H; ++h) REQUIRE(theirs.evicted(l, s, h) == own.evicted(l, s, h));
      }
    }
  int evictions = 0;
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        CAPTURE(l, s, h);
        REQUIRE(resident_tokens(theirs, l, s, h) == resident_tokens(own, l, s, h));
        const auto a = theirs.slots(l, s, h), b = own.slots(l, s, h);
        REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        for (int t = 0; t < T; ++t) {
          evictions += a[static_cast<std::size_t>(t)] < 0;
          if (a[static_cast<std::size_t>(t)] >= 0) REQUIRE(theirs.key(l, s, h, t) == own.key(l, s, h, t));
        }
        // The slots live in the caller's memory.
        const auto* base = mem.span().data();
        REQUIRE(reinterpret_cast<const std::byte*>(a.data()) >= base);
        REQUIRE(reinterpret_cast<const std::byte*>(a.data() + a.size()) <= base + need);
      }
  REQUIRE(evictions == L * S * H * (T - C));  // the pools filled and evicted
  for (std::size_t i = need; i < need + 16; ++i) REQUIRE(mem.span()[i] == std::byte{0xAB});
  // A moved pool keeps its state.
  host_pool moved(std::move(theirs));
  REQUIRE(resident_tokens(moved, 1, 1, 1) == resident_tokens(own, 1, 1, 1));
  // Too little or misaligned memory is refused, naming the sizes; a bad config before that.
  REQUIRE_THROWS_WITH(host_pool(cfg, mem.span().subspan(0, need - 1)),
                      Contains("host_pool workspace: the caller's memory holds " + std::to_string(need - 1) +
                               " bytes, expected at least " + std::to_string(need)));
  REQUIRE_THROWS_WITH(host_pool(cfg, mem.span().subspan(4, need)), Contains("must be 8-byte aligned"));
  REQUIRE_THROWS_WITH(host_pool::workspace_bytes({{.num_layers = 1, .num_seqs = 1,
                                                   .num_kv_heads = 1, .max_tokens = 8}, 9,
                                                  eviction::lru, 0}),
                      Contains("capacity 9 must be in [1, max_tokens = 8]"));
}
