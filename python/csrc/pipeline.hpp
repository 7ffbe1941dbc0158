#pragma once
// The Python binding's presets::pipeline_host instances behind one interface (pipeline_calls):
// build_pipeline<PkT> picks the instance for the caches' element type, head_dim, layout and W_Q's
// dtype. Its two partial-key formats are compiled in two translation units (pipeline_keys*.cpp),
// in parallel; pipeline.cpp exports the calls.

#include <tvm/ffi/container/array.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "checks.hpp"
#include "kv_args.hpp"
#include "kvscout/kvscout.hpp"
#include "policy_args.hpp"
#include "preset_args.hpp"

namespace kvscout_py {

// The calls Python makes; one implementation per instance.
struct pipeline_calls {
  virtual ~pipeline_calls() = default;
  virtual void append(int layer, const ffi::TensorView& keys, const ffi::TensorView& seq_ids,
                      const ffi::TensorView& token_ids) = 0;
  virtual void speculate(int layer, const kvscout::score_context<kvscout::host_space>& ctx,
                         const kv_tensors& kv) = 0;
  virtual void attend(int layer, const kvscout::score_context<kvscout::host_space>& ctx,
                      const kv_tensors& kv, const ffi::TensorView& k_cur,
                      const ffi::TensorView& v_cur, const ffi::TensorView& out) = 0;
  virtual const kvscout::fetch_stats& stats() const = 0;
  virtual kvscout::selection_view<kvscout::host_space> selection(int layer, bool corrected) const = 0;
  virtual bool rotated_keys() const = 0;
};

template <class Layout, class PkT>
struct pipeline_of final : pipeline_calls {
  using T = typename Layout::element_type;
  kvscout::decode_shape shape;
  presets::pipeline_host<Layout, PkT> owned;

  template <class In>
  pipeline_of(const presets::speculation_preset& p, const kvscout::decode_shape& s,
              const presets::calibration& cal, double budget,
              const std::vector<kvscout::host_span<const In>>& w_q,
              const std::vector<kvscout::host_span<const In>>& b_q, int threads)
      : shape(s), owned(p, s, cal, budget, w_q, b_q, threads) {}

