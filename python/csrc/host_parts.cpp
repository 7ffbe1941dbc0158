// kvscout's host parts for Python, through apache-tvm-ffi: each function takes DLPack tensors
// (NumPy arrays, CPU torch tensors) and plain numbers, checks them, builds the C++ part over the
// caller's memory and runs it. Nothing here allocates a tensor: outputs and workspaces are the
// caller's (python/kvscout/ sizes and allocates them where the caller does not). Errors reach
// Python as exceptions naming the bad value: TypeError for a dtype, ValueError for the rest (a
// kvscout::error's message verbatim).
//
// Instances built: K / V elements float32, float16, bfloat16; head_dim 64 and 128; contiguous
// layouts NHD and HND. Others raise.

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvscout/kvscout.hpp"

namespace ffi = tvm::ffi;

namespace {

// ---- argument checks ---------------------------------------------------------------------------

bool is(DLDataType t, int code, int bits) { return t.code == code && t.bits == bits && t.lanes == 1; }

std::string dtype_name(DLDataType t) {
  if (is(t, kDLFloat, 64)) return "float64";
  if (is(t, kDLFloat, 32)) return "float32";
  if (is(t, kDLFloat, 16)) return "float16";
  if (is(t, kDLBfloat, 16)) return "bfloat16";
  if (is(t, kDLInt, 32)) return "int32";
  if (is(t, kDLInt, 64)) return "int64";
  if (is(t, kDLUInt, 8)) return "uint8";
  return "code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
}

std::string shape_of(const ffi::TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// A CPU tensor, C-contiguous, with `shape` (-1: any extent); returns it unchanged.
const ffi::TensorView& expect(const ffi::TensorView& t, const char* name,
                              std::initializer_list<std::int64_t> shape) {
  if (t.device().device_type != kDLCPU)
    TVM_FFI_THROW(ValueError) << name << ": a tensor on device type " << t.device().device_type
                              << ", expected a CPU tensor (this build has the host backend only)";
  std::string want = "[";
  int i = 0;
  bool ok = t.ndim() == static_cast<int>(shape.size());
  for (std::int64_t e : shape) {
    want += (i ? ", " : "") + (e < 0 ? std::string("*") : std::to_string(e));
    if (ok && e >= 0 && t.size(i) != e) ok = false;
    ++i;
  }
  want += "]";
  if (!ok) TVM_FFI_THROW(ValueError) << name << ": shape " << shape_of(t) << ", expected " << want;
  if (!t.IsContiguous())
    TVM_FFI_THROW(ValueError) << name << ": not contiguous (shape " << shape_of(t)
                              << "); pass a C-contiguous array (numpy.ascontiguousarray)";
  return t;
}

void expect_dtype(const ffi::TensorView& t, const char* name, int code, int bits) {
  if (!is(t.dtype(), code, bits))
    TVM_FFI_THROW(TypeError) << name << ": dtype " << dtype_name(t.dtype()) << ", expected "
                             << dtype_name(DLDataType{static_cast<std::uint8_t>(code),
                                                      static_cast<std::uint8_t>(bits), 1});
}

int as_int(std::int64_t v, const char* name) {
  if (v < INT32_MIN || v > INT32_MAX)
    TVM_FFI_THROW(ValueError) << name << " = " << v << " does not fit a 32-bit int";
  return static_cast<int>(v);
}

template <class T>
kvscout::host_span<T> span_of(const ffi::TensorView& t) {
  return {static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel())};
}

// Runs f, a kvscout::error becoming ValueError with its message.
template <class F>
auto guarded(F&& f) {
  try {
    return f();
  } catch (const kvscout::error& e) {
    TVM_FFI_THROW(ValueError) << e.message();
  }
}

// f.template operator()<T, D>() for the K / V element type of `t` and head_dim D.
template <class F>
void with_element(const ffi::TensorView& t, const char* name, std::int64_t head_dim, F&& f) {
  const auto at_dim = [&]<class T>() {
    if (head_dim == 64)
      f.template operator()<T, 64>();
    else if (head_dim == 128)
      f.template operator()<T, 128>();
    else
      TVM_FFI_THROW(ValueError) << name << ": head_dim " << head_dim
                                << " was not built, expected 64 or 128";
  };
  const DLDataType d = t.dtype();
  if (is(d, kDLFloat, 32))
    at_dim.template operator()<float>();
  else if (is(d, kDLFloat, 16))
    at_dim.template operator()<kvscout::half>();
  else if (is(d, kDLBfloat, 16))
    at_dim.template operator()<kvscout::bfloat16>();
  else
    TVM_FFI_THROW(TypeError) << name << ": dtype " << dtype_name(d)
                             << ", expected float32, float16 or bfloat16";
}

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
  expect_dtype(scores, "scores", kDLFloat, 32);
  expect(scores, "scores", {-1, -1, -1});
  expect_dtype(seq_lens, "seq_lens", kDLInt, 32);
  expect(seq_lens, "seq_lens", {scores.size(0)});
  expect_dtype(workspace, "workspace", kDLUInt, 8);
  expect(workspace, "workspace", {-1});
  const auto sel = selection_of(indices, counts);
  if (indices.size(0) != scores.size(0) || indices.size(1) != scores.size(1))
    TVM_FFI_THROW(ValueError) << "indices: shape " << shape_of(indices) << ", expected ["
                              << scores.size(0) << ", " << scores.size(1) << ", capacity]";
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

// ---- the host gather ---------------------------------------------------------------------------

// order: 0 HND (k_cache [S, H, T, D]), 1 NHD ([S, T, H, D]). Rows out: [S, H, capacity, D].
void gather(std::int64_t order, ffi::TensorView k_cache, ffi::TensorView v_cache,
            ffi::TensorView seq_lens, ffi::TensorView indices, ffi::TensorView counts,
            ffi::TensorView k_rows, ffi::TensorView v_rows, std::int64_t threads) {
  if (order != 0 && order != 1)
    TVM_FFI_THROW(ValueError) << "layout order " << order << ", expected 0 (HND) or 1 (NHD)";
  expect(k_cache, "k_cache", {-1, -1, -1, -1});
  expect(v_cache, "v_cache", {k_cache.size(0), k_cache.size(1), k_cache.size(2), k_cache.size(3)});
  const std::int64_t S = k_cache.size(0), H = order == 0 ? k_cache.size(1) : k_cache.size(2),
                     T = order == 0 ? k_cache.size(2) : k_cache.size(1), D = k_cache.size(3);
  expect_dtype(seq_lens, "seq_lens", kDLInt, 32);
  expect(seq_lens, "seq_lens", {S});
  const auto sel = selection_of(indices, counts);
  if (sel.num_seqs != S || sel.num_kv_heads != H)
    TVM_FFI_THROW(ValueError) << "indices: shape " << shape_of(indices) << ", expected [" << S
                              << ", " << H << ", capacity] (the cache's sequences and KV heads)";
  expect(k_rows, "k_rows", {S, H, sel.capacity, D});
  expect(v_rows, "v_rows", {S, H, sel.capacity, D});
  for (const auto* t : {&v_cache, &k_rows, &v_rows})
    if (!is(t->dtype(), k_cache.dtype().code, k_cache.dtype().bits))
      TVM_FFI_THROW(TypeError) << "k_cache is " << dtype_name(k_cache.dtype())
                               << ", v_cache / k_rows / v_rows must be too, got "
                               << dtype_name(t->dtype());
  with_element(k_cache, "k_cache", D, [&]<class T_, int D_>() {
    const auto run = [&]<class O>() {
      using layout = kvscout::contiguous_layout<T_, D_, O>;
      guarded([&] {
        const layout lay = layout::padded(as_int(H, "num_kv_heads"), as_int(T, "max_tokens"),
                                          static_cast<const std::int32_t*>(seq_lens.data_ptr()),
                                          as_int(S, "num_seqs"));
        const kvscout::host_gather_config cfg{
            .shape = {.num_seqs = sel.num_seqs, .num_kv_heads = sel.num_kv_heads},
            .capacity = sel.capacity,
            .threads = as_int(threads, "threads")};
        using executor = kvscout::gather_executor_host<layout>;
        std::vector<std::int64_t> ws(executor::workspace_bytes(cfg) / sizeof(std::int64_t) + 1);
        executor g(cfg, {reinterpret_cast<std::byte*>(ws.data()), ws.size() * sizeof(std::int64_t)});
        g.submit({lay, kvscout::as_bytes(span_of<const T_>(k_cache)),
                  kvscout::as_bytes(span_of<const T_>(v_cache))},
                 sel,
                 {kvscout::as_writable_bytes(span_of<T_>(k_rows)),
                  kvscout::as_writable_bytes(span_of<T_>(v_rows))})
            .wait();
        return 0;
      });
    };
    if (order == 0)
      run.template operator()<kvscout::hnd>();
    else
      run.template operator()<kvscout::nhd>();
  });
}

// ---- decode attention over gathered rows -------------------------------------------------------

// k_rows / v_rows [S, H, capacity, D] (counts [S, H] rows each), q / out [S, Hq, D] float32, the
// current token's k_cur / v_cur [S, H, D] or empty (none).
void decode_attention(ffi::TensorView k_rows, ffi::TensorView v_rows, ffi::TensorView indices,
                      ffi::TensorView counts, ffi::TensorView q, ffi::TensorView out,
                      ffi::TensorView k_cur, ffi::TensorView v_cur, double scale) {
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
  with_element(k_rows, "k_rows", D, [&]<class T_, int D_>() {
    guarded([&] {
      const kvscout::gathered_rows_host<T_, D_> rows(sel, span_of<const T_>(k_rows),
                                                     span_of<const T_>(v_rows));
      const kvscout::current_token<T_> cur =
          current ? kvscout::current_token<T_>{span_of<const T_>(k_cur), span_of<const T_>(v_cur)}
                  : kvscout::current_token<T_>{};
      kvscout::decode_attention_host(rows, cur, span_of<const float>(q), span_of<float>(out),
                                     {.num_q_heads = as_int(q.size(1), "num_q_heads"),
                                      .scale = static_cast<float>(scale)});
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
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gather, gather);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_attention, decode_attention);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(device_status_describe, device_status_describe);
