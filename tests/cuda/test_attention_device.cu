// Device decode attention (attention/decode.cuh) against decode_attention_host: sparse over
// gathered rows (fp16 / bf16 / fp32; head_dim 64 / 128 / 256; GQA groups 1, 4 and 12, the last
// spanning two blocks), with and without the current token, empty row sets; KIVI-2 / KIVI-4
// records dequantised on the fly plus the residual window (vs kivi_gathered_rows_host); the dense
// anchor over a device layout (vs layout_rows_host); the status word on a bad KIVI index and on
// misaligned rows; q and out in half / bfloat16.
// Tolerance |a - b| <= 2e-5 + 2e-4 |b| (fp32 accumulation in a different order); the worst
// element is printed.

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fetch_fixtures.cuh"
#include "kvscout/attention/decode.cuh"
#include "kvscout/core/workspace.hpp"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/fetch/host_gather.hpp"

using namespace fetch_test;
using kvscout::bfloat16;
using kvscout::half;

// Not in the unnamed namespace: nvcc warns about its unused members there.
namespace rows_concept {

// The concept names all the kernel calls: the library's row sources model it, and a source that
// lacks one of the device calls, or returns the wrong thing from one, does not.
static_assert(kvscout::attention_rows_cuda<kvscout::gathered_rows_cuda<half, 128>>);
static_assert(kvscout::attention_rows_cuda<
              kvscout::layout_rows_cuda<kvscout::contiguous_layout<half, 64, kvscout::hnd>>>);
static_assert(kvscout::attention_rows_cuda<
              kvscout::kivi_gathered_rows_cuda<kvscout::kivi_layout<half, 128, 2>>>);
struct rows_without_load_v {
  using element_type = half;
  static constexpr int head_dim = 64;
  int num_seqs() const { return 1; }
  int num_kv_heads() const { return 1; }
  int rows(int, int, int*) const { return 0; }
  template <int E>
  bool load_k(int, int, int, int, float (&)[E], int*) const { return true; }
};
struct rows_with_void_load_k : rows_without_load_v {
  template <int E>
  void load_k(int, int, int, int, float (&)[E], int*) const {}
  template <int E>
  void load_v(int, int, int, int, float (&)[E]) const {}
};
struct complete_rows : rows_without_load_v {
  template <int E>
  void load_v(int, int, int, int, float (&)[E]) const {}
};
static_assert(kvscout::attention_rows_cuda<complete_rows>);
static_assert(!kvscout::attention_rows_cuda<rows_without_load_v>);
static_assert(!kvscout::attention_rows_cuda<rows_with_void_load_k>);
static_assert(!kvscout::attention_rows_cuda<int>);
static_assert(!kvscout::attention_rows_cuda<kvscout::gathered_rows_host<half, 128>>);

}  // namespace rows_concept

