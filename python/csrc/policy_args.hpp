#pragma once
// The InfiniGen policy's arguments from Python: its skew plans from arrays, and its append.
//
// Skew plans from arrays, one entry per KV head: rope_planes mode as its planes [H, r / 2] (the plan
// is rope_planes_plan's), the skew modes as their rotation A [H, D, D] and channels [H, r].

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "checks.hpp"
#include "kvscout/kvscout.hpp"

namespace kvscout_py {

// One plan per KV head from the arrays (see the header comment); `what` names them in errors.
inline std::vector<kvscout::skew_plan> plans_of(kvscout::rope_mode mode, int H, int D, int r,
                                                double theta, std::int64_t style,
                                                const ffi::TensorView& planes,
                                                const ffi::TensorView& A,
                                                const ffi::TensorView& channels, const char* what) {
  if (style != 0 && style != 1)
    TVM_FFI_THROW(ValueError) << "rope style " << style << ", expected 0 (split_half) or 1 "
                              << "(interleaved)";
  const kvscout::rope_config rope{D, static_cast<float>(theta),
                                  static_cast<kvscout::rope_style>(style)};
  std::vector<kvscout::skew_plan> out;
  if (mode == kvscout::rope_mode::rope_planes) {
    expect_dtype(planes, what, kDLInt, 32);
    expect(planes, what, {H, r / 2});
    const auto* p = span_of<const std::int32_t>(planes).data();
    for (int h = 0; h < H; ++h)
      out.push_back(guarded([&] {
        return kvscout::rope_planes_plan(rope, std::vector<int>(p + h * (r / 2), p + (h + 1) * (r / 2)));
      }));
    return out;
  }
  expect_dtype(A, "A", kDLFloat, 32);
  expect(A, "A", {H, D, D});
  expect_dtype(channels, what, kDLInt, 32);
  expect(channels, what, {H, r});
  const auto* a = span_of<const float>(A).data();
  const auto* ch = span_of<const std::int32_t>(channels).data();
  for (int h = 0; h < H; ++h) {
    kvscout::skew_plan p;
    p.mode = mode;
    p.head_dim = D;
    p.r = r;
    p.rope = rope;
    p.A.assign(a + static_cast<std::size_t>(h) * D * D, a + static_cast<std::size_t>(h + 1) * D * D);
    p.channels.assign(ch + static_cast<std::size_t>(h) * r, ch + static_cast<std::size_t>(h + 1) * r);
    out.push_back(std::move(p));
  }
  return out;
}

// policy.append of keys [n, H, D] (float32 / float16 / bfloat16) for seq_ids / token_ids [n] int32.
template <class P>
void append_keys(P& policy, int H, int D, const ffi::TensorView& keys,
                 const ffi::TensorView& seq_ids, const ffi::TensorView& token_ids) {
  expect(keys, "keys", {-1, H, D});
  expect_dtype(seq_ids, "seq_ids", kDLInt, 32);
  expect(seq_ids, "seq_ids", {keys.size(0)});
  expect_dtype(token_ids, "token_ids", kDLInt, 32);
  expect(token_ids, "token_ids", {keys.size(0)});
  const int n = as_int(keys.size(0), "tokens");
  const auto ids = span_of<const std::int32_t>(seq_ids);
  const auto toks = span_of<const std::int32_t>(token_ids);
  const DLDataType d = keys.dtype();
  guarded([&] {
    if (is(d, kDLFloat, 32))
      policy.append(span_of<const float>(keys), ids, toks, n);
    else if (is(d, kDLFloat, 16))
      policy.append(span_of<const kvscout::half>(keys), ids, toks, n);
    else if (is(d, kDLBfloat, 16))
      policy.append(span_of<const kvscout::bfloat16>(keys), ids, toks, n);
    else
      TVM_FFI_THROW(TypeError) << "keys: dtype " << dtype_name(d)
                               << ", expected float32, float16 or bfloat16";
    return 0;
  });
}

}  // namespace kvscout_py
