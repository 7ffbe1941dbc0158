// The decode-step benchmark's model (bench/cuda/decode_step.cuh) at a small shape: each of its
// ways runs whole steps, and every layer's attention output is checked against the host backend
// on the same inputs (the query, the new token's K / V and, for the sparse ways, the selection
// that layer's attention read, all recorded on the device during the step):
//   kvscout, kvscout_row_cache, infinigen: decode_attention_host over the selected rows gathered
//     from the host cache (so a fetch of the wrong layer, slot or rows, or a missing wait, fails);
//   kvscout_corrected: the same over joined_rows_host of the speculated and the added rows, the added
//     ones distinct, inside the sequence, none speculated, min(extra, unspeculated) of them;
//   flexgen, resident: decode_attention_host over the whole host cache.
// Also: the GEMM wrapper against an fp64 host product (both transposes), the selections (counts,
// ascending indices inside the sequence, the 4 sinks and 16 recent tokens kept), the row cache's
// hits on the second step, a captured step replayed (kvscout and flexgen), the bytes a full
// fetch moves, and bad configurations refused by value. Contiguous HND and 16-token pages.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "decode_step.cuh"
#include "gpu_harness.cuh"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/attention/rows.hpp"

namespace {

using decode_step::decode_way;
using kvscout::half;
constexpr int D = 64;
using contiguous = kvscout::contiguous_layout<half, D, kvscout::hnd>;
using paged = kvscout::paged_layout<half, D, kvscout::hnd, kvscout::block_table, 16>;
using kivi2 = kvscout::kivi_layout<half, D, 2>;
using kivi4 = kvscout::kivi_layout<half, D, 4>;

decode_step::stack_config small_config() {
  decode_step::stack_config c;
  c.model = {.d_model = 128, .q_heads = 4, .kv_heads = 2, .mlp = 192, .layers = 3,
             .rope_theta = 10000.f};
  c.lens = {300, 170};
  c.budget = 0.1;  // 30 rows per (sequence, kv head)
  c.staged_threads = 2;
  c.record = true;
  return c;
}

// Rows of a selection gathered from a host cache, for gathered_rows_host<half, D>.
template <class L>
struct host_gathered {
  std::vector<half> k, v;
};

template <class L>
double check_layer(const decode_step::decode_stack<L>& st, int l, bool sparse, const char* what,
                   bool corrected = false) {
  constexpr int HD = L::head_dim;  // the layout's, not the file's D
  const auto& cfg = st.config();
  const int S = st.batch(), H = cfg.model.kv_heads, Hq = cfg.model.q_heads, cap = st.budget_rows();
  const auto rec = st.record(l);
  const auto cache = st.host_cache(l);
  const kvscout::attention_params p{.num_q_heads = Hq, .scale = 1.f / std::sqrt(float(HD))};
  const kvscout::current_token<half> cur{{rec.k_new.data(), rec.k_new.size()},
                                         {rec.v_new.data(), rec.v_new.size()}};
  std::vector<float> want(rec.q.size());
  if (sparse) {
    // The selection: counts, ascending indices in [0, len), the keep-set (4 sinks, 16 recent).
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const int row = s * H + h, len = st.fetchable(s);
        GPU_CHECK(rec.cnt[row] == std::min(len, cap));
        const std::int32_t* idx = rec.idx.data() + static_cast<std::size_t>(row) * cap;
        bool ok = true;
        for (int i = 0; i < rec.cnt[row]; ++i) {
          ok = ok && idx[i] >= 0 && idx[i] < len && (i == 0 || idx[i] > idx[i - 1]);
        }
        for (int t : {0, 1, 2, 3, len - 1, len - 16})
          ok = ok && std::binary_search(idx, idx + rec.cnt[row], t);
        if (!ok) std::fprintf(stderr, "%s layer %d (s %d, h %d): bad selection\n", what, l, s, h);
        GPU_CHECK(ok);
      }
    // The selected rows gathered from the host cache (fp16 rows, or KIVI's K code and V records).
    const std::size_t kb = cache.layout.k_row_bytes(), vb = cache.layout.v_row_bytes();
    std::vector<std::byte> gk(static_cast<std::size_t>(S) * H * cap * kb), gv(static_cast<std::size_t>(S) * H * cap * vb);
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const int row = s * H + h;
        for (int i = 0; i < rec.cnt[row]; ++i) {
          const int t = rec.idx[static_cast<std::size_t>(row) * cap + i];
          const std::size_t slot = static_cast<std::size_t>(row) * cap + i;
          std::copy_n(cache.k.data() + cache.layout.k_offset(s, t, h), kb, gk.begin() + slot * kb);
          std::copy_n(cache.v.data() + cache.layout.v_offset(s, t, h), vb, gv.begin() + slot * vb);
        }
      }
    const kvscout::selection_view<kvscout::host_space> sel{{rec.idx.data(), rec.idx.size()},
                                                           {rec.cnt.data(), rec.cnt.size()}, S, H, cap};
    if constexpr (kvscout::kivi_quantized_layout<L>) {
      const auto res = st.resident_of_cache(l);  // one cache per layer here
      auto down = [](kvscout::device_span<const std::byte> d) {
        std::vector<std::byte> v(d.size());
        KVSCOUT_CUDA_CHECK(cudaMemcpy(v.data(), d.data(), d.size(), cudaMemcpyDeviceToHost));
        return v;
      };
      const auto kp = down(res.k_params), kr = down(res.k_residual), vr = down(res.v_residual);
      const kvscout::kivi_resident_view<kvscout::host_space> hres{
          {kp.data(), kp.size()}, {kr.data(), kr.size()}, {vr.data(), vr.size()}};
      kvscout::decode_attention_host(
          kvscout::kivi_gathered_rows_host<L>(cache.layout, sel, {gk.data(), gk.size()}, {gv.data(), gv.size()}, hres),
          cur, {rec.q.data(), rec.q.size()}, {want.data(), want.size()}, p);
    } else if (!corrected) {
      kvscout::decode_attention_host(
          kvscout::gathered_rows_host<half, HD>(sel, {reinterpret_cast<const half*>(gk.data()), gk.size() / 2},
                                          {reinterpret_cast<const half*>(gv.data()), gv.size() / 2}),
          cur, {rec.q.data(), rec.q.size()}, {want.data(), want.size()}, p);
    } else {
      // kvscout_corrected: the added rows (distinct, inside the sequence, none speculated, as many
      // as the correction may add), gathered too, attended after the speculated ones.
      const int xc = st.extra_rows();
      std::vector<half> ak(static_cast<std::size_t>(S) * H * xc * HD), av(ak.size());
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < H; ++h) {
          const int row = s * H + h, len = st.fetchable(s);
          GPU_CHECK(rec.add_cnt[row] == std::min(xc, len - rec.cnt[row]));
          const std::int32_t* sp = rec.idx.data() + static_cast<std::size_t>(row) * cap;
          std::vector<std::int32_t> seen;
          for (int i = 0; i < rec.add_cnt[row]; ++i) {
            const int t = rec.add_idx[static_cast<std::size_t>(row) * xc + i];
            const bool ok = t >= 0 && t < len && !std::binary_search(sp, sp + rec.cnt[row], t) &&
                            std::find(seen.begin(), seen.end(), t) == seen.end();
            GPU_CHECK(ok);
            if (!ok) continue;
            seen.push_back(t);
            const std::size_t slot = static_cast<std::size_t>(row) * xc + i;
            std::copy_n(reinterpret_cast<const half*>(cache.k.data() + cache.layout.k_offset(s, t, h)), HD,
                        ak.begin() + slot * HD);
            std::copy_n(reinterpret_cast<const half*>(cache.v.data() + cache.layout.v_offset(s, t, h)), HD,
                        av.begin() + slot * HD);
          }
        }
      const kvscout::selection_view<kvscout::host_space> added{
          {rec.add_idx.data(), rec.add_idx.size()}, {rec.add_cnt.data(), rec.add_cnt.size()}, S, H, xc};
      const kvscout::gathered_rows_host<half, HD> spec_rows(
          sel, {reinterpret_cast<const half*>(gk.data()), gk.size() / 2},
          {reinterpret_cast<const half*>(gv.data()), gv.size() / 2});
      const kvscout::gathered_rows_host<half, HD> add_rows(added, {ak.data(), ak.size()}, {av.data(), av.size()});
      kvscout::decode_attention_host(kvscout::joined_rows_host<kvscout::gathered_rows_host<half, HD>,
                                                          kvscout::gathered_rows_host<half, HD>>(spec_rows, add_rows),
                                     cur, {rec.q.data(), rec.q.size()}, {want.data(), want.size()}, p);
    }
  } else if constexpr (!kvscout::kivi_quantized_layout<L>) {
    kvscout::decode_attention_host(kvscout::layout_rows_host<L>(cache), cur, {rec.q.data(), rec.q.size()},
                                   {want.data(), want.size()}, p);
  }
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(kvscout::to_float(rec.out[i])) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  // The device output is half: half an ulp of the largest output, plus float summation order.
  const double tol = scale / 2048 + 1e-4;
  if (!(worst <= tol) || scale == 0)
    std::fprintf(stderr, "%s layer %d: max |err| %.3g (tolerance %.3g, max |out| %.3g)\n", what, l,
                 worst, tol, scale);
  GPU_CHECK(worst <= tol);
  GPU_CHECK(scale > 0.05);  // outputs that are not all zero
  return worst;
}