namespace {

// How the cases run the device attention: without a plan (one block per pair and head block),
// or planned for a 132-SM device with splits of a few rows (so that the small cases here split
// into many blocks, some empty, and the merge kernel runs), or planned for fewer rows than the
// pairs hold (the last split reads the rest). main() runs every case in each mode.
struct split_mode {
  const char* name;
  int max_rows;  // 0: no plan
  int min_rows_per_split;
};
constexpr split_mode split_modes[] = {
    {"unplanned", 0, 0}, {"splits of 4 rows", 100, 4}, {"max_rows underestimated", 8, 4},
    {"splits of 1 row", 4096, 1}};
const split_mode* g_split = &split_modes[0];

template <kvscout::attention_rows_cuda Rows, kvscout::kv_element T, class QSpan = const float,
          class O = float>
void attend(const Rows& rows, const kvscout::current_token<T, kvscout::device_space>& cur,
            kvscout::device_span<QSpan> q, kvscout::device_span<O> out,
            const kvscout::attention_params& p, int* status = nullptr) {
  if (g_split->max_rows == 0) {
    kvscout::decode_attention_cuda(rows, cur, q, out, p, {nullptr, status});
    return;
  }
  const auto plan = kvscout::plan_decode_attention_cuda(
      {.shape = {.num_seqs = rows.num_seqs(), .num_kv_heads = rows.num_kv_heads(),
       .num_q_heads = p.num_q_heads, .head_dim = Rows::head_dim}, .max_rows = g_split->max_rows,
       .num_sms = 132, .min_rows_per_split = g_split->min_rows_per_split});
  device_vector<std::byte> ws(plan.workspace_bytes());  // poisoned: unwritten partials show
  kvscout::decode_attention_cuda(rows, cur, q, out, p, plan, {ws.data(), plan.workspace_bytes()},
                                 {nullptr, status});
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// rel_extra: more relative tolerance, for outputs rounded to a narrower type.
void compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& want,
             double rel_extra = 0.0) {
  double worst = 0.0;
  std::size_t at = 0;
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = 2e-5 + (2e-4 + rel_extra) * std::fabs(want[i]);
    if (!(err <= tol)) ++bad;
    if (!(err <= worst)) worst = err, at = i;
  }
  std::printf("  %-44s worst |err| %.3g at %zu (got %.7g, want %.7g)%s\n", name.c_str(), worst,
              at, want.empty() ? 0.0 : got[at], want.empty() ? 0.0 : want[at],
              bad ? "  <-- FAIL" : "");
  GPU_CHECK(bad == 0);
}

// Sparse attention over random gathered T rows; k_scale / v_scale as an fp8 cache passes them.
template <class T, int D>
void gathered_case(int S, int H, int g, bool with_current, double density, std::uint32_t seed,
                   float k_scale = 1.f, float v_scale = 1.f) {
  const int cap = 96, Hq = H * g;
  std::mt19937 rng(seed);
  std::vector<int> lens;
  for (int s = 0; s < S; ++s) lens.push_back(s == 1 ? 0 : 200 + 37 * s);
  host_selection sel(lens, H, cap, density, rng);
  const std::size_t slots = static_cast<std::size_t>(S) * H * cap;
  auto k = random_values<T>(slots * D, seed + 1), v = random_values<T>(slots * D, seed + 2);
  auto ck = random_values<T>(static_cast<std::size_t>(S) * H * D, seed + 3);
  auto cv = random_values<T>(static_cast<std::size_t>(S) * H * D, seed + 4);
  auto q = random_floats(static_cast<std::size_t>(S) * Hq * D, seed + 5);
  const kvscout::attention_params p{.num_q_heads = Hq,
                                    .scale = 1.f / std::sqrt(float(D)),
                                    .k_scale = k_scale,
                                    .v_scale = v_scale};

  std::vector<float> want(q.size(), -1.f);
  kvscout::gathered_rows_host<T, D> rows(sel.view(), {k.data(), k.size()}, {v.data(), v.size()});
  kvscout::current_token<T> cur{};
  if (with_current) cur = {{ck.data(), ck.size()}, {cv.data(), cv.size()}};
  kvscout::decode_attention_host(rows, cur, {q.data(), q.size()}, {want.data(), want.size()}, p);

  device_selection dsel(sel);
  device_vector<T> dk(k), dv(v), dck(ck), dcv(cv);
  device_vector<float> dq(q), dout(q.size());
  device_vector<int> status(1);
  clear_status(status);
  kvscout::gathered_rows_cuda<T, D> drows(dsel.view(), {dk.data(), dk.size()},
                                          {dv.data(), dv.size()});
  kvscout::current_token<T, kvscout::device_space> dcur{};
  if (with_current) dcur = {{dck.data(), dck.size()}, {dcv.data(), dcv.size()}};
  attend(drows, dcur, {dq.data(), dq.size()}, {dout.data(), dout.size()}, p, status.data());
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  compare(std::string(kvscout::dtype_traits<T>::name) + "/d" + std::to_string(D) + " S" +
              std::to_string(S) + " H" + std::to_string(H) + " g" + std::to_string(g) +
              (with_current ? " +cur" : "") + " p" + std::to_string(density) +
              (k_scale != 1.f || v_scale != 1.f ? " scaled" : ""),
          dout.download(), want);
  GPU_CHECK(read_status(status) == 0);
}

