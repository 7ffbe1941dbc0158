#pragma once
// A bounded host KV pool: which cached tokens of each (layer, sequence, kv head) are still held in
// host memory, `capacity` at most, and which physical slot [0, capacity) each one occupies. It
// owns no K / V rows: the engine moves them (into the slot the pool names).
//
// The method is InfiniGen's (Lee et al., OSDI'24, section 4.4; what kvscout does differently:
// docs/architecture.md): once the pool is full, one token is evicted for good before each new
// token enters. The victim is a resident token older than half the sequence (at row i, before
// token i + 1 enters: [0, floor(i / 2)); a wider window where none is), never one of
// [0, pinned_sinks), chosen by
//   eviction::counter  the fewest selections since the token entered (once per selecting step);
//   eviction::lru      the oldest last selection (a never-selected token goes first).
// Ties go to the lowest token index. A new token takes slot `resident` while the pool fills, then
// the victim's slot.
//
// Per step and layer, in InfiniGen's order (a step's selection counts before its token enters):
//   pool.observe(layer, selection.view());   // what the speculation selected (counter / LRU)
//   pool.append(layer, s, t);                // token t = length(s) enters, evicting when full
// Both change nothing on bad input. observe() costs O(selected rows); append() O(length) per kv
// head when it evicts. Readers skip evicted tokens through resident() / slot() / slots() (-1 when
// evicted), live_tokens() or drop_evicted().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// Which resident token a full host pool evicts (host_pool).
enum class eviction {
  counter,  // fewest selections since the token entered
  lru,      // least recently selected
};

inline const char* to_string(eviction e) {
  switch (e) {
    case eviction::counter: return "counter";
    case eviction::lru: return "lru";
  }
  return "?";
}

class host_pool {
 public:
  struct config {
    decode_shape shape{};  // num_layers, num_seqs, num_kv_heads, max_tokens (ids [0, max_tokens))
    int capacity = 0;    // resident tokens per (layer, sequence, kv head), in [1, max_tokens]
    eviction policy = eviction::counter;
    int pinned_sinks = 0;  // tokens [0, pinned_sinks) are never evicted; < capacity
  };
  using config_type = config;

