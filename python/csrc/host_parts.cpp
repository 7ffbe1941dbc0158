// kvscout's host parts for Python, through apache-tvm-ffi: each function takes DLPack tensors
// (NumPy arrays, CPU torch tensors) and plain numbers, checks them, builds the C++ part over the
// caller's memory and runs it. Nothing here allocates a tensor: outputs and workspaces are the
// caller's (python/kvscout/ sizes and allocates them where the caller does not). Errors reach
// Python as exceptions naming the bad value: TypeError for a dtype, ValueError for the rest (a
// kvscout::error's message verbatim).
//
// Instances built: K / V elements float32, float16, bfloat16; head_dim 64 and 128; contiguous
// layouts NHD and HND. Others raise.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "checks.hpp"
#include "kv_args.hpp"
#include "kvscout/kvscout.hpp"

namespace {

using namespace kvscout_py;

kvscout::selection_view<kvscout::host_space> selection_of(const ffi::TensorView& indices,
                                                          const ffi::TensorView& counts) {
  expect_dtype(indices, "indices", kDLInt, 32);
  expect_dtype(counts, "counts", kDLInt, 32);
  expect(indices, "indices", {-1, -1, -1});
  expect(counts, "counts", {indices.size(0), indices.size(1)});
  return {span_of<const std::int32_t>(indices), span_of<const std::int32_t>(counts),
          as_int(indices.size(0), "num_seqs"), as_int(indices.size(1), "num_kv_heads"),
          as_int(indices.size(2), "capacity")};
}

// A selector's scores [S, H, T] float32, their lengths [S] int32 and its uint8 workspace.
void expect_selector_inputs(const ffi::TensorView& scores, const ffi::TensorView& seq_lens,
                            const ffi::TensorView& workspace) {
  expect_dtype(scores, "scores", kDLFloat, 32);
  expect(scores, "scores", {-1, -1, -1});
  expect_dtype(seq_lens, "seq_lens", kDLInt, 32);
  expect(seq_lens, "seq_lens", {scores.size(0)});
  expect_dtype(workspace, "workspace", kDLUInt, 8);
  expect(workspace, "workspace", {-1});
}

// ---- top-k selection ---------------------------------------------------------------------------

kvscout::topk_selector_host::config topk_config(std::int64_t S, std::int64_t H, std::int64_t T,
                                                std::int64_t capacity, std::int64_t budget,
                                                std::int64_t sinks, std::int64_t recent,
                                                double budget_share) {
  return {.shape = {.num_seqs = as_int(S, "num_seqs"), .num_kv_heads = as_int(H, "num_kv_heads"),
                    .max_tokens = as_int(T, "max_tokens")},
          .capacity = as_int(capacity, "capacity"),
          .budget = as_int(budget, "budget"),
          .keep = {.sinks = as_int(sinks, "sinks"), .recent = as_int(recent, "recent")},
          .budget_share = budget_share};
}

std::int64_t topk_workspace_bytes(std::int64_t S, std::int64_t H, std::int64_t T,
                                  std::int64_t capacity, std::int64_t budget, std::int64_t sinks,
                                  std::int64_t recent, double budget_share) {
  return guarded([&] {
    return static_cast<std::int64_t>(kvscout::topk_selector_host::workspace_bytes(
        topk_config(S, H, T, capacity, budget, sinks, recent, budget_share)));
  });
}

// scores [S, H, T] float32, seq_lens [S] int32 -> indices [S, H, capacity], counts [S, H] int32.
void topk_select(ffi::TensorView scores, ffi::TensorView seq_lens, ffi::TensorView indices,
                 ffi::TensorView counts, std::int64_t budget, std::int64_t sinks,
                 std::int64_t recent, double budget_share, ffi::TensorView workspace) {
  expect_selector_inputs(scores, seq_lens, workspace);
  const auto sel = selection_of(indices, counts);
  if (indices.size(0) != scores.size(0) || indices.size(1) != scores.size(1))
    TVM_FFI_THROW(ValueError) << "indices: shape " << shape_of(indices) << ", expected ["
                              << scores.size(0) << ", " << scores.size(1) << ", capacity]";
  expect_disjoint({{"indices", &indices}, {"counts", &counts}, {"workspace", &workspace}},
                  {{"scores", &scores}, {"seq_lens", &seq_lens}});
  guarded([&] {
    const auto cfg = topk_config(scores.size(0), scores.size(1), scores.size(2), sel.capacity,
                                 budget, sinks, recent, budget_share);
    kvscout::topk_selector_host topk(cfg, span_of<std::byte>(workspace));
    topk.select({span_of<const float>(scores), span_of<const std::int32_t>(seq_lens), sel.num_seqs,
                 sel.num_kv_heads, cfg.shape.max_tokens},
                {span_of<std::int32_t>(indices), span_of<std::int32_t>(counts), sel.num_seqs,
                 sel.num_kv_heads, sel.capacity});
    return 0;
  });
}

// ---- threshold selection ------------------------------------------------------------------------

kvscout::threshold_selector_host::config threshold_config(std::int64_t S, std::int64_t H,
                                                          std::int64_t T, std::int64_t capacity,
                                                          double alpha, std::int64_t budget,
                                                          std::int64_t rule, std::int64_t sinks,
                                                          std::int64_t recent,
                                                          double budget_share) {
  if (rule != 0 && rule != 1)
    TVM_FFI_THROW(ValueError) << "rule " << rule << ", expected 0 (infinigen_mean) or 1 (per_head)";
  kvscout::threshold_selector_host::config c;
  c.shape.num_seqs = as_int(S, "num_seqs");
  c.shape.num_kv_heads = as_int(H, "num_kv_heads");
  c.shape.max_tokens = as_int(T, "max_tokens");
  c.capacity = as_int(capacity, "capacity");
  c.alpha = static_cast<float>(alpha);
  c.budget = as_int(budget, "budget");
  c.rule = static_cast<kvscout::threshold_rule>(rule);
  c.keep = {.sinks = as_int(sinks, "sinks"), .recent = as_int(recent, "recent")};
  c.budget_share = budget_share;
  return c;
}

std::int64_t threshold_workspace_bytes(std::int64_t S, std::int64_t H, std::int64_t T,
                                       std::int64_t capacity, double alpha, std::int64_t budget,
                                       std::int64_t rule, std::int64_t sinks, std::int64_t recent,
                                       double budget_share) {
  return guarded([&] {
    return static_cast<std::int64_t>(kvscout::threshold_selector_host::workspace_bytes(
        threshold_config(S, H, T, capacity, alpha, budget, rule, sinks, recent, budget_share)));
  });
}

// scores [S, H, T] float32, seq_lens [S] int32 -> indices [S, H, capacity], counts [S, H] int32.
void threshold_select(ffi::TensorView scores, ffi::TensorView seq_lens, ffi::TensorView indices,
                      ffi::TensorView counts, double alpha, std::int64_t budget, std::int64_t rule,
                      std::int64_t sinks, std::int64_t recent, double budget_share,
                      ffi::TensorView workspace) {
  expect_selector_inputs(scores, seq_lens, workspace);
  const auto sel = selection_of(indices, counts);
  if (indices.size(0) != scores.size(0) || indices.size(1) != scores.size(1))
    TVM_FFI_THROW(ValueError) << "indices: shape " << shape_of(indices) << ", expected ["
                              << scores.size(0) << ", " << scores.size(1) << ", capacity]";
  expect_disjoint({{"indices", &indices}, {"counts", &counts}, {"workspace", &workspace}},
                  {{"scores", &scores}, {"seq_lens", &seq_lens}});
  guarded([&] {
    const auto cfg = threshold_config(scores.size(0), scores.size(1), scores.size(2), sel.capacity,
                                      alpha, budget, rule, sinks, recent, budget_share);
    kvscout::threshold_selector_host t(cfg, span_of<std::byte>(workspace));
    t.select({span_of<const float>(scores), span_of<const std::int32_t>(seq_lens), sel.num_seqs,
              sel.num_kv_heads, cfg.shape.max_tokens},
             {span_of<std::int32_t>(indices), span_of<std::int32_t>(counts), sel.num_seqs,
              sel.num_kv_heads, sel.capacity});
    return 0;
  });
}

// ---- the correction step's selection ---------------------------------------------------------

kvscout::correction_selector_host::config correction_config(std::int64_t S, std::int64_t H,
                                                            std::int64_t T, std::int64_t capacity,
                                                            std::int64_t extra,
                                                            double total_share) {
  kvscout::correction_selector_host::config c;
  c.shape.num_seqs = as_int(S, "num_seqs");
  c.shape.num_kv_heads = as_int(H, "num_kv_heads");
  c.shape.max_tokens = as_int(T, "max_tokens");
  c.capacity = as_int(capacity, "capacity");
  c.extra = as_int(extra, "extra");
  c.total_share = total_share;
  return c;
}

std::int64_t correction_workspace_bytes(std::int64_t S, std::int64_t H, std::int64_t T,
                                        std::int64_t capacity, std::int64_t extra,
                                        double total_share) {
  return guarded([&] {
    return static_cast<std::int64_t>(kvscout::correction_selector_host::workspace_bytes(
        correction_config(S, H, T, capacity, extra, total_share)));
  });
}

// scores [S, H, T] float32 (the late scores), seq_lens [S], the speculated selection
// (spec_indices [S, H, spec_capacity], spec_counts [S, H]) -> the added rows (indices [S, H,
// capacity], counts [S, H]): the best rows the speculation missed, `extra` at most per row (or up
// to ceil(total_share * len) rows in all).
void correction_select(ffi::TensorView scores, ffi::TensorView seq_lens,
                       ffi::TensorView spec_indices, ffi::TensorView spec_counts,
                       ffi::TensorView indices, ffi::TensorView counts, std::int64_t extra,
                       double total_share, ffi::TensorView workspace) {
  expect_selector_inputs(scores, seq_lens, workspace);
  const auto spec = selection_of(spec_indices, spec_counts);
  const auto sel = selection_of(indices, counts);
  for (const auto* v : {&spec, &sel})
    if (v->num_seqs != scores.size(0) || v->num_kv_heads != scores.size(1))
      TVM_FFI_THROW(ValueError) << "a selection of [" << v->num_seqs << ", " << v->num_kv_heads
                                << ", capacity] for scores of shape " << shape_of(scores)
                                << ", expected [" << scores.size(0) << ", " << scores.size(1)
                                << ", capacity]";
  expect_disjoint({{"indices", &indices}, {"counts", &counts}, {"workspace", &workspace}},
                  {{"scores", &scores}, {"seq_lens", &seq_lens}, {"spec_indices", &spec_indices},
                   {"spec_counts", &spec_counts}});
  guarded([&] {
    const auto cfg = correction_config(scores.size(0), scores.size(1), scores.size(2),
                                       sel.capacity, extra, total_share);
    kvscout::correction_selector_host c(cfg, span_of<std::byte>(workspace));
    c.select({span_of<const float>(scores), span_of<const std::int32_t>(seq_lens), sel.num_seqs,
              sel.num_kv_heads, cfg.shape.max_tokens},
             spec,
             {span_of<std::int32_t>(indices), span_of<std::int32_t>(counts), sel.num_seqs,
              sel.num_kv_heads, sel.capacity});
    return 0;
  });
}

// ---- the host gather ---------------------------------------------------------------------------

// A gather's arguments checked against each other: the rows [S, H, capacity, D] against the
// selection and the cache (kv_args.hpp's forms), their dtypes, that the rows alias nothing.
kvscout::selection_view<kvscout::host_space> check_gather(kv_kind kind, std::int64_t order,
                                                          const kv_tensors& kv,
                                                          const ffi::TensorView& indices,
                                                          const ffi::TensorView& counts,
                                                          const ffi::TensorView& k_rows,
                                                          const ffi::TensorView& v_rows) {
  expect(kv.k, "k_cache", {-1, -1, -1, -1});
  const auto sel = selection_of(indices, counts);
  const std::int64_t H = order == 0 ? kv.k.size(1) : kv.k.size(2), D = kv.k.size(3);
  if (sel.num_kv_heads != H || (kind == kv_kind::contiguous && sel.num_seqs != kv.k.size(0)))
    TVM_FFI_THROW(ValueError) << "indices: shape " << shape_of(indices) << ", expected ["
                              << (kind == kv_kind::contiguous ? std::to_string(kv.k.size(0)) : "S")
                              << ", " << H << ", capacity] (the cache's sequences and KV heads)";
  expect(k_rows, "k_rows", {sel.num_seqs, H, sel.capacity, D});
  expect(v_rows, "v_rows", {sel.num_seqs, H, sel.capacity, D});
  for (const ffi::TensorView* t : {&kv.v, &k_rows, &v_rows})
    if (!is(t->dtype(), kv.k.dtype().code, kv.k.dtype().bits))
      TVM_FFI_THROW(TypeError) << "k_cache is " << dtype_name(kv.k.dtype())
                               << ", v_cache / k_rows / v_rows must be too, got "
                               << dtype_name(t->dtype());
  expect_disjoint({{"k_rows", &k_rows}, {"v_rows", &v_rows}},
                  {{"k_cache", &kv.k}, {"v_cache", &kv.v}, {"seq_lens", &kv.seq_lens},
                   {"block_table", &kv.block_table}, {"indptr", &kv.indptr},
                   {"page_ids", &kv.page_ids}, {"last_page_len", &kv.last_page_len},
                   {"indices", &indices}, {"counts", &counts}});
  return sel;
}

template <class Layout>
void submit(kvscout::gather_executor_host<Layout>& g, const kv_tensors& kv,
            const kvscout::selection_view<kvscout::host_space>& sel, const ffi::TensorView& k_rows,
            const ffi::TensorView& v_rows) {
  using T = typename Layout::element_type;
  const auto src = kv_view_of<Layout>(kv, sel.num_seqs, 0);
  guarded([&] {
    g.submit(src, sel,
             {kvscout::as_writable_bytes(span_of<T>(k_rows)),
              kvscout::as_writable_bytes(span_of<T>(v_rows))})
        .wait();
    return 0;
  });
}

kvscout::host_gather_config gather_config(int S, int H, int capacity, std::int64_t threads) {
  return {.shape = {.num_seqs = S, .num_kv_heads = H},
          .capacity = capacity,
          .threads = as_int(threads, "threads")};
}

// Rows out of the cache `kv` into k_rows / v_rows [S, H, capacity, D], by an executor built for
// this call (its thread pool too).
void gather_rows(kv_kind kind, std::int64_t order, const kv_tensors& kv, ffi::TensorView indices,
                 ffi::TensorView counts, ffi::TensorView k_rows, ffi::TensorView v_rows,
                 std::int64_t threads) {
  const auto sel = check_gather(kind, order, kv, indices, counts, k_rows, v_rows);
  with_element(kv.k, "k_cache", kv.k.size(3), [&]<class T, int D_>() {
    with_layout<T, D_>(kind, order, [&]<class Layout>() {
      using executor = kvscout::gather_executor_host<Layout>;
      const auto cfg = gather_config(sel.num_seqs, sel.num_kv_heads, sel.capacity, threads);
      kvscout::host_workspace ws = guarded([&] { return kvscout::make_workspace<executor>(cfg); });
      executor g = guarded([&] { return executor(cfg, ws.span()); });
      submit(g, kv, sel, k_rows, v_rows);
    });
  });
}

// ---- a gather object: one executor (and its thread pool) for many calls -----------------------

struct gather_calls {
  virtual ~gather_calls() = default;
  virtual void submit(const kv_tensors& kv, const kvscout::selection_view<kvscout::host_space>& sel,
                      const ffi::TensorView& k_rows, const ffi::TensorView& v_rows) = 0;
};

template <class Layout>
struct gather_of final : gather_calls {
  using executor = kvscout::gather_executor_host<Layout>;
  kvscout::host_workspace ws;
  executor g;
  explicit gather_of(const kvscout::host_gather_config& cfg)
      : ws(kvscout::make_workspace<executor>(cfg)), g(cfg, ws.span()) {}
  void submit(const kv_tensors& kv, const kvscout::selection_view<kvscout::host_space>& sel,
              const ffi::TensorView& k_rows, const ffi::TensorView& v_rows) override {
    ::submit(g, kv, sel, k_rows, v_rows);
  }
};

// The gather_executor_host of one layout (kind, order, dtype, head_dim) for [S, H, capacity]
// selections with `threads` threads; returns its submit(cache (6 tensors), seq_lens, indices,
// counts, k_rows, v_rows). Calls take turns (the executor's pool serves one at a time).
ffi::Function make_gather(std::int64_t kind, std::int64_t order, ffi::String dtype,
                          std::int64_t head_dim, std::int64_t S, std::int64_t H,
                          std::int64_t capacity, std::int64_t threads) {
  struct held {
    std::unique_ptr<gather_calls> gather;
    std::mutex one_call;
  };
  auto h = std::make_shared<held>();
  const kv_kind k = kv_kind_of(kind);
  const DLDataType element = element_named(dtype);
  with_element(element, "dtype", head_dim, [&]<class T, int D>() {
    with_layout<T, D>(k, order, [&]<class Layout>() {
      const auto cfg = gather_config(as_int(S, "num_seqs"), as_int(H, "num_kv_heads"),
                                             as_int(capacity, "capacity"), threads);
      h->gather = guarded([&] {
        return std::unique_ptr<gather_calls>(std::make_unique<gather_of<Layout>>(cfg));
      });
    });
  });
  return ffi::Function::FromTyped([h, k, order](ffi::Array<ffi::Tensor> cache,
                                                ffi::TensorView seq_lens, ffi::TensorView indices,
                                                ffi::TensorView counts, ffi::TensorView k_rows,
                                                ffi::TensorView v_rows) {
    if (cache.size() != 6)
      TVM_FFI_THROW(ValueError) << "a cache crosses as 6 tensors, got " << cache.size();
    const kv_tensors kv{cache[0], cache[1], seq_lens, cache[2], cache[3], cache[4], cache[5]};
    const auto sel = check_gather(k, order, kv, indices, counts, k_rows, v_rows);
    const std::lock_guard lock(h->one_call);
    h->gather->submit(kv, sel, k_rows, v_rows);
  });
}

// order: 0 HND (k_cache [S, H, T, D]), 1 NHD ([S, T, H, D]). Rows out: [S, H, capacity, D].
void gather(std::int64_t order, ffi::TensorView k_cache, ffi::TensorView v_cache,
            ffi::TensorView seq_lens, ffi::TensorView indices, ffi::TensorView counts,
            ffi::TensorView k_rows, ffi::TensorView v_rows, std::int64_t threads) {
  gather_rows(kv_kind::contiguous, order, {k_cache, v_cache, seq_lens, no_tensor(), no_tensor(), no_tensor(), no_tensor()}, indices,
              counts, k_rows, v_rows, threads);
}

// order: 0 HND (pages [P, H, page_size, D]), 1 NHD ([P, page_size, H, D]). The page table: vLLM's
// block table (table [S, max_blocks] and seq_lens [S], int32) when `indptr` is empty, else
// FlashInfer's (indptr [S + 1], page_ids [nnz], last_page_len [S]). Rows out: [S, H, capacity, D].
void gather_paged(std::int64_t order, ffi::TensorView k_pages, ffi::TensorView v_pages,
                  ffi::TensorView table, ffi::TensorView seq_lens, ffi::TensorView indptr,
                  ffi::TensorView page_ids, ffi::TensorView last_page_len,
                  ffi::TensorView indices, ffi::TensorView counts, ffi::TensorView k_rows,
                  ffi::TensorView v_rows, std::int64_t threads) {
  gather_rows(indptr.numel() > 0 ? kv_kind::indptr : kv_kind::block_table, order,
              {k_pages, v_pages, seq_lens, table, indptr, page_ids, last_page_len}, indices,
              counts, k_rows, v_rows, threads);
}

// ---- decode attention over gathered rows -------------------------------------------------------

// k_rows / v_rows [S, H, capacity, D] (counts [S, H] rows each), q / out [S, Hq, D] float32, the
// current token's k_cur / v_cur [S, H, D] or empty (none).
// probs [S, H, stride] float32 or empty: each row's probability summed over its query group (the
// current token's last), as H2O's observe reads it.
void decode_attention(ffi::TensorView k_rows, ffi::TensorView v_rows, ffi::TensorView indices,
                      ffi::TensorView counts, ffi::TensorView q, ffi::TensorView out,
                      ffi::TensorView k_cur, ffi::TensorView v_cur, double scale,
                      ffi::TensorView probs) {
  const auto sel = selection_of(indices, counts);
  expect(k_rows, "k_rows", {sel.num_seqs, sel.num_kv_heads, sel.capacity, -1});
  const std::int64_t D = k_rows.size(3);
  expect(v_rows, "v_rows", {sel.num_seqs, sel.num_kv_heads, sel.capacity, D});
  expect_dtype(q, "q", kDLFloat, 32);
  expect(q, "q", {sel.num_seqs, -1, D});
  expect_dtype(out, "out", kDLFloat, 32);
  expect(out, "out", {q.size(0), q.size(1), D});
  const bool current = k_cur.numel() > 0 || v_cur.numel() > 0;
  if (current) {
    expect(k_cur, "k_cur", {sel.num_seqs, sel.num_kv_heads, D});
    expect(v_cur, "v_cur", {sel.num_seqs, sel.num_kv_heads, D});
  }
  for (const auto* t : current ? std::vector{&v_rows, &k_cur, &v_cur} : std::vector{&v_rows})
    if (!is(t->dtype(), k_rows.dtype().code, k_rows.dtype().bits))
      TVM_FFI_THROW(TypeError) << "k_rows is " << dtype_name(k_rows.dtype())
                               << ", v_rows (and k_cur / v_cur) must be too, got "
                               << dtype_name(t->dtype());
  const bool with_probs = probs.numel() > 0;
  if (with_probs) {
    expect_dtype(probs, "probs", kDLFloat, 32);
    expect(probs, "probs", {sel.num_seqs, sel.num_kv_heads, -1});
  }
  expect_disjoint({{"out", &out}, {"probs", &probs}},
                  {{"k_rows", &k_rows}, {"v_rows", &v_rows}, {"indices", &indices},
                   {"counts", &counts}, {"q", &q}, {"k_cur", &k_cur}, {"v_cur", &v_cur}});
  with_element(k_rows, "k_rows", D, [&]<class T_, int D_>() {
    guarded([&] {
      const kvscout::gathered_rows_host<T_, D_> rows(sel, span_of<const T_>(k_rows),
                                                     span_of<const T_>(v_rows));
      const kvscout::current_token<T_> cur =
          current ? kvscout::current_token<T_>{span_of<const T_>(k_cur), span_of<const T_>(v_cur)}
                  : kvscout::current_token<T_>{};
      kvscout::decode_attention_host(
          rows, cur, span_of<const float>(q), span_of<float>(out),
          {.num_q_heads = as_int(q.size(1), "num_q_heads"), .scale = static_cast<float>(scale)},
          with_probs ? span_of<float>(probs) : kvscout::host_span<float>{},
          with_probs ? as_int(probs.size(2), "stride") : 0);
      return 0;
    });
  });
}

std::string device_status_describe(std::int64_t bits) {
  return kvscout::device_status::describe(as_int(bits, "status"));
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_workspace_bytes, topk_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_select, topk_select);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(threshold_workspace_bytes, threshold_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(threshold_select, threshold_select);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(correction_workspace_bytes, correction_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(correction_select, correction_select);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gather, gather);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gather_paged, gather_paged);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_gather, make_gather);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_attention, decode_attention);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(device_status_describe, device_status_describe);
