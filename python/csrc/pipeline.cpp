// presets::pipeline_host for Python: a preset's whole host step (its InfiniGen policies, one top-k
// selector per speculated layer, the correction step, the gather and every workspace) over one
// cache layout, built from the preset, the shape, the calibration (as the arrays
// python/kvscout/presets.py's Calibration holds), the budget and each layer's W_Q. Its calls come
// back as closures holding the pipeline: append, speculate, attend, stats, selection.
//
// Instances (pipeline.hpp): the layouts of kv_args.hpp (contiguous HND / NHD, pages HND / NHD with
// either table form) x K / V float32, float16, bfloat16 x head_dim 64, 128 x partial keys float or
// 2-bit x W_Q float32, float16, bfloat16.

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipeline.hpp"

namespace {

using namespace kvscout_py;

// One layer's cache from the call's tensors: k, v, seq_lens, block_table, indptr, page_ids,
// last_page_len.
using kv_arg = ffi::Array<ffi::Tensor>;

kv_tensors kv_of(const kv_arg& a, const ffi::TensorView& seq_lens) {
  if (a.size() != 6)
    TVM_FFI_THROW(ValueError) << "a cache crosses as 6 tensors (k, v, block_table, indptr, "
                              << "page_ids, last_page_len), got " << a.size();
  return {a[0], a[1], seq_lens, a[2], a[3], a[4], a[5]};
}

// tvm-ffi releases the GIL during a call; the pipeline's calls share its buffers: one at a time.
struct held {
  std::unique_ptr<pipeline_calls> pipe;
  kvscout::decode_shape shape;
  std::mutex one_call;
};

// The calibration Python's Calibration describes: per layer the plans' arrays (empty tensors
// below first_layer), the correction's (an empty list: none), mass curves [L, bins] or empty.
presets::calibration calibration_of(const presets::speculation_preset& p,
                                    const kvscout::decode_shape& shape, double theta,
                                    std::int64_t style, std::int64_t first_layer,
                                    const ffi::Array<ffi::Tensor>& plans,
                                    const ffi::Array<ffi::Tensor>& corr,
                                    const ffi::TensorView& mass_curves) {
  const int L = shape.num_layers, H = shape.num_kv_heads, D = shape.head_dim;
  presets::calibration cal;
  cal.first_layer = as_int(first_layer, "first_layer");
  const auto layers = [&](const ffi::Array<ffi::Tensor>& a, int r, const char* what) {
    if (a.size() != static_cast<std::size_t>(3 * L))
      TVM_FFI_THROW(ValueError) << what << ": " << a.size() / 3 << " layers, expected the "
                                << "shape's " << L;
    std::vector<std::vector<kvscout::skew_plan>> out(static_cast<std::size_t>(L));
    for (int l = cal.first_layer; l < L; ++l)
      out[l] = plans_of(p.mode, H, D, r, theta, style, a[3 * l], a[3 * l + 1], a[3 * l + 2], what);
    return out;
  };
  if (cal.first_layer < 0 || cal.first_layer > L)
    TVM_FFI_THROW(ValueError) << "first_layer = " << first_layer << ", expected [0, " << L << "]";
  cal.plans = layers(plans, p.r, "plans");
  if (corr.size() > 0) cal.correction_plans = layers(corr, p.correction_channels(), "correction plans");
  if (mass_curves.numel() > 0) {
    expect_dtype(mass_curves, "mass_curves", kDLFloat, 64);
    expect(mass_curves, "mass_curves", {L, -1});
    const auto m = span_of<const double>(mass_curves);
    cal.mass_curves.assign(m.begin(), m.end());
    cal.bins = as_int(mass_curves.size(1), "bins");
  }
  return cal;
}

// x [S, d_model] float32 (speculate), q [S, Hq, D] float32 (attend), positions / seq_lens [S]
// int32, seq_ids [S] int32 or empty.
kvscout::score_context<kvscout::host_space> context_of(const kvscout::decode_shape& sh,
                                                       const ffi::TensorView& seq_lens,
                                                       const ffi::TensorView& seq_ids) {
  kvscout::score_context<kvscout::host_space> ctx{};
  ctx.seq_lens = kvscout::host_span<const std::int32_t>(int32_data(seq_lens, "seq_lens", {sh.num_seqs}),
                                                        static_cast<std::size_t>(sh.num_seqs));
  if (seq_ids.numel() > 0)
    ctx.seq_ids = kvscout::host_span<const std::int32_t>(int32_data(seq_ids, "seq_ids", {sh.num_seqs}),
                                                         static_cast<std::size_t>(sh.num_seqs));
  return ctx;
}

ffi::Array<ffi::Function> calls_of(std::shared_ptr<held> h) {
  const kvscout::decode_shape sh = h->shape;
  auto append = [h](std::int64_t layer, ffi::TensorView keys, ffi::TensorView seq_ids,
                    ffi::TensorView token_ids) {
    const std::lock_guard lock(h->one_call);
    h->pipe->append(as_int(layer, "layer"), keys, seq_ids, token_ids);
  };
  auto speculate = [h, sh](std::int64_t layer, ffi::TensorView x, ffi::TensorView positions,
                           ffi::TensorView seq_lens, ffi::TensorView seq_ids, kv_arg cache) {
    auto ctx = context_of(sh, seq_lens, seq_ids);
    expect_dtype(x, "x", kDLFloat, 32);
    ctx.x = span_of<const float>(expect(x, "x", {sh.num_seqs, sh.d_model}));
    ctx.positions = kvscout::host_span<const std::int32_t>(
        int32_data(positions, "positions", {sh.num_seqs}), static_cast<std::size_t>(sh.num_seqs));
    const std::lock_guard lock(h->one_call);
    h->pipe->speculate(as_int(layer, "layer"), ctx, kv_of(cache, seq_lens));
  };
  auto attend = [h, sh](std::int64_t layer, ffi::TensorView q, ffi::TensorView seq_lens,
                        ffi::TensorView seq_ids, kv_arg cache, ffi::TensorView k_cur,
                        ffi::TensorView v_cur, ffi::TensorView out) {
    auto ctx = context_of(sh, seq_lens, seq_ids);
    expect_dtype(q, "q", kDLFloat, 32);
    ctx.q = span_of<const float>(expect(q, "q", {sh.num_seqs, sh.num_q_heads, sh.head_dim}));
    expect_dtype(out, "out", kDLFloat, 32);
    expect(out, "out", {sh.num_seqs, sh.num_q_heads, sh.head_dim});
    const kv_tensors kv = kv_of(cache, seq_lens);
    expect_disjoint({{"out", &out}},
                    {{"q", &q}, {"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}, {"k_cache", &kv.k},
                     {"v_cache", &kv.v}, {"block_table", &kv.block_table}, {"indptr", &kv.indptr},
                     {"page_ids", &kv.page_ids}, {"last_page_len", &kv.last_page_len},
                     {"k_cur", &k_cur}, {"v_cur", &v_cur}});
    const std::lock_guard lock(h->one_call);
    h->pipe->attend(as_int(layer, "layer"), ctx, kv, k_cur, v_cur, out);
  };
  // out [4, num_layers] int64: rows, bytes, reused, corrected (fetch_stats), accumulated.
  auto stats = [h, sh](ffi::TensorView out) {
    expect_dtype(out, "out", kDLInt, 64);
    expect(out, "out", {4, sh.num_layers});
    const std::lock_guard lock(h->one_call);
    const kvscout::fetch_stats& st = h->pipe->stats();
    std::int64_t* o = span_of<std::int64_t>(out).data();
    const std::size_t L = static_cast<std::size_t>(sh.num_layers);
    for (std::size_t l = 0; l < L; ++l)
      o[l] = st.rows[l], o[L + l] = st.bytes[l], o[2 * L + l] = st.reused[l],
      o[3 * L + l] = st.corrected[l];
  };
  // The rows layer `layer`'s speculation selected (corrected: the last correction's added rows)
  // into indices [S, H, capacity], counts [S, H] int32.
  auto selection = [h, sh](std::int64_t layer, bool corrected, ffi::TensorView indices,
                           ffi::TensorView counts) {
    const std::lock_guard lock(h->one_call);
    const auto sel = h->pipe->selection(as_int(layer, "layer"), corrected);
    expect_dtype(indices, "indices", kDLInt, 32);
    expect(indices, "indices", {sh.num_seqs, sh.num_kv_heads, sel.capacity});
    expect_dtype(counts, "counts", kDLInt, 32);
    expect(counts, "counts", {sh.num_seqs, sh.num_kv_heads});
    std::copy(sel.indices.begin(), sel.indices.end(), span_of<std::int32_t>(indices).begin());
    std::copy(sel.counts.begin(), sel.counts.end(), span_of<std::int32_t>(counts).begin());
  };
  auto rotated_keys = [h]() { return h->pipe->rotated_keys(); };
  // The benchmark's anchor (bench/python/pipeline_step.py): `steps` whole steps run in C++ with
  // the calls Python makes per layer (speculate of layer l + 1 from xs[l], attend of layer l with
  // qs[l]), on this pipeline; returns the nanoseconds they took. xs [L, S, d_model], qs [L, S, Hq,
  // D], k_cur / v_cur [L, S, H, D]; caches: one per layer.
  auto time_steps = [h, sh](std::int64_t steps, ffi::TensorView xs, ffi::TensorView qs,
                            ffi::TensorView positions, ffi::TensorView seq_lens,
                            ffi::Array<kv_arg> caches, ffi::TensorView k_cur,
                            ffi::TensorView v_cur, ffi::TensorView out, std::int64_t skip) {
    const int L = sh.num_layers, S = sh.num_seqs, H = sh.num_kv_heads, D = sh.head_dim;
    expect_dtype(xs, "xs", kDLFloat, 32);
    expect(xs, "xs", {L, S, sh.d_model});
    expect_dtype(qs, "qs", kDLFloat, 32);
    expect(qs, "qs", {L, S, sh.num_q_heads, D});
    expect(k_cur, "k_cur", {L, S, H, D});
    expect(v_cur, "v_cur", {L, S, H, D});
    expect_dtype(out, "out", kDLFloat, 32);
    expect(out, "out", {S, sh.num_q_heads, D});
    if (caches.size() != static_cast<std::size_t>(L))
      TVM_FFI_THROW(ValueError) << "caches: " << caches.size() << ", expected one per layer";
    std::vector<kv_tensors> kv;
    for (int l = 0; l < L; ++l) kv.push_back(kv_of(caches[l], seq_lens));
    auto ctx = context_of(sh, seq_lens, no_tensor());
    ctx.positions = kvscout::host_span<const std::int32_t>(
        int32_data(positions, "positions", {S}), static_cast<std::size_t>(S));
    const std::size_t cur_bytes = size_bytes(k_cur) / static_cast<std::size_t>(L);
    const auto layer_of = [](const ffi::TensorView& t, int l, std::size_t bytes) {
      DLTensor d{};
      d.data = t.data_ptr();
      d.device = t.device();
      d.ndim = t.ndim() - 1;
      d.dtype = t.dtype();
      d.shape = const_cast<std::int64_t*>(t.shape().data()) + 1;
      d.strides = const_cast<std::int64_t*>(t.strides().data()) + 1;
      d.byte_offset = t.byte_offset() + static_cast<std::uint64_t>(l) * bytes;
      return d;
    };
    const std::lock_guard lock(h->one_call);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t n = 0; n < steps; ++n)
      for (int l = 0; l < L; ++l) {
        if (l + 1 < L && l + 1 >= skip) {
          ctx.x = span_of<const float>(xs).subspan(static_cast<std::size_t>(l) * S * sh.d_model,
                                                   static_cast<std::size_t>(S) * sh.d_model);
          h->pipe->speculate(l + 1, ctx, kv[static_cast<std::size_t>(l + 1)]);
        }
        ctx.q = span_of<const float>(qs).subspan(
            static_cast<std::size_t>(l) * S * sh.num_q_heads * D,
            static_cast<std::size_t>(S) * sh.num_q_heads * D);
        const DLTensor kc = layer_of(k_cur, l, cur_bytes), vc = layer_of(v_cur, l, cur_bytes);
        h->pipe->attend(l, ctx, kv[static_cast<std::size_t>(l)], ffi::TensorView(&kc),
                        ffi::TensorView(&vc), out);
      }
    return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
  };
  return ffi::Array<ffi::Function>{
      ffi::Function::FromTyped(std::move(append)), ffi::Function::FromTyped(std::move(speculate)),
      ffi::Function::FromTyped(std::move(attend)), ffi::Function::FromTyped(std::move(stats)),
      ffi::Function::FromTyped(std::move(selection)),
      ffi::Function::FromTyped(std::move(rotated_keys)),
      ffi::Function::FromTyped(std::move(time_steps))};
}

// name / fields: the preset; dims: [num_layers, num_seqs, num_kv_heads, num_q_heads, head_dim,
// d_model, max_tokens]; kind / order: the cache (kv_args.hpp); dtype: the caches' element type
// (float32, float16, bfloat16); w_q / b_q: one tensor per layer (b_q: none, or one per layer).
ffi::Array<ffi::Function> make_pipeline(ffi::String name, ffi::Array<double> fields,
                                        ffi::Array<std::int64_t> dims, double scale, double theta,
                                        std::int64_t style, double budget, std::int64_t threads,
                                        std::int64_t kind, std::int64_t order,
                                        ffi::String dtype, std::int64_t first_layer,
                                        ffi::Array<ffi::Tensor> plans, ffi::Array<ffi::Tensor> corr,
                                        ffi::TensorView mass_curves, ffi::Array<ffi::Tensor> w_q,
                                        ffi::Array<ffi::Tensor> b_q) {
  const presets::speculation_preset p = preset_of(name, fields);
  kvscout::decode_shape shape = shape_of_dims(dims);
  shape.scale = static_cast<float>(scale);
  const kv_kind k = kv_kind_of(kind);
  const presets::calibration cal =
      calibration_of(p, shape, theta, style, first_layer, plans, corr, mass_curves);
  if (w_q.size() == 0) TVM_FFI_THROW(ValueError) << "w_q: no layers, expected one per layer";
  const DLDataType element = element_named(dtype);
  const pipeline_args args{p,  shape, cal, budget, w_q, b_q, as_int(threads, "threads"), element,
                           k, order};
  auto h = std::make_shared<held>();
  h->shape = shape;
  if (p.key_bits == 0)
    h->pipe = build_pipeline<float>(args);
  else if (p.key_bits == 2)
    h->pipe = build_pipeline<kvscout::quantized_keys<2>>(args);
  else
    TVM_FFI_THROW(ValueError) << p.name << ": key_bits = " << p.key_bits
                              << " was not built, expected 0 (float partial keys) or 2";
  return calls_of(std::move(h));
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_pipeline, make_pipeline);