  /// The bytes of the pool's state. Checks the config.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    const sizes z = sizes_of(cfg);
    const char* what = "host_pool state bytes";
    const std::size_t wide = detail::checked_sum(what, z.keys, z.steps);
    const std::size_t narrow = detail::checked_sum(
        what, detail::checked_sum(what, z.keys, z.tokens),
        detail::checked_sum(what, detail::checked_size(what, z.rows, 2), z.lens));
    return detail::checked_sum(what, detail::checked_size(what, wide, sizeof(std::int64_t)),
                               detail::checked_size(what, narrow, sizeof(int)));
  }
  static constexpr std::size_t workspace_alignment = alignof(std::int64_t);
  static_assert(sizeof(int) == sizeof(std::int32_t), "host_pool carves its slots and tokens as one int array");

  explicit host_pool(const config& cfg) : own_(workspace_bytes(cfg)) { init(cfg, own_.span()); }
  /// The state in the caller's memory: at least workspace_bytes(cfg) bytes at workspace_alignment,
  /// initialised here (an empty pool), never freed here, not shared while the pool lives.
  host_pool(const config& cfg, host_span<std::byte> workspace) {
    detail::check_cache_memory("host_pool workspace", workspace, workspace_bytes(cfg), workspace_alignment);
    init(cfg, workspace);
  }
  host_pool(host_pool&&) noexcept = default;
  host_pool& operator=(host_pool&&) noexcept = default;
  host_pool(const host_pool&) = delete;
  host_pool& operator=(const host_pool&) = delete;

 private:
  struct sizes {
    std::size_t rows, keys, tokens, lens, steps;  // elements
  };
  static sizes sizes_of(const config& cfg) {
    const std::size_t rows =
        detail::checked_size("host_pool rows (layers x seqs x kv heads)", cfg.shape.num_layers,
                             cfg.shape.num_seqs, cfg.shape.num_kv_heads);
    return {rows,
            detail::checked_size("host_pool keys (rows x max_tokens)", rows, cfg.shape.max_tokens),
            detail::checked_size("host_pool slots (rows x capacity)", rows, cfg.capacity),
            static_cast<std::size_t>(cfg.shape.num_layers) * cfg.shape.num_seqs,
            static_cast<std::size_t>(cfg.shape.num_layers)};
  }
  void init(const config& cfg, host_span<std::byte> memory) {
    cfg_ = cfg;
    const sizes z = sizes_of(cfg);
    auto* wide = reinterpret_cast<std::int64_t*>(memory.data());
    key_ = {wide, z.keys};
    step_ = {wide + z.keys, z.steps};
    auto* narrow = reinterpret_cast<int*>(wide + z.keys + z.steps);
    slot_ = {narrow, z.keys};
    token_ = {narrow + z.keys, z.tokens};
    resident_ = {narrow + z.keys + z.tokens, z.rows};
    evicted_ = {narrow + z.keys + z.tokens + z.rows, z.rows};
    len_ = {narrow + z.keys + z.tokens + 2 * z.rows, z.lens};
    std::fill(key_.begin(), key_.end(), 0);
    std::fill(step_.begin(), step_.end(), 0);
    std::fill(slot_.begin(), slot_.end(), -1);
    std::fill(token_.begin(), token_.end(), -1);
    std::fill(resident_.begin(), resident_.end(), 0);
    std::fill(evicted_.begin(), evicted_.end(), -1);
    std::fill(len_.begin(), len_.end(), 0);
  }
  static void check_config(const config& cfg) {
    KVSCOUT_EXPECTS(cfg.shape.num_layers > 0 && cfg.shape.num_seqs > 0 &&
                        cfg.shape.num_kv_heads > 0 && cfg.shape.max_tokens > 0,
                    "host_pool needs positive sizes, got num_layers ", cfg.shape.num_layers,
                    ", num_seqs ", cfg.shape.num_seqs, ", num_kv_heads ", cfg.shape.num_kv_heads,
                    ", max_tokens ", cfg.shape.max_tokens);
    KVSCOUT_EXPECTS(cfg.capacity > 0 && cfg.capacity <= cfg.shape.max_tokens, "host_pool capacity ",
                    cfg.capacity, " must be in [1, max_tokens = ", cfg.shape.max_tokens, "]");
    KVSCOUT_EXPECTS(cfg.policy == eviction::counter || cfg.policy == eviction::lru,
                    "host_pool eviction policy ", static_cast<int>(cfg.policy),
                    " is not eviction::counter (0) or eviction::lru (1)");
    KVSCOUT_EXPECTS(cfg.pinned_sinks >= 0 && cfg.pinned_sinks < cfg.capacity, "pinned_sinks ",
                    cfg.pinned_sinks, " must be in [0, capacity = ", cfg.capacity,
                    "): the pool must be able to evict a token that is not pinned");
  }

 public:

  /// Counts the step's selection of `layer`: row s of the view is sequence seq_ids[s] (s when
  /// seq_ids is empty). Every selected token must be resident (drop_evicted() removes the others).
  /// Advances the layer's LRU clock by one.
  void observe(int layer, const selection_view<host_space>& sel,
               host_span<const int32_t> seq_ids = {}) {
    check_layer(layer);
    check_selection(layer, sel, seq_ids);
    const std::int64_t now = ++step_[static_cast<std::size_t>(layer)];
    for (int r = 0; r < sel.num_seqs; ++r) {
      const int s = seq_ids.empty() ? r : seq_ids[static_cast<std::size_t>(r)];
      for (int h = 0; h < sel.num_kv_heads; ++h) {
        const int32_t* idx = sel.indices.data() + sel.row(r, h) * static_cast<std::size_t>(sel.capacity);
        std::int64_t* key = keys(layer, s, h);
        const int n = sel.counts[sel.row(r, h)];
        if (cfg_.policy == eviction::counter)
          for (int i = 0; i < n; ++i) ++key[idx[i]];
        else
          for (int i = 0; i < n; ++i) key[idx[i]] = now;
      }
    }
  }

  /// Token t = length(layer, s) of sequence s enters the pool of `layer` for every kv head; a full
  /// (layer, s, h) pool evicts one token first and t takes its slot (evicted()).
  void append(int layer, int s, int t) {
    check_layer(layer);
    check_seq(s);
    const int len = len_[lin(layer, s)];
    KVSCOUT_EXPECTS(t == len, "token ", t, " appended to sequence ", s, " of layer ", layer,
                    ": expected the next token, length = ", len);
    KVSCOUT_EXPECTS(t < cfg_.shape.max_tokens, "token ", t, " of sequence ", s,
                    " is out of range [0, max_tokens = ", cfg_.shape.max_tokens,
                    "): the pool never grows");
    for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
      const std::size_t r = row(layer, s, h);
      int* slot = slots_of(layer, s, h);
      int32_t* tok = token_.data() + r * static_cast<std::size_t>(cfg_.capacity);
      int free_slot = resident_[r];
      evicted_[r] = -1;
      if (resident_[r] == cfg_.capacity) {
        const int v = victim(layer, s, h, t);
        free_slot = slot[v];
        slot[v] = -1;
        evicted_[r] = v;
        --resident_[r];
      }
      slot[t] = free_slot;
      tok[free_slot] = t;
      keys(layer, s, h)[t] = 0;
      ++resident_[r];
    }
    ++len_[lin(layer, s)];
  }

  void reset(int s) {
    check_seq(s);
    for (int layer = 0; layer < cfg_.shape.num_layers; ++layer) {
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const std::size_t r = row(layer, s, h);
        std::fill_n(keys(layer, s, h), cfg_.shape.max_tokens, 0);
        std::fill_n(slots_of(layer, s, h), cfg_.shape.max_tokens, -1);
        std::fill_n(token_.data() + r * static_cast<std::size_t>(cfg_.capacity), cfg_.capacity, -1);
        resident_[r] = 0;
        evicted_[r] = -1;
      }
      len_[lin(layer, s)] = 0;
    }
  }

  /// Resident or evicted.
  [[nodiscard]] int length(int layer, int s) const {
    check_layer(layer);
    check_seq(s);
    return len_[lin(layer, s)];
  }
  [[nodiscard]] int resident_count(int layer, int s, int h) const {
    check_row(layer, s, h);
    return resident_[row(layer, s, h)];
  }
  [[nodiscard]] int evicted(int layer, int s, int h) const {
    check_row(layer, s, h);
    return evicted_[row(layer, s, h)];
  }
  /// -1 when t was evicted. t in [0, length).
  [[nodiscard]] int slot(int layer, int s, int h, int t) const {
    check_token(layer, s, h, t);
    return slots_of(layer, s, h)[t];
  }
  [[nodiscard]] bool resident(int layer, int s, int h, int t) const { return slot(layer, s, h, t) >= 0; }
  /// -1 when the slot is still empty. i in [0, capacity).
  [[nodiscard]] int token_in_slot(int layer, int s, int h, int i) const {
    check_row(layer, s, h);
    KVSCOUT_EXPECTS(i >= 0 && i < cfg_.capacity, "slot ", i, " is out of range [0, capacity = ",
                    cfg_.capacity, ")");
    return token_[row(layer, s, h) * static_cast<std::size_t>(cfg_.capacity) + static_cast<std::size_t>(i)];
  }
  [[nodiscard]] host_span<const int> slots(int layer, int s, int h) const {
    check_row(layer, s, h);
    return {slots_of(layer, s, h), static_cast<std::size_t>(len_[lin(layer, s)])};
  }
  /// Token t's counter (eviction::counter) or the step of its last selection, 0 if none
  /// (eviction::lru). t in [0, length).
  [[nodiscard]] std::int64_t key(int layer, int s, int h, int t) const {
    check_token(layer, s, h, t);
    return keys(layer, s, h)[t];
  }
  /// Writes the resident tokens below `below` (length(layer, s) when negative), ascending, into
  /// out; returns how many. out must hold them all.
  int live_tokens(int layer, int s, int h, host_span<int32_t> out, int below = -1) const {
    check_row(layer, s, h);
    const int len = len_[lin(layer, s)];
    const int n = below < 0 ? len : below;
    KVSCOUT_EXPECTS(n <= len, "live_tokens below ", n, " of sequence ", s, " of layer ", layer,
                    ": expected at most length = ", len);
    const int* slot = slots_of(layer, s, h);
    int need = 0;
    for (int t = 0; t < n; ++t) need += slot[t] >= 0;
    KVSCOUT_EXPECTS(out.size() >= static_cast<std::size_t>(need) && (need == 0 || out.data() != nullptr),
                    "live_tokens: out holds ", out.size(), " entries, (layer, s, h) = (", layer,
                    ", ", s, ", ", h, ") has ", need, " resident tokens below ", n);
    int c = 0;
    for (int t = 0; t < n; ++t)
      if (slot[t] >= 0) out[static_cast<std::size_t>(c++)] = t;
    return c;
  }
  /// Removes the evicted tokens of `layer` from a selection in place (rows as in observe()), order
  /// kept; returns how many. Indices must be in [0, length) of their sequence.
  int drop_evicted(int layer, const selection_buffers<host_space>& sel,
                   host_span<const int32_t> seq_ids = {}) const {
    check_layer(layer);
    check_selection(layer, sel.view(), seq_ids, /*allow_evicted=*/true);
    int removed = 0;
    for (int r = 0; r < sel.num_seqs; ++r) {
      const int s = seq_ids.empty() ? r : seq_ids[static_cast<std::size_t>(r)];
      for (int h = 0; h < sel.num_kv_heads; ++h) {
        int32_t* idx = sel.indices.data() + sel.view().row(r, h) * static_cast<std::size_t>(sel.capacity);
        int32_t& n = sel.counts[sel.view().row(r, h)];
        const int* slot = slots_of(layer, s, h);
        int k = 0;
        for (int i = 0; i < n; ++i)
          if (slot[idx[i]] >= 0) idx[k++] = idx[i];
        removed += n - k;
        n = k;
      }
    }
    return removed;
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  // The smallest key among the resident, unpinned tokens of InfiniGen's window
  // [0, floor((t - 1) / 2)), lowest index on ties; where that window holds none, of
  // [0, t - floor((capacity - pinned_sinks) / 2)).
  int victim(int layer, int s, int h, int t) const {
    const int* slot = slots_of(layer, s, h);
    const std::int64_t* key = keys(layer, s, h);
    auto scan = [&](int lo, int hi) {
      int best = -1;
      std::int64_t best_key = std::numeric_limits<std::int64_t>::max();
      for (int x = lo; x < hi; ++x)
        if (slot[x] >= 0 && key[x] < best_key) best = x, best_key = key[x];
      return best;
    };
    const int lo = cfg_.pinned_sinks;
    const int window = t >= 1 ? (t - 1) / 2 : 0;
    int v = scan(lo, window);
    if (v < 0) v = scan(lo, t - (cfg_.capacity - cfg_.pinned_sinks) / 2);
    // At most pinned_sinks resident tokens lie below lo and at most
    // floor((capacity - pinned_sinks) / 2) above the widened window: one is always found.
    KVSCOUT_EXPECTS(v >= 0, "host_pool found no token to evict in (layer, s, h) = (", layer, ", ",
                    s, ", ", h, ") before token ", t, " (internal error)");
    return v;
  }

  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
  }
  void check_seq(int s) const {
    KVSCOUT_EXPECTS(s >= 0 && s < cfg_.shape.num_seqs, "sequence ", s, " is out of range [0, ",
                    cfg_.shape.num_seqs, ")");
  }
  void check_row(int layer, int s, int h) const {
    check_layer(layer);
    check_seq(s);
    KVSCOUT_EXPECTS(h >= 0 && h < cfg_.shape.num_kv_heads, "kv_head ", h, " is out of range [0, ",
                    cfg_.shape.num_kv_heads, ")");
  }
  void check_token(int layer, int s, int h, int t) const {
    check_row(layer, s, h);
    const int len = len_[lin(layer, s)];
    KVSCOUT_EXPECTS(t >= 0 && t < len, "token ", t, " of sequence ", s, " of layer ", layer,
                    " is out of range [0, length = ", len, ")");
  }
  void check_selection(int layer, const selection_view<host_space>& sel,
                       host_span<const int32_t> seq_ids, bool allow_evicted = false) const {
    KVSCOUT_EXPECTS(sel.num_seqs >= 0 && sel.num_seqs <= cfg_.shape.num_seqs, "selection holds ",
                    sel.num_seqs,
                    " sequences, expected [0, the pool's num_seqs = ", cfg_.shape.num_seqs, "]");
    KVSCOUT_EXPECTS(sel.num_kv_heads == cfg_.shape.num_kv_heads, "selection has ", sel.num_kv_heads,
                    " kv heads, the pool ", cfg_.shape.num_kv_heads);
    KVSCOUT_EXPECTS(sel.capacity >= 0, "selection capacity ", sel.capacity, " is negative");
    const std::size_t rows = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads;
    KVSCOUT_EXPECTS(sel.counts.size() >= rows, "selection counts hold ", sel.counts.size(),
                    " entries, expected num_seqs x num_kv_heads = ", rows);
    KVSCOUT_EXPECTS(sel.indices.size() >= rows * static_cast<std::size_t>(sel.capacity),
                    "selection indices hold ", sel.indices.size(), " entries, expected [",
                    sel.num_seqs, ", ", sel.num_kv_heads, ", ", sel.capacity, "] = ",
                    rows * static_cast<std::size_t>(sel.capacity));
    KVSCOUT_EXPECTS(seq_ids.empty() || seq_ids.size() == static_cast<std::size_t>(sel.num_seqs),
                    "seq_ids holds ", seq_ids.size(), " entries, expected none or num_seqs = ",
                    sel.num_seqs);
    for (std::size_t r = 0; r < seq_ids.size(); ++r) {
      const int s = seq_ids[r];
      KVSCOUT_EXPECTS(s >= 0 && s < cfg_.shape.num_seqs, "seq_ids[", r, "] = ", s,
                      " is out of range [0, ", cfg_.shape.num_seqs, ")");
      for (std::size_t q = 0; q < r; ++q)
        KVSCOUT_EXPECTS(seq_ids[q] != s, "seq_ids[", q, "] and seq_ids[", r,
                        "] both name sequence ", s, ": expected one row per sequence");
    }
    for (int r = 0; r < sel.num_seqs; ++r) {
      const int s = seq_ids.empty() ? r : seq_ids[static_cast<std::size_t>(r)];
      const int len = len_[lin(layer, s)];
      for (int h = 0; h < sel.num_kv_heads; ++h) {
        const int n = sel.counts[sel.row(r, h)];
        KVSCOUT_EXPECTS(n >= 0 && n <= sel.capacity, "selection count ", n, " of row ", r,
                        ", kv_head ", h, " is out of range [0, capacity = ", sel.capacity, "]");
        const int32_t* idx = sel.indices.data() + sel.row(r, h) * static_cast<std::size_t>(sel.capacity);
        const int* slot = slots_of(layer, s, h);
        for (int i = 0; i < n; ++i) {
          const int t = idx[i];
          KVSCOUT_EXPECTS(t >= 0 && t < len, "selected token ", t, " (entry ", i,
                          ") for sequence ", s, ", kv_head ", h, " is out of range [0, length = ",
                          len, ") of layer ", layer);
          KVSCOUT_EXPECTS(i == 0 || t > idx[i - 1], "selected token ", t, " (entry ", i,
                          ") for sequence ", s, ", kv_head ", h,
                          " does not follow the previous entry ", i == 0 ? -1 : idx[i - 1],
                          ": expected strictly ascending indices");
          KVSCOUT_EXPECTS(allow_evicted || slot[t] >= 0, "selected token ", t, " (entry ", i,
                          ") for sequence ", s, ", kv_head ", h, " of layer ", layer,
                          " was evicted from the host pool: drop_evicted() removes such entries");
        }
      }
    }
  }

  std::size_t lin(int layer, int s) const {
    return static_cast<std::size_t>(layer) * cfg_.shape.num_seqs + s;
  }
  std::size_t row(int layer, int s, int h) const {
    return lin(layer, s) * cfg_.shape.num_kv_heads + h;
  }
  std::int64_t* keys(int layer, int s, int h) {
    return key_.data() + row(layer, s, h) * static_cast<std::size_t>(cfg_.shape.max_tokens);
  }
  const std::int64_t* keys(int layer, int s, int h) const {
    return key_.data() + row(layer, s, h) * static_cast<std::size_t>(cfg_.shape.max_tokens);
  }
  int* slots_of(int layer, int s, int h) {
    return slot_.data() + row(layer, s, h) * static_cast<std::size_t>(cfg_.shape.max_tokens);
  }
  const int* slots_of(int layer, int s, int h) const {
    return slot_.data() + row(layer, s, h) * static_cast<std::size_t>(cfg_.shape.max_tokens);
  }

  config cfg_;
  host_buffer<std::byte> own_;        // the state, where the caller gave no memory
  host_span<std::int64_t> key_;       // [layers, seqs, heads, max_tokens] counter or last-use step
  host_span<std::int64_t> step_;      // [layers] observe() calls: the LRU clock
  host_span<int> slot_;               // [layers, seqs, heads, max_tokens] slot, -1 evicted / absent
  host_span<int32_t> token_;          // [layers, seqs, heads, capacity] token in slot, -1 empty
  host_span<int> resident_;           // [layers, seqs, heads]
  host_span<int> evicted_;            // [layers, seqs, heads] victim of the last append, -1 none
  host_span<int> len_;                // [layers, seqs]
};

}  // namespace kvscout