template <class L>
void run_way(decode_way w, const char* layout_name) {
  decode_step::decode_stack<L> st(small_config());
  const std::string what = std::string(decode_step::way_name(w)) + "/" + layout_name;
  const bool corrected = w == decode_way::kvscout_corrected;
  const bool sparse = w == decode_way::kvscout || w == decode_way::kvscout_cache ||
                      w == decode_way::infinigen || corrected;
  st.reset_counters();
  st.step(w, true);
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(st.device_status() == 0);
  double worst = 0;
  for (int l = 0; l < st.layers(); ++l)
    worst = std::max(worst, check_layer(st, l, sparse, what.c_str(), corrected));
  if (sparse) {
    long long want = 0;  // the speculated rows, and the added ones (counted too)
    for (int s = 0; s < st.batch(); ++s) {
      const int spec = std::min(st.fetchable(s), st.budget_rows());
      want += spec + (corrected ? std::min(st.extra_rows(), st.fetchable(s) - spec) : 0);
    }
    want *= static_cast<long long>(st.config().model.kv_heads) * st.layers();
    GPU_CHECK(st.rows_per_step() == want);
  }
  if (w == decode_way::kvscout_cache) {  // a second step: the keep-set's 20 rows at least hit
    GPU_CHECK(st.cache_hits() == 0);
    st.step(w);
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    const unsigned long long floor = 20ull * st.batch() * st.config().model.kv_heads * st.layers();
    std::printf("  %s: row-cache hits on step 2: %llu (keep-set floor %llu)\n", what.c_str(),
                st.cache_hits(), floor);
    GPU_CHECK(st.cache_hits() >= floor);
    for (int l = 0; l < st.layers(); ++l) worst = std::max(worst, check_layer(st, l, true, what.c_str()));
  }
  if (w == decode_way::kvscout || w == decode_way::flexgen || corrected) {  // a graph, replayed
    cudaGraphExec_t g = st.capture(w);
    KVSCOUT_CUDA_CHECK(cudaGraphLaunch(g, st.compute_stream()));
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(st.compute_stream()));
    KVSCOUT_CUDA_CHECK(cudaGraphExecDestroy(g));
    for (int l = 0; l < st.layers(); ++l)
      worst = std::max(worst, check_layer(st, l, sparse, (what + " (graph)").c_str(), corrected));
  }
  std::printf("  %s: worst |err| %.3g over %d layers\n", what.c_str(), worst, st.layers());
}