// An engine's own query and output types: q and out in Q / O (half or bfloat16) instead of
// float. The reference attends with the query as the device reads it (rounded to Q, widened);
// the device output is rounded once to O, so the tolerance is O's half ulp on top.
template <class T, int D, class Q, class O>
void typed_q_out_case(std::uint32_t seed) {
  const int S = 2, H = 2, g = 4, cap = 64, Hq = H * g;
  std::mt19937 rng(seed);
  host_selection sel({150, 90}, H, cap, 0.25, rng);
  const std::size_t slots = static_cast<std::size_t>(S) * H * cap;
  auto k = random_values<T>(slots * D, seed + 1), v = random_values<T>(slots * D, seed + 2);
  const auto qf = random_floats(static_cast<std::size_t>(S) * Hq * D, seed + 3);
  std::vector<Q> q(qf.size());
  std::vector<float> q_read(qf.size());  // the query the device reads
  for (std::size_t i = 0; i < qf.size(); ++i) {
    q[i] = kvscout::from_float<Q>(qf[i]);
    q_read[i] = kvscout::to_float(q[i]);
  }
  const kvscout::attention_params p{.num_q_heads = Hq, .scale = 1.f / std::sqrt(float(D))};
  std::vector<float> want(q.size());
  kvscout::gathered_rows_host<T, D> rows(sel.view(), {k.data(), k.size()}, {v.data(), v.size()});
  kvscout::decode_attention_host(rows, kvscout::current_token<T>{}, {q_read.data(), q_read.size()},
                                 {want.data(), want.size()}, p);
  device_selection dsel(sel);
  device_vector<T> dk(k), dv(v);
  device_vector<Q> dq(q);
  device_vector<O> dout(std::vector<O>(q.size(), kvscout::from_float<O>(-7.f)));  // poisoned
  kvscout::gathered_rows_cuda<T, D> drows(dsel.view(), {dk.data(), dk.size()},
                                          {dv.data(), dv.size()});
  attend(drows, kvscout::current_token<T, kvscout::device_space>{},
                                   kvscout::device_span<const Q>(dq.data(), dq.size()),
                                   kvscout::device_span<O>(dout.data(), dout.size()), p);
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got;
  for (const O x : dout.download()) got.push_back(kvscout::to_float(x));
  // O's relative half ulp: 2^-11 (half) or 2^-8 (bfloat16); none for float.
  const double ulp = std::is_same_v<O, float> ? 0.0 : std::is_same_v<O, bfloat16> ? 1.0 / 256 : 1.0 / 2048;
  compare("q " + std::string(kvscout::dtype_traits<Q>::name) + " / out " +
              std::string(kvscout::dtype_traits<O>::name) + " over " +
              std::string(kvscout::dtype_traits<T>::name) + " rows",
          got, want, ulp);
}

