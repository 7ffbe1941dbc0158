#pragma once
// decode_shape: the dimensions of a decode step, written once. Every part's config holds one as
// `shape` and adds only its own settings; each part checks the fields it uses and ignores the
// rest (a selector has no use for head_dim), so one value configures a whole step:
//
//   const kvscout::decode_shape shape{.num_layers = 30, .num_seqs = 1, .num_kv_heads = 3,
//                                     .num_q_heads = 9, .head_dim = 64, .d_model = 576,
//                                     .max_tokens = 4096, .scale = 0.125f};
//   kvscout::topk_selector_host sel({.shape = shape, .capacity = cap, .budget = cap});
//   kvscout::gather_executor_host<L> ex({.shape = shape, .capacity = cap});

namespace kvscout {

namespace detail {
/// A config's shape is written with designators. Positional values would otherwise fill it by
/// brace elision ({2, 1, 100, ...} as num_layers, num_seqs, ...) and compile to a wrong config; this
/// first member takes no value, so they do not compile.
struct use_designated_initializers {
  explicit use_designated_initializers() = default;
  friend constexpr bool operator==(use_designated_initializers,
                                   use_designated_initializers) noexcept = default;
};
}  // namespace detail

struct decode_shape {
  detail::use_designated_initializers designated_only{};
  int num_layers = 0;    // the model's layers (parts that serve one layer ignore it)
  int num_seqs = 0;      // sequences of a batch, at most
  int num_kv_heads = 0;
  int num_q_heads = 0;   // a multiple of num_kv_heads
  int head_dim = 0;
  int d_model = 0;       // the width of a layer's input x (what speculation multiplies)
  int max_tokens = 0;    // cached tokens per sequence, at most: the cache's and a score row's length
  float scale = 0.f;     // the attention's logit scale, usually 1 / sqrt(head_dim)

  friend bool operator==(const decode_shape&, const decode_shape&) = default;
};

}  // namespace kvscout