// The benchmark's own head_dim (128) and GQA group (4), layers sharing 2 cache sets, 4k-token
// rows, and the row cache's two graphs (even and odd steps) replayed in turn: every layer of the
// last replay against the host.
void larger_shape_row_cache_graphs() {
  using L = kvscout::contiguous_layout<half, 128, kvscout::hnd>;
  decode_step::stack_config c;
  c.model = {.d_model = 256, .q_heads = 8, .kv_heads = 2, .mlp = 256, .layers = 3};
  c.lens = {4000, 2500};
  c.budget = 0.1;
  c.distinct_caches = 2;  // layer 2 reads layer 0's cache set
  c.staged_threads = 2;
  c.record = true;
  decode_step::decode_stack<L> st(c);
  GPU_CHECK(st.cache_of(2) == 0 && st.cache_of(1) == 1);
  cudaGraphExec_t g[2] = {st.capture(decode_way::kvscout_cache), st.capture(decode_way::kvscout_cache)};
  for (int i = 0; i < 4; ++i) KVSCOUT_CUDA_CHECK(cudaGraphLaunch(g[i % 2], st.compute_stream()));
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(st.compute_stream()));
  for (auto e : g) KVSCOUT_CUDA_CHECK(cudaGraphExecDestroy(e));
  GPU_CHECK(st.device_status() == 0);
  double worst = 0;
  for (int l = 0; l < st.layers(); ++l)
    worst = std::max(worst, check_layer(st, l, true, "kvscout_row_cache/d128 (graphs)"));
  // Consecutive steps take different inputs (the input ring): not every row repeats.
  const unsigned long long rows = 3ull * 2 * (400 + 250);
  std::printf("  d128, 4 graph replays: worst |err| %.3g; row-cache hits %llu of %llu rows\n", worst,
              st.cache_hits(), 4 * rows);
  GPU_CHECK(st.cache_hits() >= 3 * 20ull * 2 * 2 * 3);  // the keep-set, on steps 2-4
  GPU_CHECK(st.cache_hits() < 3 * rows);
}