// KIVI: gather records on the host, attend on the device over records + resident window.
template <class L>
void kivi_case(double density, std::uint32_t seed, bool corrupt = false) {
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  const int H = 2, g = 3, Hq = H * g, cap = 64;
  const std::vector<int32_t> lens = {420, 70, 333};
  kivi_cache<L> cache(lens, H, 512, {.group = 32, .residual = 64}, seed);
  std::vector<int> qlens;
  for (int s = 0; s < 3; ++s) qlens.push_back(cache.layout.seq_len(s));
  std::mt19937 rng(seed);
  host_selection sel(qlens, H, cap, density, rng);
  const std::size_t slots = 3ull * H * cap;
  const std::size_t kb = cache.layout.k_row_bytes(), vb = cache.layout.v_row_bytes();
  std::vector<std::byte> gk(slots * kb + 16), gv(slots * vb + 16);
  // 16-byte aligned views into the vectors
  auto align16 = [](std::vector<std::byte>& b) {
    auto p = reinterpret_cast<std::uintptr_t>(b.data());
    return b.data() + ((16 - p % 16) % 16);
  };
  std::byte* gkp = align16(gk);
  std::byte* gvp = align16(gv);
  kvscout::host_gather_config hc{.shape = {.num_seqs = 3, .num_kv_heads = H}, .capacity = cap};
  auto ws = kvscout::make_workspace<kvscout::gather_executor_host<L>>(hc);
  kvscout::gather_executor_host<L> gather(hc, ws.span());
  const auto b = cache.store.buffers();
  const auto view = b.view(cache.layout);
  gather.submit(view.quantized(), sel.view(), {{gkp, slots * kb}, {gvp, slots * vb}});

  auto ck = random_values<T>(3ull * H * D, seed + 3), cv = random_values<T>(3ull * H * D, seed + 4);
  auto q = random_floats(3ull * Hq * D, seed + 5);
  const kvscout::attention_params p{.num_q_heads = Hq, .scale = 1.f / std::sqrt(float(D))};
  std::vector<float> want(q.size());
  kvscout::kivi_gathered_rows_host<L> rows(cache.layout, sel.view(),
                                           kvscout::host_span<const std::byte>(gkp, slots * kb),
                                           kvscout::host_span<const std::byte>(gvp, slots * vb),
                                           view.resident);
  kvscout::decode_attention_host(rows, kvscout::current_token<T>{{ck.data(), ck.size()}, {cv.data(), cv.size()}},
                                 {q.data(), q.size()}, {want.data(), want.size()}, p);

  // Device copies: lengths, selection, gathered records, resident buffers.
  device_vector<int32_t> dlens(cache.lens);
  const L dl = L::padded(H, 512, dlens.data(), 3, {.group = 32, .residual = 64});
  host_selection bad_sel = sel;
  if (corrupt) {  // an index past the quantised tokens of sequence 0, head 0
    bad_sel.indices[0] = qlens[0] + 5;
    if (bad_sel.counts[0] == 0) bad_sel.counts[0] = 1;
  }
  device_selection dsel(corrupt ? bad_sel : sel);
  auto up = [](const std::byte* p0, std::size_t n) {
    return device_vector<std::byte>(std::vector<std::byte>(p0, p0 + n));
  };
  auto dgk = up(gkp, slots * kb), dgv = up(gvp, slots * vb);
  auto dkp = up(b.k_params.data(), b.k_params.size());
  auto dkr = up(b.k_residual.data(), b.k_residual.size());
  auto dvr = up(b.v_residual.data(), b.v_residual.size());
  device_vector<T> dck(ck), dcv(cv);
  device_vector<float> dq(q), dout(q.size());
  device_vector<int> status(1);
  clear_status(status);
  kvscout::kivi_gathered_rows_cuda<L> drows(
      dl, dsel.view(), {{dgk.data(), dgk.bytes()}, {dgv.data(), dgv.bytes()}},
      {{dkp.data(), dkp.bytes()}, {dkr.data(), dkr.bytes()}, {dvr.data(), dvr.bytes()}});
  attend(drows, kvscout::current_token<T, kvscout::device_space>{{dck.data(), dck.size()}, {dcv.data(), dcv.size()}},
                                   {dq.data(), dq.size()}, {dout.data(), dout.size()}, p,
                                   status.data());
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string name = "kivi" + std::to_string(L::key_bits) + "v" + std::to_string(L::value_bits) + "/" +
                           std::string(kvscout::dtype_traits<T>::name) + "/d" + std::to_string(D) +
                           " p" + std::to_string(density);
  if (!corrupt) {
    compare(name, dout.download(), want);
    GPU_CHECK(read_status(status) == 0);
  } else {
    GPU_CHECK(read_status(status) == kvscout::device_status::bad_index);
    auto out = dout.download();
    bool finite = true;
    for (float x : out) finite = finite && std::isfinite(x);
    GPU_CHECK(finite);
  }
}

