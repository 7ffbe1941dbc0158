#pragma once
// Presets and shapes as Python passes them: a preset as a flat list of numbers (the order of
// `preset_fields`; python/kvscout/presets.py names them), every field checked; a model's shape as
// [num_layers, num_seqs, num_kv_heads, num_q_heads, head_dim, d_model, max_tokens].

#include <tvm/ffi/container/array.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checks.hpp"
#include "kvscout/kvscout.hpp"

namespace kvscout_py {

namespace presets = kvscout::presets;

// mode, partial_ratio, r, union_with_keys, aggregation, query_aggregation (-1: none),
// correction_r, selector, alpha, rule, sinks, recent, skip_layers, correction_share, key_bits,
// layer_rule (-1: none), layer_floor, layer_bins.
constexpr std::size_t preset_fields = 18;

inline ffi::Array<double> fields_of(const presets::speculation_preset& p) {
  return ffi::Array<double>{static_cast<double>(p.mode),
                            p.partial_ratio,
                            static_cast<double>(p.r),
                            p.union_with_keys ? 1.0 : 0.0,
                            static_cast<double>(p.aggregation),
                            p.query_aggregation ? static_cast<double>(*p.query_aggregation) : -1.0,
                            static_cast<double>(p.correction_r),
                            static_cast<double>(p.selector),
                            static_cast<double>(p.alpha),
                            static_cast<double>(p.rule),
                            static_cast<double>(p.keep.sinks),
                            static_cast<double>(p.keep.recent),
                            static_cast<double>(p.skip_layers),
                            p.correction_share,
                            static_cast<double>(p.key_bits),
                            p.layer_rule ? static_cast<double>(*p.layer_rule) : -1.0,
                            p.layer_floor,
                            static_cast<double>(p.layer_bins)};
}

// The preset the fields describe; `name` labels it in errors (the C++ keeps a pointer to it).
inline presets::speculation_preset preset_of(const std::string& name, const ffi::Array<double>& f) {
  if (f.size() != preset_fields)
    TVM_FFI_THROW(ValueError) << "a preset's fields hold " << f.size() << " numbers, expected "
                              << preset_fields;
  const auto whole = [&](std::size_t i, const char* what, int lo, int hi) {
    const double v = f[i];
    if (!(v >= lo && v <= hi) || v != static_cast<double>(static_cast<int>(v)))
      TVM_FFI_THROW(ValueError) << what << " = " << v << ", expected a whole number in [" << lo
                                << ", " << hi << "]";
    return static_cast<int>(v);
  };
  const auto share = [&](std::size_t i, const char* what, double lo, double hi, bool open_hi) {
    const double v = f[i];
    if (!(v >= lo && (open_hi ? v < hi : v <= hi)))
      TVM_FFI_THROW(ValueError) << what << " = " << v << ", expected a value in [" << lo << ", "
                                << hi << (open_hi ? ")" : "]");
    return v;
  };
  presets::speculation_preset p;
  static thread_local std::string label;  // speculation_preset::name is a const char*
  label = name;
  p.name = label.c_str();
  p.mode = static_cast<kvscout::rope_mode>(whole(0, "mode", 0, 2));
  p.partial_ratio = share(1, "partial_ratio", 0, 1, false);
  p.r = whole(2, "r", 1, 1 << 20);
  p.union_with_keys = whole(3, "union_with_keys", 0, 1) != 0;
  p.aggregation = static_cast<kvscout::gqa_aggregation>(whole(4, "aggregation", 0, 2));
  if (f[5] >= 0)
    p.query_aggregation = static_cast<kvscout::gqa_aggregation>(whole(5, "query_aggregation", 0, 2));
  p.correction_r = whole(6, "correction_r", 0, 1 << 20);
  p.selector = static_cast<presets::selector_kind>(whole(7, "selector", 0, 1));
  p.alpha = static_cast<float>(share(8, "alpha", 0, 1e30, false));
  p.rule = static_cast<kvscout::threshold_rule>(whole(9, "rule", 0, 1));
  p.keep = {whole(10, "sinks", 0, (1 << 30) - 1), whole(11, "recent", 0, (1 << 30) - 1)};
  p.skip_layers = whole(12, "skip_layers", 0, 1 << 20);
  p.correction_share = share(13, "correction_share", 0, 1, true);
  p.key_bits = whole(14, "key_bits", 0, 8);
  if (p.key_bits != 0 && p.key_bits != 2 && p.key_bits != 4 && p.key_bits != 8)
    TVM_FFI_THROW(ValueError) << "key_bits = " << p.key_bits << ", expected 0, 2, 4 or 8";
  if (f[15] >= 0) p.layer_rule = static_cast<kvscout::layer_budget_rule>(whole(15, "layer_rule", 0, 1));
  p.layer_floor = share(16, "layer_floor", 0, 1, false);
  p.layer_bins = whole(17, "layer_bins", 1, 1 << 20);
  return p;
}

inline kvscout::decode_shape shape_of_dims(const ffi::Array<std::int64_t>& d) {
  if (d.size() != 7)
    TVM_FFI_THROW(ValueError) << "dims holds " << d.size() << " numbers, expected [num_layers, "
                              << "num_seqs, num_kv_heads, num_q_heads, head_dim, d_model, "
                              << "max_tokens]";
  kvscout::decode_shape s;
  s.num_layers = as_int(d[0], "num_layers");
  s.num_seqs = as_int(d[1], "num_seqs");
  s.num_kv_heads = as_int(d[2], "num_kv_heads");
  s.num_q_heads = as_int(d[3], "num_q_heads");
  s.head_dim = as_int(d[4], "head_dim");
  s.d_model = as_int(d[5], "d_model");
  s.max_tokens = as_int(d[6], "max_tokens");
  return s;
}

}  // namespace kvscout_py
