// The host InfiniGen policy for Python: make_infinigen_policy builds one layer's
// infinigen_policy_host over the caller's workspace tensor and returns its calls as closures
// (append, score, score_query) that hold the policy and a reference to the workspace, so neither
// can go away while Python holds a call. Partial keys: float (key_bits 0) or 2-bit
// (quantized_keys<2>, kvscout_default's); W_Q float32, float16 or bfloat16.
//
// Plans arrive as arrays, one entry per KV head: rope_planes mode as its planes [H, r / 2] (the
// plan is rope_planes_plan's), the skew modes as their rotation A [H, D, D] and channels [H, r].

#include <tvm/ffi/container/array.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "checks.hpp"
#include "policy_args.hpp"
#include "kvscout/kvscout.hpp"

namespace {

using namespace kvscout_py;

// dims: [num_seqs, num_kv_heads, num_q_heads, head_dim, d_model, max_tokens];
// opts: [mode, aggregation, query_aggregation (-1: the same), r, correction_r].
kvscout::infinigen_config config_of(const ffi::Array<std::int64_t>& dims, double scale,
                                    const ffi::Array<std::int64_t>& opts) {
  if (dims.size() != 6)
    TVM_FFI_THROW(ValueError) << "dims holds " << dims.size()
                              << " numbers, expected [num_seqs, num_kv_heads, num_q_heads, "
                                 "head_dim, d_model, max_tokens]";
  if (opts.size() != 5)
    TVM_FFI_THROW(ValueError) << "options hold " << opts.size()
                              << " numbers, expected [mode, aggregation, query_aggregation, r, "
                                 "correction_r]";
  const auto enum_in = [](std::int64_t v, int n, const char* name) {
    if (v < 0 || v >= n)
      TVM_FFI_THROW(ValueError) << name << " = " << v << ", expected a value in [0, " << n << ")";
    return static_cast<int>(v);
  };
  kvscout::infinigen_config c;
  c.shape = {.num_seqs = as_int(dims[0], "num_seqs"),
             .num_kv_heads = as_int(dims[1], "num_kv_heads"),
             .num_q_heads = as_int(dims[2], "num_q_heads"),
             .head_dim = as_int(dims[3], "head_dim"),
             .d_model = as_int(dims[4], "d_model"),
             .max_tokens = as_int(dims[5], "max_tokens"),
             .scale = static_cast<float>(scale)};
  c.mode = static_cast<kvscout::rope_mode>(enum_in(opts[0], 3, "mode"));
  c.aggregation = static_cast<kvscout::gqa_aggregation>(enum_in(opts[1], 3, "aggregation"));
  if (opts[2] >= 0)
    c.query_aggregation =
        static_cast<kvscout::gqa_aggregation>(enum_in(opts[2], 3, "query_aggregation"));
  c.r = as_int(opts[3], "r");
  c.correction_r = as_int(opts[4], "correction_r");
  return c;
}

template <class F>
void with_key_bits(std::int64_t key_bits, F&& f) {
  if (key_bits == 0)
    f.template operator()<float>();
  else if (key_bits == 2)
    f.template operator()<kvscout::quantized_keys<2>>();
  else
    TVM_FFI_THROW(ValueError) << "key_bits = " << key_bits
                              << " was not built, expected 0 (float partial keys) or 2";
}

std::int64_t infinigen_workspace_bytes(ffi::Array<std::int64_t> dims, double scale,
                                       ffi::Array<std::int64_t> opts, std::int64_t key_bits) {
  std::int64_t n = 0;
  with_key_bits(key_bits, [&]<class PkT>() {
    n = guarded([&] {
      return static_cast<std::int64_t>(
          kvscout::infinigen_policy_host<PkT>::workspace_bytes(config_of(dims, scale, opts)));
    });
  });
  return n;
}

// tvm-ffi releases the GIL during a call, and a policy's calls share its scratch: one at a time.
template <class P>
struct held {
  ffi::Tensor workspace;  // the caller's memory the policy lives in, kept alive here
  std::optional<P> policy;
  std::mutex one_call;
};

template <class P>
ffi::Array<ffi::Function> calls_of(std::shared_ptr<held<P>> h) {
  const auto& c = h->policy->configuration();
  const int S = c.shape.num_seqs, H = c.shape.num_kv_heads, Hq = c.shape.num_q_heads,
            D = c.shape.head_dim, dm = c.shape.d_model, T = c.shape.max_tokens;
  // keys [n, H, D] (float32 / float16 / bfloat16), seq_ids / token_ids [n] int32.
  auto append = [h, H, D](ffi::TensorView keys, ffi::TensorView seq_ids, ffi::TensorView token_ids) {
    const ffi::TensorView ws = h->workspace;
    expect_disjoint({{"the policy's workspace", &ws}},
                    {{"keys", &keys}, {"seq_ids", &seq_ids}, {"token_ids", &token_ids}});
    const std::lock_guard lock(h->one_call);
    append_keys(*h->policy, H, D, keys, seq_ids, token_ids);
  };
  const auto context = [S](const ffi::TensorView& seq_lens, const ffi::TensorView& seq_ids) {
    expect_dtype(seq_lens, "seq_lens", kDLInt, 32);
    expect(seq_lens, "seq_lens", {S});
    kvscout::score_context<kvscout::host_space> ctx{};
    ctx.seq_lens = span_of<const std::int32_t>(seq_lens);
    if (seq_ids.numel() > 0) {
      expect_dtype(seq_ids, "seq_ids", kDLInt, 32);
      expect(seq_ids, "seq_ids", {S});
      ctx.seq_ids = span_of<const std::int32_t>(seq_ids);
    }
    return ctx;
  };
  const auto scores_of = [S, H, T](const ffi::TensorView& out) {
    expect_dtype(out, "out", kDLFloat, 32);
    expect(out, "out", {S, H, T});
    return kvscout::score_buffer<kvscout::host_space>{span_of<float>(out), S, H, T};
  };
  // x [S, d_model] float32 (layer i - 1's input), positions / seq_lens [S] int32, seq_ids [S] or
  // empty -> out [S, H, max_tokens] float32.
  auto score = [h, S, dm, context, scores_of](ffi::TensorView x, ffi::TensorView positions,
                                              ffi::TensorView seq_lens, ffi::TensorView seq_ids,
                                              ffi::TensorView out) {
    expect_dtype(x, "x", kDLFloat, 32);
    expect(x, "x", {S, dm});
    expect_dtype(positions, "positions", kDLInt, 32);
    expect(positions, "positions", {S});
    const ffi::TensorView ws = h->workspace;
    expect_disjoint({{"out", &out}, {"the policy's workspace", &ws}},
                    {{"x", &x}, {"positions", &positions}, {"seq_lens", &seq_lens},
                     {"seq_ids", &seq_ids}});
    const std::lock_guard lock(h->one_call);
    auto ctx = context(seq_lens, seq_ids);
    ctx.x = span_of<const float>(x);
    ctx.positions = span_of<const std::int32_t>(positions);
    const auto buf = scores_of(out);
    guarded([&] {
      h->policy->score(ctx, buf);
      return 0;
    });
  };
  // q [S, num_q_heads, head_dim] float32 (layer i's own query, after RoPE).
  auto score_query = [h, S, Hq, D, context, scores_of](ffi::TensorView q, ffi::TensorView seq_lens,
                                                       ffi::TensorView seq_ids, ffi::TensorView out) {
    expect_dtype(q, "q", kDLFloat, 32);
    expect(q, "q", {S, Hq, D});
    const ffi::TensorView ws = h->workspace;
    expect_disjoint({{"out", &out}, {"the policy's workspace", &ws}},
                    {{"q", &q}, {"seq_lens", &seq_lens}, {"seq_ids", &seq_ids}});
    const std::lock_guard lock(h->one_call);
    auto ctx = context(seq_lens, seq_ids);
    const auto buf = scores_of(out);
    guarded([&] {
      h->policy->score_query(span_of<const float>(q), ctx, buf);
      return 0;
    });
  };
  return ffi::Array<ffi::Function>{ffi::Function::FromTyped(std::move(append)),
                                   ffi::Function::FromTyped(std::move(score)),
                                   ffi::Function::FromTyped(std::move(score_query))};
}

// plan_* / corr_*: the speculation's and (empty: none) the correction's plans; w_q
// [num_q_heads * head_dim, d_model], b_q [num_q_heads * head_dim] or empty; workspace uint8 of
// infinigen_workspace_bytes, 64-byte aligned.
ffi::Array<ffi::Function> make_infinigen_policy(
    ffi::Array<std::int64_t> dims, double scale, ffi::Array<std::int64_t> opts,
    std::int64_t key_bits, double theta, std::int64_t style, ffi::TensorView plan_planes,
    ffi::TensorView plan_A, ffi::TensorView plan_channels, ffi::TensorView corr_planes,
    ffi::TensorView corr_A, ffi::TensorView corr_channels, ffi::TensorView w_q,
    ffi::TensorView b_q, ffi::Tensor workspace) {
  const kvscout::infinigen_config c = config_of(dims, scale, opts);
  guarded([&] {
    kvscout::detail::check_infinigen_config(c);
    return 0;
  });
  const auto plans = plans_of(c.mode, c.shape.num_kv_heads, c.shape.head_dim, c.r, theta, style, plan_planes,
                               plan_A, plan_channels, "planes");
  const bool corrected = c.correction_r > 0;
  const auto corr = corrected ? plans_of(c.mode, c.shape.num_kv_heads, c.shape.head_dim, c.correction_r,
                                         theta, style, corr_planes, corr_A, corr_channels,
                                         "correction planes")
                              : std::vector<kvscout::skew_plan>{};
  const int rows = c.shape.num_q_heads * c.shape.head_dim;
  expect(w_q, "w_q", {rows, c.shape.d_model});
  if (b_q.numel() > 0) expect(b_q, "b_q", {rows});
  if (b_q.numel() > 0 && !is(b_q.dtype(), w_q.dtype().code, w_q.dtype().bits))
    TVM_FFI_THROW(TypeError) << "b_q: dtype " << dtype_name(b_q.dtype())
                             << ", expected w_q's " << dtype_name(w_q.dtype());
  expect_dtype(workspace, "workspace", kDLUInt, 8);
  expect(workspace, "workspace", {-1});
  const ffi::TensorView ws_view = workspace;
  expect_disjoint({{"workspace", &ws_view}}, {{"w_q", &w_q}, {"b_q", &b_q}});
  ffi::Array<ffi::Function> calls;
  with_key_bits(key_bits, [&]<class PkT>() {
    using P = kvscout::infinigen_policy_host<PkT>;
    auto h = std::make_shared<held<P>>();
    h->workspace = workspace;
    const auto ws = span_of<std::byte>(workspace);
    const auto build = [&]<class In>() {
      const auto w = span_of<const In>(w_q);
      const auto b = b_q.numel() > 0 ? span_of<const In>(b_q) : kvscout::host_span<const In>{};
      guarded([&] {
        if (corrected)
          h->policy.emplace(c, plans, corr, w, b, ws);
        else
          h->policy.emplace(c, plans, w, b, ws);
        return 0;
      });
    };
    const DLDataType d = w_q.dtype();
    if (is(d, kDLFloat, 32))
      build.template operator()<float>();
    else if (is(d, kDLFloat, 16))
      build.template operator()<kvscout::half>();
    else if (is(d, kDLBfloat, 16))
      build.template operator()<kvscout::bfloat16>();
    else
      TVM_FFI_THROW(TypeError) << "w_q: dtype " << dtype_name(d)
                               << ", expected float32, float16 or bfloat16";
    calls = calls_of(std::move(h));
  });
  return calls;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(infinigen_workspace_bytes, infinigen_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_infinigen_policy, make_infinigen_policy);