// Dense anchor: a whole device-resident contiguous cache.
template <class T, int D>
void dense_case(std::uint32_t seed) {
  using L = kvscout::contiguous_layout<T, D, kvscout::hnd>;
  const int H = 2, g = 4, Hq = H * g, cap = 300;
  std::vector<int32_t> lens = {300, 17};
  const L hl = L::padded(H, cap, lens.data(), 2);
  const std::size_t n = hl.required_bytes() / sizeof(T);
  auto k = random_values<T>(n, seed), v = random_values<T>(n, seed + 1);
  auto q = random_floats(2ull * Hq * D, seed + 2);
  const kvscout::attention_params p{.num_q_heads = Hq, .scale = 1.f / std::sqrt(float(D))};
  std::vector<float> want(q.size());
  kvscout::layout_rows_host<L> rows({hl, kvscout::as_bytes(kvscout::host_span<const T>(k.data(), n)),
                                     kvscout::as_bytes(kvscout::host_span<const T>(v.data(), n))});
  kvscout::decode_attention_host(rows, kvscout::current_token<T>{}, {q.data(), q.size()},
                                 {want.data(), want.size()}, p);
  device_vector<int32_t> dlens(lens);
  const L dl = L::padded(H, cap, dlens.data(), 2);
  device_vector<T> dk(k), dv(v);
  device_vector<float> dq(q), dout(q.size());
  kvscout::layout_rows_cuda<L> drows(
      {dl, {reinterpret_cast<const std::byte*>(dk.data()), dk.bytes()},
       {reinterpret_cast<const std::byte*>(dv.data()), dv.bytes()}});
  attend(drows, kvscout::current_token<T, kvscout::device_space>{}, {dq.data(), dq.size()},
                                   {dout.data(), dout.size()}, p);
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  compare(std::string("dense ") + std::string(kvscout::dtype_traits<T>::name) + "/d" + std::to_string(D),
          dout.download(), want);
}

// A layout that places every row one element past where contiguous_layout would (as a page
// stride of one page + 1 element does): the dense anchor must skip each row with `misaligned`
// rather than fault on a vector load.
template <class T, int D>
struct shifted_layout : kvscout::contiguous_layout<T, D, kvscout::hnd> {
  using base = kvscout::contiguous_layout<T, D, kvscout::hnd>;
  shifted_layout() = default;
  explicit shifted_layout(const base& b) : base(b) {}
  KVSCOUT_HOST_DEVICE std::size_t k_offset(int s, int t, int h) const {
    return base::k_offset(s, t, h) + sizeof(T);
  }
  KVSCOUT_HOST_DEVICE std::size_t v_offset(int s, int t, int h) const {
    return base::v_offset(s, t, h) + sizeof(T);
  }
};

void dense_misaligned_case() {
  using T = half;
  constexpr int D = 128;
  using L = shifted_layout<T, D>;
  const int H = 2, Hq = 4, cap = 40;
  std::vector<int32_t> lens = {40, 9};
  device_vector<int32_t> dlens(lens);
  const L dl(L::base::padded(H, cap, dlens.data(), 2));
  // One spare row, so that the shift alone is wrong (no row runs past the buffers).
  const std::size_t n = dl.required_bytes() / sizeof(T) + D;
  device_vector<T> dk(random_values<T>(n, 21)), dv(random_values<T>(n, 22));
  const auto q = random_floats(2ull * Hq * D, 23);
  device_vector<float> dq(q), dout(q.size());
  device_vector<int> status(1);
  clear_status(status);
  kvscout::layout_rows_cuda<L> drows(
      {dl, {reinterpret_cast<const std::byte*>(dk.data()), dk.bytes()},
       {reinterpret_cast<const std::byte*>(dv.data()), dv.bytes()}});
  const kvscout::attention_params p{.num_q_heads = Hq, .scale = 1.f / std::sqrt(float(D))};
  attend(drows, kvscout::current_token<T, kvscout::device_space>{},
                                   {dq.data(), dq.size()}, {dout.data(), dout.size()}, p,
                                   status.data());
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(read_status(status) == kvscout::device_status::misaligned);
}

}  // namespace