  void append(int layer, const ffi::TensorView& keys, const ffi::TensorView& seq_ids,
              const ffi::TensorView& token_ids) override {
    if (layer < 0 || layer >= shape.num_layers)
      TVM_FFI_THROW(ValueError) << "layer " << layer << " is out of range [0, " << shape.num_layers
                                << ")";
    if (!owned.policy().tracks(layer)) return;  // not speculated: no partial keys
    append_keys(owned.policy()[layer], shape.num_kv_heads, shape.head_dim, keys, seq_ids,
                token_ids);
  }
  void speculate(int layer, const kvscout::score_context<kvscout::host_space>& ctx,
                 const kv_tensors& kv) override {
    const auto src = kv_view_of<Layout>(kv, shape.num_seqs, shape.max_tokens);
    guarded([&] {
      owned.pipeline().speculate(layer, ctx, src);
      return 0;
    });
  }
  void attend(int layer, const kvscout::score_context<kvscout::host_space>& ctx,
              const kv_tensors& kv, const ffi::TensorView& k_cur, const ffi::TensorView& v_cur,
              const ffi::TensorView& out) override {
    const auto src = kv_view_of<Layout>(kv, shape.num_seqs, shape.max_tokens);
    kvscout::current_token<T> cur{};
    if (k_cur.numel() > 0 || v_cur.numel() > 0) {
      const DLDataType want = element_dtype<T>();
      for (const auto* t : {&k_cur, &v_cur}) {
        expect(*t, t == &k_cur ? "k_cur" : "v_cur",
               {shape.num_seqs, shape.num_kv_heads, shape.head_dim});
        if (!is(t->dtype(), want.code, want.bits))
          TVM_FFI_THROW(TypeError) << (t == &k_cur ? "k_cur" : "v_cur") << ": dtype "
                                   << dtype_name(t->dtype()) << ", expected the cache's "
                                   << dtype_name(want);
      }
      cur = {span_of<const T>(k_cur), span_of<const T>(v_cur)};
    }
    guarded([&] {
      owned.pipeline().attend(layer, ctx, src, cur, span_of<float>(out));
      return 0;
    });
  }
  const kvscout::fetch_stats& stats() const override { return owned.pipeline().stats(); }
  kvscout::selection_view<kvscout::host_space> selection(int layer, bool corrected) const override {
    return guarded([&] {
      return corrected ? owned.pipeline().last_correction() : owned.pipeline().last_selection(layer);
    });
  }
  bool rotated_keys() const override {
    return owned.policy().pointers()[static_cast<std::size_t>(owned.configuration().skip_layers)]
        ->rotated_keys();
  }
};

template <class In>
std::vector<kvscout::host_span<const In>> spans_of(const ffi::Array<ffi::Tensor>& a,
                                                   const char* what, DLDataType want) {
  std::vector<kvscout::host_span<const In>> out;
  for (std::size_t l = 0; l < a.size(); ++l) {
    const ffi::TensorView t = a[l];
    if (t.device().device_type != kDLCPU || !t.IsContiguous())
      TVM_FFI_THROW(ValueError) << what << "[" << l << "]: expected a contiguous CPU tensor";
    if (!is(t.dtype(), want.code, want.bits))
      TVM_FFI_THROW(TypeError) << what << "[" << l << "]: dtype " << dtype_name(t.dtype())
                               << ", expected w_q[0]'s " << dtype_name(want);
    out.push_back(span_of<const In>(t));
  }
  return out;
}

// What build_pipeline needs: the preset, shape, calibration, budget, each layer's W_Q / b_Q
// tensors, the gather's threads, and the caches' element type, kind and order (kv_args.hpp).
struct pipeline_args {
  presets::speculation_preset preset;
  kvscout::decode_shape shape;
  presets::calibration cal;
  double budget = 0;
  ffi::Array<ffi::Tensor> w_q, b_q;
  int threads = 1;
  DLDataType element{};
  kv_kind kind = kv_kind::contiguous;
  std::int64_t order = 0;
};

template <class PkT>
std::unique_ptr<pipeline_calls> build_pipeline(const pipeline_args& a) {
  const DLDataType wd = ffi::TensorView(a.w_q[0]).dtype();
  std::unique_ptr<pipeline_calls> out;
  const auto build = [&]<class Layout, class In>() {
    const auto w = spans_of<In>(a.w_q, "w_q", wd);
    const auto b = spans_of<In>(a.b_q, "b_q", wd);
    out = guarded([&] {
      return std::unique_ptr<pipeline_calls>(std::make_unique<pipeline_of<Layout, PkT>>(
          a.preset, a.shape, a.cal, a.budget, w, b, a.threads));
    });
  };
  with_element(a.element, "dtype", a.shape.head_dim, [&]<class T, int D>() {
    with_layout<T, D>(a.kind, a.order, [&]<class Layout>() {
      if (is(wd, kDLFloat, 32))
        build.template operator()<Layout, float>();
      else if (is(wd, kDLFloat, 16))
        build.template operator()<Layout, kvscout::half>();
      else if (is(wd, kDLBfloat, 16))
        build.template operator()<Layout, kvscout::bfloat16>();
      else
        TVM_FFI_THROW(TypeError) << "w_q[0]: dtype " << dtype_name(wd)
                                 << ", expected float32, float16 or bfloat16";
    });
  });
  return out;
}

extern template std::unique_ptr<pipeline_calls> build_pipeline<float>(const pipeline_args&);
extern template std::unique_ptr<pipeline_calls> build_pipeline<kvscout::quantized_keys<2>>(
    const pipeline_args&);

}  // namespace kvscout_py