void gemm_matches_host() {
  const int B = 3, out = 40, in = 72;
  std::vector<half> w(static_cast<std::size_t>(out) * in), x(static_cast<std::size_t>(B) * in);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = kvscout::from_float<half>(decode_step::hash_unit(i + 17));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = kvscout::from_float<half>(decode_step::hash_unit(i + 99991));
  std::vector<float> y0(static_cast<std::size_t>(B) * out);
  for (std::size_t i = 0; i < y0.size(); ++i) y0[i] = decode_step::hash_unit(i + 555);
  decode_step::arena a;
  half* dw = a.upload(w);
  half* dx = a.upload(x);
  float* dy = a.upload(y0);
  half* dyh = a.device<half>(y0.size());
  cublasHandle_t h{};
  DECODE_STEP_CUBLAS(cublasCreate(&h));
  decode_step::gemm_rows(h, dw, out, in, dx, B, dy, CUDA_R_32F, 1.f);   // y += W x
  decode_step::gemm_rows(h, dw, out, in, dx, B, dyh, CUDA_R_16F, 0.f);  // y = W x, half
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> y(y0.size());
  std::vector<half> yh(y0.size());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
  KVSCOUT_CUDA_CHECK(cudaMemcpy(yh.data(), dyh, yh.size() * 2, cudaMemcpyDeviceToHost));
  cublasDestroy(h);
  double worst = 0, worst_h = 0;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < out; ++o) {
      double ref = 0;
      for (int i = 0; i < in; ++i)
        ref += double(kvscout::to_float(w[static_cast<std::size_t>(o) * in + i])) *
               kvscout::to_float(x[static_cast<std::size_t>(b) * in + i]);
      const std::size_t k = static_cast<std::size_t>(b) * out + o;
      worst = std::max(worst, std::abs(y[k] - (ref + y0[k])));
      worst_h = std::max(worst_h, std::abs(kvscout::to_float(yh[k]) - ref) / std::max(1.0, std::abs(ref)));
    }
  std::printf("  gemm: float |err| %.3g, half relative %.3g\n", worst, worst_h);
  GPU_CHECK(worst < 1e-3);
  GPU_CHECK(worst_h < 1.0 / 1024);
}