int main() {
  const std::vector<gpu_test::test_case> cases = {
          {"gathered_f16_d128_gqa4", [] {
             for (double d : {0.05, 0.10, 0.25}) gathered_case<half, 128>(3, 2, 4, true, d, 1);
             gathered_case<half, 128>(3, 2, 4, false, 0.25, 2);
           }},
          {"gathered_f16_d64_gqa12_two_blocks", [] { gathered_case<half, 64>(2, 1, 12, true, 0.1, 3); }},
          {"gathered_bf16_d128_mha", [] { gathered_case<bfloat16, 128>(2, 4, 1, true, 0.25, 4); }},
          {"gathered_f32_d256", [] { gathered_case<float, 256>(2, 2, 2, true, 0.1, 5); }},
          {"gathered_fp8_scaled", [] {
             gathered_case<kvscout::fp8_e4m3, 128>(3, 2, 4, true, 0.1, 14, 0.37f, 2.7f);
             gathered_case<kvscout::fp8_e5m2, 64>(2, 3, 3, true, 0.25, 15, 1.9f, 0.45f);
           }},
          {"gathered_empty_rows", [] {
             gathered_case<half, 128>(2, 2, 4, true, 0.0, 6);   // current token only
             gathered_case<half, 128>(2, 2, 4, false, 0.0, 7);  // nothing: output 0
           }},
          {"kivi2_f16_d128", [] { for (double d : {0.05, 0.25}) kivi_case<kvscout::kivi_layout<half, 128, 2>>(d, 8); }},
          {"kivi4_f16_d128", [] { kivi_case<kvscout::kivi_layout<half, 128, 4>>(0.1, 9); }},
          {"kivi4_bf16_d64_f32_scales", [] { kivi_case<kvscout::kivi_layout<bfloat16, 64, 4, float>>(0.25, 10); }},
          {"kivi_k2v4_f16_d128", [] { kivi_case<kvscout::kivi_layout<half, 128, kvscout::kivi_bits{2, 4}>>(0.1, 12); }},
          {"kivi_bad_index_sets_status", [] { kivi_case<kvscout::kivi_layout<half, 128, 2>>(0.25, 11, true); }},
          {"dense_anchor_f16_d128", [] { dense_case<half, 128>(12); }},
          {"dense_anchor_f32_d64", [] { dense_case<float, 64>(13); }},
          {"dense_anchor_fp8e4m3_d64", [] { dense_case<kvscout::fp8_e4m3, 64>(16); }},
          {"dense_misaligned_rows_set_status", [] { dense_misaligned_case(); }},
          {"q_out_half", [] { typed_q_out_case<half, 128, half, half>(31); }},
          {"q_out_bf16_q_float_out", [] { typed_q_out_case<bfloat16, 64, bfloat16, float>(32); }},
          {"q_float_out_bf16", [] { typed_q_out_case<half, 64, float, bfloat16>(33); }},
  };
  int rc = 0;
  for (const split_mode& m : split_modes) {
    g_split = &m;
    std::printf("== %s\n", m.name);
    const int r = gpu_test::run_all("attention_device", cases);
    if (r == 77) return 77;
    rc = rc != 0 ? rc : r;
  }
  return rc;
}
