// The other speculation policies for Python, the baselines InfiniGen is measured against:
// streaming (StreamingLLM's sinks and recent window), the oracle (the true scores of a layer's own
// query over its cache), Quest (page bounds of the post-RoPE keys) and H2O (accumulated attention
// mass). streaming and the oracle keep no state: one call each. Quest and H2O keep theirs in the
// caller's workspace array, and come back as closures that hold the policy and that array.

#include <tvm/ffi/container/array.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "checks.hpp"
#include "kv_args.hpp"
#include "kvscout/kvscout.hpp"

namespace {

using namespace kvscout_py;

kvscout::gqa_aggregation aggregation_of(std::int64_t v) {
  if (v < 0 || v > 2)
    TVM_FFI_THROW(ValueError) << "aggregation = " << v << ", expected a value in [0, 3)";
  return static_cast<kvscout::gqa_aggregation>(v);
}

// seq_lens [S] int32, seq_ids [S] int32 or empty; out [S, H, T] float32.
kvscout::score_context<kvscout::host_space> context_of(int S, const ffi::TensorView& seq_lens,
                                                       const ffi::TensorView& seq_ids) {
  kvscout::score_context<kvscout::host_space> ctx{};
  ctx.seq_lens = {int32_data(seq_lens, "seq_lens", {S}), static_cast<std::size_t>(S)};
  if (seq_ids.numel() > 0)
    ctx.seq_ids = {int32_data(seq_ids, "seq_ids", {S}), static_cast<std::size_t>(S)};
  return ctx;
}

kvscout::score_buffer<kvscout::host_space> scores_of(const ffi::TensorView& out) {
  expect_dtype(out, "out", kDLFloat, 32);
  expect(out, "out", {-1, -1, -1});
  return {span_of<float>(out), as_int(out.size(0), "num_seqs"), as_int(out.size(1), "num_kv_heads"),
          as_int(out.size(2), "max_tokens")};
}

// ---- streaming ---------------------------------------------------------------------------------

void streaming_score(std::int64_t sinks, ffi::TensorView seq_lens, ffi::TensorView seq_ids,
                     ffi::TensorView out) {
  const auto buf = scores_of(out);
  const auto ctx = context_of(buf.num_seqs, seq_lens, seq_ids);
  expect_disjoint({{"out", &out}}, {{"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}});
  guarded([&] {
    kvscout::streaming_policy_host p({.shape = {.num_kv_heads = buf.num_kv_heads},
                                      .sinks = as_int(sinks, "sinks")});
    p.score(ctx, buf);
    return 0;
  });
}

// ---- the oracle --------------------------------------------------------------------------------

// q [S, Hq, D] float32 (after RoPE) over one layer's cache (kv_args.hpp's forms) -> out [S, H, T].
void oracle_score(std::int64_t kind, std::int64_t order, double scale, std::int64_t aggregation,
                  ffi::TensorView q, ffi::TensorView seq_lens, ffi::TensorView seq_ids,
                  ffi::Array<ffi::Tensor> cache, ffi::TensorView out) {
  if (cache.size() != 6)
    TVM_FFI_THROW(ValueError) << "a cache crosses as 6 tensors, got " << cache.size();
  const kv_tensors kv{cache[0], cache[1], seq_lens, cache[2], cache[3], cache[4], cache[5]};
  const auto buf = scores_of(out);
  const auto agg = aggregation_of(aggregation);
  expect_dtype(q, "q", kDLFloat, 32);
  expect(q, "q", {buf.num_seqs, -1, -1});
  expect_disjoint({{"out", &out}},
                  {{"q", &q}, {"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}, {"k_cache", &kv.k},
                   {"v_cache", &kv.v}, {"block_table", &kv.block_table}, {"indptr", &kv.indptr},
                   {"page_ids", &kv.page_ids}, {"last_page_len", &kv.last_page_len}});
  auto ctx = context_of(buf.num_seqs, seq_lens, seq_ids);
  ctx.q = span_of<const float>(q);
  expect(kv.k, "k_cache", {-1, -1, -1, -1});
  with_element(kv.k, "k_cache", q.size(2), [&]<class T, int D>() {
    with_layout<T, D>(kv_kind_of(kind), order, [&]<class Layout>() {
      const auto src = kv_view_of<Layout>(kv, buf.num_seqs, 0);
      guarded([&] {
        kvscout::decode_shape shape;
        shape.num_q_heads = as_int(q.size(1), "num_q_heads");
        shape.scale = static_cast<float>(scale);
        const kvscout::oracle_policy_host<Layout> p({.shape = shape, .aggregation = agg}, {src});
        p.score(0, ctx, buf);
        return 0;
      });
    });
  });
}

// ---- Quest and H2O: state in the caller's workspace --------------------------------------------

template <class P>
struct held {
  ffi::Tensor workspace;
  std::optional<P> policy;
  std::mutex one_call;
};

kvscout::decode_shape policy_shape(const ffi::Array<std::int64_t>& d, double scale) {
  if (d.size() != 6)
    TVM_FFI_THROW(ValueError) << "dims holds " << d.size() << " numbers, expected [num_layers, "
                              << "num_seqs, num_kv_heads, num_q_heads, head_dim, max_tokens]";
  kvscout::decode_shape s;
  s.num_layers = as_int(d[0], "num_layers");
  s.num_seqs = as_int(d[1], "num_seqs");
  s.num_kv_heads = as_int(d[2], "num_kv_heads");
  s.num_q_heads = as_int(d[3], "num_q_heads");
  s.head_dim = as_int(d[4], "head_dim");
  s.max_tokens = as_int(d[5], "max_tokens");
  s.scale = static_cast<float>(scale);
  return s;
}

template <class F>
void with_head_dim(int D, F&& f) {
  if (D == 64)
    f.template operator()<64>();
  else if (D == 128)
    f.template operator()<128>();
  else
    TVM_FFI_THROW(ValueError) << "head_dim " << D << " was not built, expected 64 or 128";
}

std::int64_t quest_workspace_bytes(ffi::Array<std::int64_t> dims, std::int64_t page_size) {
  const kvscout::decode_shape s = policy_shape(dims, 1.0);
  std::int64_t n = 0;
  with_head_dim(s.head_dim, [&]<int D>() {
    n = guarded([&] {
      return static_cast<std::int64_t>(kvscout::quest_policy_host<D>::workspace_bytes(
          {.shape = s, .page_size = as_int(page_size, "page_size")}));
    });
  });
  return n;
}

// [append(layer, keys [n, H, D] float32 after RoPE, seq_ids, token_ids),
//  score(layer, q [S, Hq, D] float32, seq_lens, seq_ids, out [S, H, max_tokens])].
ffi::Array<ffi::Function> make_quest_policy(ffi::Array<std::int64_t> dims, double scale,
                                            std::int64_t page_size, std::int64_t aggregation,
                                            ffi::Tensor workspace) {
  const kvscout::decode_shape s = policy_shape(dims, scale);
  const auto agg = aggregation_of(aggregation);
  expect_dtype(workspace, "workspace", kDLUInt, 8);
  expect(workspace, "workspace", {-1});
  ffi::Array<ffi::Function> calls;
  with_head_dim(s.head_dim, [&]<int D>() {
    using P = kvscout::quest_policy_host<D>;
    auto h = std::make_shared<held<P>>();
    h->workspace = workspace;
    guarded([&] {
      h->policy.emplace(typename P::config{.shape = s, .page_size = as_int(page_size, "page_size"),
                                           .aggregation = agg},
                        span_of<std::byte>(workspace));
      return 0;
    });
    auto append = [h, s](std::int64_t layer, ffi::TensorView keys, ffi::TensorView seq_ids,
                         ffi::TensorView token_ids) {
      expect_dtype(keys, "keys", kDLFloat, 32);
      expect(keys, "keys", {-1, s.num_kv_heads, D});
      const std::int64_t n = keys.size(0);
      const std::int32_t* ids = int32_data(seq_ids, "seq_ids", {n});
      const std::int32_t* toks = int32_data(token_ids, "token_ids", {n});
      const float* k = span_of<const float>(keys).data();
      const std::lock_guard lock(h->one_call);
      guarded([&] {
        for (std::int64_t j = 0; j < n; ++j)
          h->policy->append(as_int(layer, "layer"), ids[j], toks[j], nullptr,
                            k + j * s.num_kv_heads * D);
        return 0;
      });
    };
    auto score = [h, s](std::int64_t layer, ffi::TensorView q, ffi::TensorView seq_lens,
                        ffi::TensorView seq_ids, ffi::TensorView out) {
      expect_dtype(q, "q", kDLFloat, 32);
      expect(q, "q", {s.num_seqs, s.num_q_heads, D});
      const auto buf = scores_of(out);
      auto ctx = context_of(buf.num_seqs, seq_lens, seq_ids);
      ctx.q = span_of<const float>(q);
      const ffi::TensorView ws = h->workspace;
      expect_disjoint({{"out", &out}, {"the policy's workspace", &ws}},
                      {{"q", &q}, {"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}});
      const std::lock_guard lock(h->one_call);
      guarded([&] {
        h->policy->score(as_int(layer, "layer"), ctx, buf);
        return 0;
      });
    };
    calls = {ffi::Function::FromTyped(std::move(append)), ffi::Function::FromTyped(std::move(score))};
  });
  return calls;
}

std::int64_t h2o_workspace_bytes(ffi::Array<std::int64_t> dims) {
  return guarded([&] {
    return static_cast<std::int64_t>(
        kvscout::h2o_policy_host::workspace_bytes({.shape = policy_shape(dims, 1.0)}));
  });
}

// The rows a step attended, as H2O's observe reads them: the selection's tokens only (observe
// never loads a row's keys or values, so those are not given).
struct selected_rows {
  static constexpr int head_dim = 1;
  kvscout::selection_view<kvscout::host_space> sel;
  int num_seqs() const { return sel.num_seqs; }
  int num_kv_heads() const { return sel.num_kv_heads; }
  int rows(int s, int h) const { return sel.counts[sel.row(s, h)]; }
  int token(int s, int h, int i) const {
    return sel.indices[sel.row(s, h) * static_cast<std::size_t>(sel.capacity) +
                       static_cast<std::size_t>(i)];
  }
  void load_k(int, int, int, float*) const { unreadable(); }
  void load_v(int, int, int, float*) const { unreadable(); }
  [[noreturn]] static void unreadable() {
    TVM_FFI_THROW(RuntimeError) << "kvscout binding: H2O's rows carry no keys or values";
  }
};
static_assert(kvscout::attention_rows<selected_rows>);

// [score(layer, seq_lens, seq_ids, out), observe(layer, indices, counts, probs [S, H, stride],
//  seq_lens, seq_ids, has_current), reset(s)].
ffi::Array<ffi::Function> make_h2o_policy(ffi::Array<std::int64_t> dims, ffi::Tensor workspace) {
  using P = kvscout::h2o_policy_host;
  const kvscout::decode_shape s = policy_shape(dims, 1.0);
  expect_dtype(workspace, "workspace", kDLUInt, 8);
  expect(workspace, "workspace", {-1});
  auto h = std::make_shared<held<P>>();
  h->workspace = workspace;
  guarded([&] {
    h->policy.emplace(P::config{.shape = s}, span_of<std::byte>(workspace));
    return 0;
  });
  auto score = [h](std::int64_t layer, ffi::TensorView seq_lens, ffi::TensorView seq_ids,
                   ffi::TensorView out) {
    const auto buf = scores_of(out);
    const auto ctx = context_of(buf.num_seqs, seq_lens, seq_ids);
    const ffi::TensorView ws = h->workspace;
    expect_disjoint({{"out", &out}, {"the policy's workspace", &ws}},
                    {{"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}});
    const std::lock_guard lock(h->one_call);
    guarded([&] {
      h->policy->score(as_int(layer, "layer"), ctx, buf);
      return 0;
    });
  };
  auto observe = [h](std::int64_t layer, ffi::TensorView indices, ffi::TensorView counts,
                     ffi::TensorView probs, ffi::TensorView seq_lens, ffi::TensorView seq_ids,
                     bool has_current) {
    expect_dtype(indices, "indices", kDLInt, 32);
    expect(indices, "indices", {-1, -1, -1});
    const int S = as_int(indices.size(0), "num_seqs"), H = as_int(indices.size(1), "num_kv_heads");
    expect_dtype(counts, "counts", kDLInt, 32);
    expect(counts, "counts", {S, H});
    expect_dtype(probs, "probs", kDLFloat, 32);
    expect(probs, "probs", {S, H, -1});
    const auto ctx = context_of(S, seq_lens, seq_ids);
    const ffi::TensorView ws = h->workspace;
    expect_disjoint({{"the policy's workspace", &ws}},
                    {{"indices", &indices}, {"counts", &counts}, {"probs", &probs},
                     {"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}});
    const selected_rows rows{{span_of<const std::int32_t>(indices),
                              span_of<const std::int32_t>(counts), S, H,
                              as_int(indices.size(2), "capacity")}};
    const std::lock_guard lock(h->one_call);
    guarded([&] {
      h->policy->observe(as_int(layer, "layer"), ctx, rows, span_of<const float>(probs),
                         as_int(probs.size(2), "stride"), has_current);
      return 0;
    });
  };
  auto reset = [h](std::int64_t seq) {
    const std::lock_guard lock(h->one_call);
    guarded([&] {
      h->policy->reset(as_int(seq, "s"));
      return 0;
    });
  };
  return {ffi::Function::FromTyped(std::move(score)), ffi::Function::FromTyped(std::move(observe)),
          ffi::Function::FromTyped(std::move(reset))};
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(streaming_score, streaming_score);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(oracle_score, oracle_score);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quest_workspace_bytes, quest_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_quest_policy, make_quest_policy);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(h2o_workspace_bytes, h2o_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_h2o_policy, make_h2o_policy);
