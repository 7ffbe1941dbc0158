#pragma once
// A layer's KV cache as the binding's functions take it: K and V (contiguous [S, H, T, D] HND or
// [S, T, H, D] NHD; pages [P, H, page_size, D] HND or [P, page_size, H, D] NHD) and, for pages,
// vLLM's block table or FlashInfer's indptr form. with_layout() picks the kvscout layout type for
// a kind and order; kv_view_of<Layout>() checks the tensors and builds the kv_view over them.

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "checks.hpp"
#include "kvscout/kvscout.hpp"

namespace kvscout_py {

inline const std::int32_t* int32_data(const ffi::TensorView& t, const char* name,
                                      std::initializer_list<std::int64_t> shape) {
  expect_dtype(t, name, kDLInt, 32);
  expect(t, name, shape);
  return kvscout_py::span_of<const std::int32_t>(t).data();
}

// vLLM's block table: table [S, max_blocks] and seq_lens [S], int32.
inline kvscout::block_table block_table_of(const ffi::TensorView& table,
                                           const ffi::TensorView& seq_lens, int S) {
  kvscout::block_table pt;
  pt.table = int32_data(table, "block_table", {S, -1});
  pt.seq_lens = int32_data(seq_lens, "seq_lens", {S});
  pt.max_blocks_per_seq = as_int(table.size(1), "max_blocks_per_seq");
  pt.seqs = S;
  return pt;
}

// FlashInfer's page table: indptr [S + 1], page_ids [indptr[S] or more], last_page_len [S], int32.
inline kvscout::flashinfer_page_table indptr_table_of(const ffi::TensorView& indptr,
                                                      const ffi::TensorView& page_ids,
                                                      const ffi::TensorView& last_page_len, int S) {
  const std::int32_t* ip = int32_data(indptr, "indptr", {S + 1});
  for (int i = 0; i < S; ++i)
    if (ip[i] < 0 || ip[i] > ip[i + 1])
      TVM_FFI_THROW(ValueError) << "indptr[" << i << "] = " << ip[i] << ", indptr[" << i + 1
                                << "] = " << ip[i + 1]
                                << ": expected non-negative and non-decreasing";
  if (S > 0 && ip[S] > page_ids.numel())
    TVM_FFI_THROW(ValueError) << "indptr[" << S << "] = " << ip[S] << " pages, page_ids holds "
                              << page_ids.numel();
  kvscout::flashinfer_page_table pt;
  pt.indptr = ip;
  pt.indices = int32_data(page_ids, "page_ids", {-1});
  pt.last_page_len = int32_data(last_page_len, "last_page_len", {S});
  pt.seqs = S;
  return pt;
}

// The cache kinds the package builds: contiguous, or pages with either table form.
enum class kv_kind : std::int64_t { contiguous = 0, block_table = 1, indptr = 2 };

inline kv_kind kv_kind_of(std::int64_t v) {
  if (v < 0 || v > 2)
    TVM_FFI_THROW(ValueError) << "cache kind " << v
                              << ", expected 0 (contiguous), 1 (block table) or 2 (indptr)";
  return static_cast<kv_kind>(v);
}

// One layer's cache as Python passes it; the tables are empty tensors where they do not apply.
struct kv_tensors {
  ffi::TensorView k, v, seq_lens, block_table, indptr, page_ids, last_page_len;
};

template <class Layout>
struct layout_traits;
template <class T, int D, class O>
struct layout_traits<kvscout::contiguous_layout<T, D, O>> {
  static constexpr kv_kind kind = kv_kind::contiguous;
  static constexpr bool hnd = std::is_same_v<O, kvscout::hnd>;
};
template <class T, int D, class O, class Table>
struct layout_traits<kvscout::paged_layout<T, D, O, Table>> {
  static constexpr kv_kind kind = std::is_same_v<Table, kvscout::block_table> ? kv_kind::block_table
                                                                             : kv_kind::indptr;
  static constexpr bool hnd = std::is_same_v<O, kvscout::hnd>;
};

// f.template operator()<Layout>() for the layout of `kind` and `order` (0 HND, 1 NHD), elements T,
// head_dim D.
template <class T, int D, class F>
void with_layout(kv_kind kind, std::int64_t order, F&& f) {
  if (order != 0 && order != 1)
    TVM_FFI_THROW(ValueError) << "layout order " << order << ", expected 0 (HND) or 1 (NHD)";
  const auto run = [&]<class O>() {
    if (kind == kv_kind::contiguous)
      f.template operator()<kvscout::contiguous_layout<T, D, O>>();
    else if (kind == kv_kind::block_table)
      f.template operator()<kvscout::paged_layout<T, D, O, kvscout::block_table>>();
    else
      f.template operator()<kvscout::paged_layout<T, D, O, kvscout::flashinfer_page_table>>();
  };
  if (order == 0)
    run.template operator()<kvscout::hnd>();
  else
    run.template operator()<kvscout::nhd>();
}

// The Layout over kv's tensors for S sequences, checked (shapes, dtypes, the tables); a
// contiguous cache holds max_tokens tokens per sequence where max_tokens > 0.
template <class Layout>
kvscout::kv_view<Layout, kvscout::host_space> kv_view_of(const kv_tensors& kv, int S,
                                                         int max_tokens) {
  using T = typename Layout::element_type;
  using traits = layout_traits<Layout>;
  constexpr int D = Layout::head_dim;
  const ffi::TensorView& k = kv.k;
  const char* form = traits::hnd ? "HND" : "NHD";
  expect(k, "k_cache", {-1, -1, -1, D});
  expect(kv.v, "v_cache", {k.size(0), k.size(1), k.size(2), D});
  const DLDataType want = element_dtype<T>();
  for (const auto* t : {&k, &kv.v})
    if (!is(t->dtype(), want.code, want.bits))
      TVM_FFI_THROW(TypeError) << (t == &k ? "k_cache" : "v_cache") << ": dtype "
                               << dtype_name(t->dtype()) << ", expected " << dtype_name(want);
  const std::int64_t H = traits::hnd ? k.size(1) : k.size(2),
                     T_ = traits::hnd ? k.size(2) : k.size(1);
  const auto view = [&](const Layout& lay) {
    return kvscout::kv_view<Layout, kvscout::host_space>{
        lay, kvscout::as_bytes(span_of<const T>(k)), kvscout::as_bytes(span_of<const T>(kv.v))};
  };
  if constexpr (traits::kind == kv_kind::contiguous) {
    if (k.size(0) != S || (max_tokens > 0 && T_ != max_tokens))
      TVM_FFI_THROW(ValueError) << "k_cache: shape " << shape_of(k) << ", expected " << S
                                << " sequences of " << (max_tokens > 0 ? max_tokens : T_)
                                << " tokens, " << form;
    const std::int32_t* lens = int32_data(kv.seq_lens, "seq_lens", {S});
    return view(guarded([&] {
      return Layout::padded(as_int(H, "num_kv_heads"), as_int(T_, "max_tokens"), lens, S);
    }));
  } else if constexpr (traits::kind == kv_kind::block_table) {
    const auto pt = block_table_of(kv.block_table, kv.seq_lens, S);
    return view(guarded([&] { return Layout(pt, as_int(H, "num_kv_heads"), as_int(T_, "page_size")); }));
  } else {
    const auto pt = indptr_table_of(kv.indptr, kv.page_ids, kv.last_page_len, S);
    return view(guarded([&] { return Layout(pt, as_int(H, "num_kv_heads"), as_int(T_, "page_size")); }));
  }
}

}  // namespace kvscout_py