void full_fetch_bytes() {
  auto c = small_config();
  c.record = false;
  decode_step::decode_stack<contiguous> a(c);
  // Every cached row of both sequences, K and V: (300 + 170) tokens x 2 heads x 2 x 64 x 2 bytes.
  GPU_CHECK(a.layer_bytes() == std::size_t{470} * 2 * 2 * D * 2);
  decode_step::decode_stack<paged> b(c);
  // The page pool whole: ceil((300 + 1) / 16) + ceil((170 + 1) / 16) = 19 + 11 pages.
  GPU_CHECK(b.layer_bytes() == std::size_t{30} * 16 * 2 * 2 * D * 2);
}

void kivi_refuses_dense() {
  auto c = small_config();
  c.record = false;
  decode_step::decode_stack<kivi2> s(c);
  // 300 tokens: keys quantised 256 at a time of R = 128, values all but 128: 172 fetchable rows.
  GPU_CHECK(s.fetchable(0) == 172 && s.fetchable(1) == 42);
  GPU_CHECK(s.layer_bytes() == std::size_t{172 + 42} * 2 * s.row_pair_bytes());
  GPU_CHECK(gpu_test::throws_with([&] { s.step(decode_way::flexgen); }, "way flexgen"));
  GPU_CHECK(gpu_test::throws_with([&] { s.step(decode_way::resident); }, "way resident"));
  GPU_CHECK(gpu_test::throws_with([&] { s.step(decode_way::kvscout_corrected); }, "way kvscout_corrected"));
}

void bad_configs() {
  auto c = small_config();
  c.budget = 0;
  GPU_CHECK(gpu_test::throws_with([&] { decode_step::decode_stack<contiguous> s(c); }, "budget 0"));
  c = small_config();
  c.lens = {300, 0};
  GPU_CHECK(gpu_test::throws_with([&] { decode_step::decode_stack<contiguous> s(c); }, "sequence length 0"));
  c = small_config();
  c.model.kv_heads = 3;
  GPU_CHECK(gpu_test::throws_with([&] { decode_step::decode_stack<contiguous> s(c); }, "q_heads = 4"));
  c = small_config();
  c.record = false;
  decode_step::decode_stack<contiguous> s(c);
  GPU_CHECK(gpu_test::throws_with([&] { (void)s.record(0); }, "without config.record"));
  GPU_CHECK(gpu_test::throws_with([&] { (void)s.capture(decode_way::infinigen); }, "way infinigen"));
}

}  // namespace

int main() {
  return gpu_test::run_all(
      "decode_step_model",
      {{"gemm_matches_host", gemm_matches_host},
       {"kvscout_contiguous", [] { run_way<contiguous>(decode_way::kvscout, "contiguous"); }},
       {"kvscout_paged", [] { run_way<paged>(decode_way::kvscout, "paged16"); }},
       {"kvscout_row_cache", [] { run_way<contiguous>(decode_way::kvscout_cache, "contiguous"); }},
       {"kvscout_corrected_contiguous", [] { run_way<contiguous>(decode_way::kvscout_corrected, "contiguous"); }},
       {"kvscout_corrected_paged", [] { run_way<paged>(decode_way::kvscout_corrected, "paged16"); }},
       {"flexgen_contiguous", [] { run_way<contiguous>(decode_way::flexgen, "contiguous"); }},
       {"flexgen_paged", [] { run_way<paged>(decode_way::flexgen, "paged16"); }},
       {"infinigen_contiguous", [] { run_way<contiguous>(decode_way::infinigen, "contiguous"); }},
       {"infinigen_paged", [] { run_way<paged>(decode_way::infinigen, "paged16"); }},
       {"kvscout_kivi2", [] { run_way<kivi2>(decode_way::kvscout, "kivi2"); }},
       {"kvscout_kivi4_row_cache", [] { run_way<kivi4>(decode_way::kvscout_cache, "kivi4"); }},
       {"infinigen_kivi2", [] { run_way<kivi2>(decode_way::infinigen, "kivi2"); }},
       {"kivi_refuses_dense_ways", kivi_refuses_dense},
       {"resident_contiguous", [] { run_way<contiguous>(decode_way::resident, "contiguous"); }},
       {"resident_paged", [] { run_way<paged>(decode_way::resident, "paged16"); }},
       {"larger_shape_row_cache_graphs", larger_shape_row_cache_graphs},
       {"full_fetch_bytes", full_fetch_bytes},
       {"bad_configs", bad_configs}});
}
