// KIVI-quantised caches for Python (kv/kivi_layout.hpp, kv/kivi.hpp, attention/kivi_rows.hpp):
// the layout's buffer sizes, the append that quantises by KIVI's rule, the host gather of the
// selected records (still quantised), decode attention over them and the resident window, and
// every row as attention reads it (for tests). The layout is a small value rebuilt on each call
// from its numbers and the caller's seq_lens array; the five buffers are the caller's uint8 arrays.
//
// cfg: [num_seqs, num_kv_heads, capacity, head_dim, key_bits, value_bits, group, residual].
// Instances: K / V (the window's rows) float32, float16, bfloat16 x head_dim 64, 128 x KIVI-2
// (2-bit keys and values) and KIVI-4; scales and zeros float16.

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/string.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checks.hpp"
#include "kvscout/kvscout.hpp"

namespace {

using namespace kvscout_py;

struct kivi_args {
  int S, H, capacity, D, key_bits, value_bits, group, residual;
  DLDataType element;
};

kivi_args kivi_args_of(const ffi::Array<std::int64_t>& c, const std::string& dtype) {
  if (c.size() != 8)
    TVM_FFI_THROW(ValueError) << "cfg holds " << c.size() << " numbers, expected [num_seqs, "
                              << "num_kv_heads, capacity, head_dim, key_bits, value_bits, group, "
                              << "residual]";
  kivi_args a{as_int(c[0], "num_seqs"), as_int(c[1], "num_kv_heads"), as_int(c[2], "capacity"),
              as_int(c[3], "head_dim"),  as_int(c[4], "key_bits"),     as_int(c[5], "value_bits"),
              as_int(c[6], "group"),     as_int(c[7], "residual"),     {}};
  a.element = element_named(dtype);
  return a;
}

// f.template operator()<Layout>() for the args' element type, head_dim and bits.
template <class F>
void with_kivi(const kivi_args& a, F&& f) {
  with_element(a.element, "dtype", a.D, [&]<class T, int D>() {
    if (a.key_bits == 2 && a.value_bits == 2)
      f.template operator()<kvscout::kivi_layout<T, D, 2>>();
    else if (a.key_bits == 4 && a.value_bits == 4)
      f.template operator()<kvscout::kivi_layout<T, D, 4>>();
    else
      TVM_FFI_THROW(ValueError) << "KIVI with " << a.key_bits << "-bit keys and " << a.value_bits
                                << "-bit values was not built, expected 2 and 2 (KIVI-2) or 4 "
                                << "and 4 (KIVI-4)";
  });
}

template <class Layout>
Layout layout_of(const kivi_args& a, const ffi::TensorView& seq_lens) {
  expect_dtype(seq_lens, "seq_lens", kDLInt, 32);
  expect(seq_lens, "seq_lens", {a.S});
  return guarded([&] {
    return Layout::padded(a.H, a.capacity, span_of<const std::int32_t>(seq_lens).data(), a.S,
                          {.group = a.group, .residual = a.residual});
  });
}

// The five buffers: k_codes, v_records, k_params, k_residual, v_residual (uint8, 16-byte
// aligned, each at least the layout's size).
template <class Layout>
kvscout::kivi_buffers<kvscout::host_space> buffers_of(const Layout& l,
                                                      const ffi::Array<ffi::Tensor>& b) {
  static constexpr const char* names[5] = {"k_codes", "v_records", "k_params", "k_residual",
                                           "v_residual"};
  if (b.size() != 5)
    TVM_FFI_THROW(ValueError) << b.size() << " buffers, expected 5 (k_codes, v_records, "
                              << "k_params, k_residual, v_residual)";
  const std::size_t need[5] = {l.required_k_bytes(), l.required_v_bytes(),
                               l.required_k_params_bytes(), l.required_residual_bytes(),
                               l.required_residual_bytes()};
  kvscout::host_span<std::byte> s[5];
  for (int i = 0; i < 5; ++i) {
    const ffi::TensorView t = b[static_cast<std::size_t>(i)];
    expect_dtype(t, names[i], kDLUInt, 8);
    expect(t, names[i], {-1});
    if (static_cast<std::size_t>(t.numel()) < need[i])
      TVM_FFI_THROW(ValueError) << names[i] << ": " << t.numel() << " bytes, the layout needs "
                                << need[i];
    s[i] = span_of<std::byte>(t);
  }
  const kvscout::kivi_buffers<kvscout::host_space> out{s[0], s[1], s[2], s[3], s[4]};
  guarded([&] {
    out.check_distinct(l);
    return 0;
  });
  return out;
}

// [k_codes, v_records, k_params, k_residual, v_residual bytes, k_row_bytes, v_row_bytes].
ffi::Array<std::int64_t> kivi_sizes(ffi::Array<std::int64_t> cfg, ffi::String dtype) {
  const kivi_args a = kivi_args_of(cfg, dtype);
  ffi::Array<std::int64_t> out;
  with_kivi(a, [&]<class Layout>() {
    const std::int32_t none = 0;
    const std::vector<std::int32_t> zeros(static_cast<std::size_t>(a.S), 0);
    const Layout l = guarded([&] {
      return Layout::padded(a.H, a.capacity, a.S > 0 ? zeros.data() : &none, a.S,
                            {.group = a.group, .residual = a.residual});
    });
    const auto n = [](std::size_t v) { return static_cast<std::int64_t>(v); };
    out = {n(l.required_k_bytes()),        n(l.required_v_bytes()),
           n(l.required_k_params_bytes()), n(l.required_residual_bytes()),
           n(l.required_residual_bytes()), n(l.k_row_bytes()),
           n(l.v_row_bytes())};
  });
  return out;
}

// Appends k / v [n, H, D] (the cache's dtype) to sequence s and increments seq_lens[s].
void kivi_append(ffi::Array<std::int64_t> cfg, ffi::String dtype, ffi::Array<ffi::Tensor> buffers,
                 ffi::TensorView seq_lens, std::int64_t s, ffi::TensorView k, ffi::TensorView v) {
  const kivi_args a = kivi_args_of(cfg, dtype);
  with_kivi(a, [&]<class Layout>() {
    using T = typename Layout::element_type;
    const Layout l = layout_of<Layout>(a, seq_lens);
    const auto b = buffers_of(l, buffers);
    const DLDataType want = element_dtype<T>();
    for (const ffi::TensorView* t : {&k, &v}) {
      expect(*t, t == &k ? "k" : "v", {-1, a.H, a.D});
      if (!is(t->dtype(), want.code, want.bits))
        TVM_FFI_THROW(TypeError) << (t == &k ? "k" : "v") << ": dtype " << dtype_name(t->dtype())
                                 << ", expected the cache's " << dtype_name(want);
    }
    if (v.size(0) != k.size(0))
      TVM_FFI_THROW(ValueError) << "v: " << v.size(0) << " tokens, k has " << k.size(0);
    const ffi::TensorView lens_view = seq_lens;
    expect_disjoint({{"seq_lens", &lens_view}}, {{"k", &k}, {"v", &v}});
    guarded([&] {
      kvscout::kivi_append_host<Layout> w(l, b, span_of<std::int32_t>(seq_lens).data());
      w.append(as_int(s, "s"), as_int(k.size(0), "tokens"), span_of<const T>(k),
               span_of<const T>(v));
      return 0;
    });
  });
}

// The records of the selected tokens (indices [S, H, capacity] < the quantised lengths, counts
// [S, H]) into k_rows [S, H, capacity, k_row_bytes], v_rows [.., v_row_bytes] uint8.
void kivi_gather(ffi::Array<std::int64_t> cfg, ffi::String dtype, ffi::Array<ffi::Tensor> buffers,
                 ffi::TensorView seq_lens, ffi::TensorView indices, ffi::TensorView counts,
                 ffi::TensorView k_rows, ffi::TensorView v_rows, std::int64_t threads) {
  const kivi_args a = kivi_args_of(cfg, dtype);
  with_kivi(a, [&]<class Layout>() {
    const Layout l = layout_of<Layout>(a, seq_lens);
    const auto b = buffers_of(l, buffers);
    expect_dtype(indices, "indices", kDLInt, 32);
    expect(indices, "indices", {a.S, a.H, -1});
    expect_dtype(counts, "counts", kDLInt, 32);
    expect(counts, "counts", {a.S, a.H});
    const int cap = as_int(indices.size(2), "capacity");
    const auto kb = static_cast<std::int64_t>(l.k_row_bytes()),
               vb = static_cast<std::int64_t>(l.v_row_bytes());
    expect_dtype(k_rows, "k_rows", kDLUInt, 8);
    expect(k_rows, "k_rows", {a.S, a.H, cap, kb});
    expect_dtype(v_rows, "v_rows", kDLUInt, 8);
    expect(v_rows, "v_rows", {a.S, a.H, cap, vb});
    ffi::TensorView bv[5] = {buffers[0], buffers[1], buffers[2], buffers[3], buffers[4]};
    expect_disjoint({{"k_rows", &k_rows}, {"v_rows", &v_rows}},
                    {{"k_codes", &bv[0]}, {"v_records", &bv[1]}, {"k_params", &bv[2]},
                     {"k_residual", &bv[3]}, {"v_residual", &bv[4]}, {"seq_lens", &seq_lens},
                     {"indices", &indices}, {"counts", &counts}});
    guarded([&] {
      const kvscout::selection_view<kvscout::host_space> sel{
          span_of<const std::int32_t>(indices), span_of<const std::int32_t>(counts), a.S, a.H,
          cap};
      const kvscout::host_gather_config gc{.shape = {.num_seqs = a.S, .num_kv_heads = a.H},
                                           .capacity = cap,
                                           .threads = as_int(threads, "threads")};
      using executor = kvscout::gather_executor_host<Layout>;
      kvscout::host_workspace ws(executor::workspace_bytes(gc), executor::workspace_alignment);
      executor g(gc, ws.span());
      g.submit(b.view(l).quantized(), sel,
               {span_of<std::byte>(k_rows), span_of<std::byte>(v_rows)})
          .wait();
      return 0;
    });
  });
}

// Decode attention of q [S, Hq, D] float32 over the gathered records, each sequence's resident
// window and the current token k_cur / v_cur [S, H, D] (or empty): out [S, Hq, D] float32.
void kivi_attention(ffi::Array<std::int64_t> cfg, ffi::String dtype,
                    ffi::Array<ffi::Tensor> buffers, ffi::TensorView seq_lens,
                    ffi::TensorView indices, ffi::TensorView counts, ffi::TensorView k_rows,
                    ffi::TensorView v_rows, ffi::TensorView q, ffi::TensorView out,
                    ffi::TensorView k_cur, ffi::TensorView v_cur, double scale) {
  const kivi_args a = kivi_args_of(cfg, dtype);
  with_kivi(a, [&]<class Layout>() {
    using T = typename Layout::element_type;
    const Layout l = layout_of<Layout>(a, seq_lens);
    const auto b = buffers_of(l, buffers);
    expect_dtype(indices, "indices", kDLInt, 32);
    expect(indices, "indices", {a.S, a.H, -1});
    expect_dtype(counts, "counts", kDLInt, 32);
    expect(counts, "counts", {a.S, a.H});
    const int cap = as_int(indices.size(2), "capacity");
    expect_dtype(k_rows, "k_rows", kDLUInt, 8);
    expect(k_rows, "k_rows", {a.S, a.H, cap, static_cast<std::int64_t>(l.k_row_bytes())});
    expect_dtype(v_rows, "v_rows", kDLUInt, 8);
    expect(v_rows, "v_rows", {a.S, a.H, cap, static_cast<std::int64_t>(l.v_row_bytes())});
    expect_dtype(q, "q", kDLFloat, 32);
    expect(q, "q", {a.S, -1, a.D});
    expect_dtype(out, "out", kDLFloat, 32);
    expect(out, "out", {a.S, q.size(1), a.D});
    const bool current = k_cur.numel() > 0 || v_cur.numel() > 0;
    if (current) {
      const DLDataType want = element_dtype<T>();
      for (const ffi::TensorView* t : {&k_cur, &v_cur}) {
        expect(*t, t == &k_cur ? "k_cur" : "v_cur", {a.S, a.H, a.D});
        if (!is(t->dtype(), want.code, want.bits))
          TVM_FFI_THROW(TypeError) << (t == &k_cur ? "k_cur" : "v_cur") << ": dtype "
                                   << dtype_name(t->dtype()) << ", expected the cache's "
                                   << dtype_name(want);
      }
    }
    ffi::TensorView bv[5] = {buffers[0], buffers[1], buffers[2], buffers[3], buffers[4]};
    expect_disjoint({{"out", &out}},
                    {{"k_codes", &bv[0]}, {"v_records", &bv[1]}, {"k_params", &bv[2]},
                     {"k_residual", &bv[3]}, {"v_residual", &bv[4]}, {"seq_lens", &seq_lens},
                     {"indices", &indices}, {"counts", &counts}, {"k_rows", &k_rows},
                     {"v_rows", &v_rows}, {"q", &q}, {"k_cur", &k_cur}, {"v_cur", &v_cur}});
    guarded([&] {
      const kvscout::selection_view<kvscout::host_space> sel{
          span_of<const std::int32_t>(indices), span_of<const std::int32_t>(counts), a.S, a.H,
          cap};
      const kvscout::kivi_gathered_rows_host<Layout> rows(
          l, sel, span_of<const std::byte>(k_rows), span_of<const std::byte>(v_rows),
          b.view(l).resident);
      const kvscout::current_token<T> cur =
          current ? kvscout::current_token<T>{span_of<const T>(k_cur), span_of<const T>(v_cur)}
                  : kvscout::current_token<T>{};
      kvscout::decode_attention_host(rows, cur, span_of<const float>(q), span_of<float>(out),
                                     {.num_q_heads = as_int(q.size(1), "num_q_heads"),
                                      .scale = static_cast<float>(scale)});
      return 0;
    });
  });
}

// Every cached row as attention reads it (quantised tokens dequantised, the window's rows) into
// keys / values [S, H, capacity, D] float32 (t < seq_lens[s] written; both empty: none);
// quantized_lens [S] int32: the tokens a selector chooses among (the layout's seq_len).
void kivi_rows(ffi::Array<std::int64_t> cfg, ffi::String dtype, ffi::Array<ffi::Tensor> buffers,
               ffi::TensorView seq_lens, ffi::TensorView keys, ffi::TensorView values,
               ffi::TensorView quantized_lens) {
  const kivi_args a = kivi_args_of(cfg, dtype);
  with_kivi(a, [&]<class Layout>() {
    const Layout l = layout_of<Layout>(a, seq_lens);
    const auto b = buffers_of(l, buffers);
    const bool want_rows = keys.numel() > 0 || values.numel() > 0;  // else the lengths only
    for (const ffi::TensorView* t : {&keys, &values})
      if (want_rows) {
        expect_dtype(*t, t == &keys ? "keys" : "values", kDLFloat, 32);
        expect(*t, t == &keys ? "keys" : "values", {a.S, a.H, a.capacity, a.D});
      }
    expect_dtype(quantized_lens, "quantized_lens", kDLInt, 32);
    expect(quantized_lens, "quantized_lens", {a.S});
    guarded([&] {
      const kvscout::kivi_layout_rows_host<Layout> rows(b.view(l));
      float* k = want_rows ? span_of<float>(keys).data() : nullptr;
      float* v = want_rows ? span_of<float>(values).data() : nullptr;
      for (int s = 0; s < a.S; ++s) {
        span_of<std::int32_t>(quantized_lens)[static_cast<std::size_t>(s)] = l.seq_len(s);
        if (!want_rows) continue;
        for (int h = 0; h < a.H; ++h)
          for (int i = 0; i < rows.rows(s, h); ++i) {
            const std::size_t at =
                ((static_cast<std::size_t>(s) * a.H + h) * a.capacity + i) * a.D;
            rows.load_k(s, h, i, k + at);
            rows.load_v(s, h, i, v + at);
          }
      }
      return 0;
    });
  });
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(kivi_sizes, kivi_sizes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(kivi_append, kivi_append);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(kivi_gather, kivi_gather);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(kivi_attention, kivi_attention);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(kivi_rows, kivi_rows);
