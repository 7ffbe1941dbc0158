// The KIVI layout against fp16 rows: bytes per fetched row, gather throughput, sparse attention.
//
//   kivi2_bytes_per_row_vs_fp16  (target) bytes that cross the link per selected (token, kv head)
//                                row, KIVI-2 / fp16, head_dim 128, G = 32, fp16 scales; goal
//                                <= 0.25. Counters only (the loop does nothing worth timing).
//   BM_kivi_bytes_per_row        the same for head_dim 64 / 128, 2 / 4 bits, fp16 / fp32 scales,
//                                plus the resident key-parameter bytes per cached token.
//   BM_gather                    gather_executor_host over the same selection (10 % of 32k tokens
//                                x 8 kv heads, head_dim 128): fp16 and fp8 (e4m3) contiguous HND
//                                vs KIVI-2 / KIVI-4. Each cache form is replicated until it
//                                spans >= 256 MiB and iterations rotate over the copies and over
//                                four selections,
//                                so the rows read are cold for every form (a KIVI-2 cache of
//                                this size, 20 MiB, would otherwise sit in the last-level cache).
//                                Reported: bytes_per_second (bytes moved), items_per_second
//                                (rows).
//   BM_sparse_attention          decode_attention_host over 4096 rows per kv head (1 sequence,
//                                8 kv heads, 32 query heads, head_dim 128) + the current token:
//                                fp16 and fp8 (e4m3, with k_scale / v_scale) gathered_rows_host vs
//                                kivi_gathered_rows_host (3968 gathered records
//                                + the 128-token residual window, so both attend 4096 rows).
//                                Time per decoded token (one call = one token, all heads), on
//                                1 thread, and for fp16 and KIVI-2 also on a pool of 2 (the
//                                8 (sequence, kv head) pairs split in two).
//
// Gather caches hold seeded random bytes: a copy does not look at them. The attention caches are
// real: seeded random keys / values, quantised by kivi_append_host.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"

namespace {

using kvscout::half;
constexpr int head_dim = 128;
constexpr int heads = 8;
constexpr int group = 32;
constexpr int residual = 128;

template <int Bits, class Scale = half, int D = head_dim>
using kivi = kvscout::kivi_layout<half, D, Bits, Scale>;

// ---- bytes per row ------------------------------------------------------------------------------

template <class L>
void report_row_bytes(benchmark::State& state) {
  const int32_t len = 0;
  const L l = L::padded(heads, 1024, &len, 1, {.group = group, .residual = residual});
  std::size_t bytes = 0;
  for (auto _ : state) {
    bytes = l.k_row_bytes() + l.v_row_bytes();
    benchmark::DoNotOptimize(bytes);
  }
  const double fp16 = 2.0 * L::head_dim * sizeof(half);
  state.counters["k_row_bytes"] = static_cast<double>(l.k_row_bytes());
  state.counters["v_row_bytes"] = static_cast<double>(l.v_row_bytes());
  state.counters["bytes_per_row"] = static_cast<double>(bytes);
  state.counters["fp16_bytes_per_row"] = fp16;
  state.counters["ratio"] = static_cast<double>(bytes) / fp16;
  // Key group parameters stay resident: amortised over the G tokens of a group.
  state.counters["resident_bytes_per_token"] =
      static_cast<double>(L::k_params_group_bytes) / group;
}

void kivi2_bytes_per_row_vs_fp16(benchmark::State& state) { report_row_bytes<kivi<2>>(state); }

void BM_kivi_bytes_per_row(benchmark::State& state) {
  const int d = static_cast<int>(state.range(0));
  const int bits = static_cast<int>(state.range(1));
  const bool fp32 = state.range(2) == 32;
  kvscout::detail::dispatch(kvscout::detail::value_list<64, 128>{}, d, "head_dim", [&](auto hd) {
    kvscout::detail::dispatch(kvscout::detail::supported_kivi_bits, bits, "bits", [&](auto b) {
      constexpr int D = decltype(hd)::value, B = decltype(b)::value;
      if (fp32) {
        report_row_bytes<kivi<B, float, D>>(state);
      } else {
        report_row_bytes<kivi<B, half, D>>(state);
      }
    });
  });
}

// ---- gather -------------------------------------------------------------------------------------

constexpr int tokens = 32768;
constexpr int density_percent = 10;
constexpr int rotations = 4;
constexpr std::size_t cold_bytes = std::size_t{256} << 20;

struct selections {
  int capacity = 0;
  std::vector<int32_t> counts;
  std::vector<std::vector<int32_t>> indices;  // one per rotation
};

const selections& the_selections() {
  static const selections s = [] {
    selections r;
    r.capacity = tokens * density_percent / 100;
    r.counts.assign(heads, r.capacity);
    std::mt19937 rng(4321);
    std::vector<int32_t> all(tokens);
    for (int k = 0; k < rotations; ++k) {
      std::vector<int32_t> idx(static_cast<std::size_t>(heads) * r.capacity);
      for (int h = 0; h < heads; ++h) {
        std::iota(all.begin(), all.end(), 0);
        for (int i = 0; i < r.capacity; ++i) {  // partial Fisher-Yates
          std::uniform_int_distribution<int> pick(i, tokens - 1);
          std::swap(all[i], all[pick(rng)]);
        }
        std::sort(all.begin(), all.begin() + r.capacity);
        std::copy(all.begin(), all.begin() + r.capacity, idx.begin() + h * r.capacity);
      }
      r.indices.push_back(std::move(idx));
    }
    return r;
  }();
  return s;
}

void fill_bytes(kvscout::host_buffer<std::byte>& b, std::uint32_t seed) {
  std::uint32_t x = seed;
  for (std::size_t i = 0; i + 4 <= b.size(); i += 4) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    std::memcpy(&b[i], &x, 4);
  }
}

template <class Layout>
void run_gather(benchmark::State& state, const Layout& l, std::size_t k_bytes, std::size_t v_bytes,
                int threads) {
  using executor = kvscout::gather_executor_host<Layout>;
  const selections& sel = the_selections();
  // Copies of the cache, back to back, until they span cold_bytes.
  const std::size_t k_stride = (k_bytes + 4095) / 4096 * 4096, v_stride = (v_bytes + 4095) / 4096 * 4096;
  const int copies = static_cast<int>(std::max<std::size_t>(1, (cold_bytes + k_stride + v_stride - 1) / (k_stride + v_stride)));
  kvscout::host_buffer<std::byte> k(k_stride * copies, kvscout::host_pages::huge),
      v(v_stride * copies, kvscout::host_pages::huge);
  fill_bytes(k, 0x9e3779b9u);
  fill_bytes(v, 0x7f4a7c15u);
  const std::size_t rows = static_cast<std::size_t>(heads) * sel.capacity;
  kvscout::host_buffer<std::byte> dk(rows * l.k_row_bytes(), kvscout::host_pages::huge),
      dv(rows * l.v_row_bytes(), kvscout::host_pages::huge);
  std::fill(dk.begin(), dk.end(), std::byte{1});
  std::fill(dv.begin(), dv.end(), std::byte{2});
  kvscout::host_gather_config cfg{{.num_seqs = 1, .num_kv_heads = heads}, sel.capacity, threads};
  const auto ws = kvscout::make_workspace<executor>(cfg);
  executor ex(cfg, ws.span());
  const kvscout::gather_destination<kvscout::host_space> dst{{dk.data(), dk.size()},
                                                             {dv.data(), dv.size()}};
  int r = 0, c = 0;
  for (auto _ : state) {
    const kvscout::kv_view<Layout, kvscout::host_space> src{
        l, {k.data() + c * k_stride, k_bytes}, {v.data() + c * v_stride, v_bytes}};
    const kvscout::selection_view<kvscout::host_space> view{
        {sel.indices[r].data(), sel.indices[r].size()}, {sel.counts.data(), sel.counts.size()},
        1, heads, sel.capacity};
    ex.submit(src, view, dst).wait();
    benchmark::DoNotOptimize(dk.data());
    benchmark::ClobberMemory();
    r = (r + 1) % rotations;
    c = (c + 1) % copies;
  }
  const std::size_t row_bytes = l.k_row_bytes() + l.v_row_bytes();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * rows * row_bytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows));
  state.counters["bytes_per_row"] = static_cast<double>(row_bytes);
  state.counters["copies"] = copies;
}

template <class T>
void gather_contiguous(benchmark::State& state, int threads) {
  using L = kvscout::contiguous_layout<T, head_dim, kvscout::hnd>;
  const int32_t len = tokens;
  const L l = L::padded(heads, tokens, &len, 1);
  run_gather(state, l, l.required_bytes(), l.required_bytes(), threads);
}

void BM_gather(benchmark::State& state) {
  const int bits = static_cast<int>(state.range(0));  // 16: fp16 contiguous, 8: fp8 (e4m3)
  const int threads = static_cast<int>(state.range(1));
  if (bits == 16) return gather_contiguous<half>(state, threads);
  if (bits == 8) return gather_contiguous<kvscout::fp8_e4m3>(state, threads);
  kvscout::detail::dispatch(kvscout::detail::supported_kivi_bits, bits, "bits", [&](auto b) {
    using L = kivi<decltype(b)::value>;
    // quantized_len = tokens: the residual window holds the R newest tokens beyond them.
    static const int32_t len = tokens + residual;
    const L l = L::padded(heads, len, &len, 1, {.group = group, .residual = residual});
    run_gather(state, l, l.required_k_bytes(), l.required_v_bytes(), threads);
  });
}

// ---- sparse attention ---------------------------------------------------------------------------

constexpr int q_heads = 32;
constexpr int attended = 4096;  // rows per kv head, both forms

struct attention_inputs {
  std::vector<float> q, out;
  std::vector<half> k_cur, v_cur;
  attention_inputs() : q(static_cast<std::size_t>(q_heads) * head_dim), out(q.size()) {
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : q) x = nd(rng);
    k_cur.resize(static_cast<std::size_t>(heads) * head_dim);
    v_cur.resize(k_cur.size());
    for (auto& x : k_cur) x = kvscout::from_float<half>(nd(rng));
    for (auto& x : v_cur) x = kvscout::from_float<half>(nd(rng));
  }
  kvscout::current_token<half> current() const {
    return {{k_cur.data(), k_cur.size()}, {v_cur.data(), v_cur.size()}};
  }
};

// The benchmark's third argument is the number of threads (a thread_pool, the caller's thread
// included) the (sequence, kv head) pairs are split over.
template <class Rows>
void time_attention(benchmark::State& state, const Rows& rows, attention_inputs& in,
                    float k_scale = 1.f, float v_scale = 1.f) {
  const kvscout::attention_params p{q_heads, 1.f / std::sqrt(static_cast<float>(head_dim)),
                                    k_scale, v_scale};
  kvscout::thread_pool pool(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    kvscout::decode_attention_host(rows, in.current(), {in.q.data(), in.q.size()},
                                   {in.out.data(), in.out.size()}, p, {}, 0,
                                   kvscout::host_exec{&pool});
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  std::int64_t n = 0;
  for (int h = 0; h < heads; ++h) n += rows.rows(0, h) + 1;
  state.SetItemsProcessed(state.iterations() * n);  // rows (kv head x token) per second
  state.counters["rows_per_head"] = static_cast<double>(rows.rows(0, 0));
  state.counters["threads"] = pool.size();
}

// fp16 rows, or fp8 (e4m3) rows stored scaled as an fp8 cache holds them (x / scale, with the
// scale that maps the largest |x| to 448) and attended with k_scale / v_scale.
template <class T>
void attention_rows_of(benchmark::State& state) {
  attention_inputs in;
  std::vector<T> k(static_cast<std::size_t>(heads) * attended * head_dim), v(k.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float scale = kvscout::detail::is_fp8_v<T> ? 5.f / 448.f : 1.f;  // |x| < 5 here
  for (auto& x : k) x = kvscout::from_float<T>(nd(rng) / scale);
  for (auto& x : v) x = kvscout::from_float<T>(nd(rng) / scale);
  std::vector<int32_t> idx(static_cast<std::size_t>(heads) * attended), counts(heads, attended);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < attended; ++i) idx[h * attended + i] = 2 * i;
  const kvscout::selection_view<kvscout::host_space> sel{
      {idx.data(), idx.size()}, {counts.data(), counts.size()}, 1, heads, attended};
  const kvscout::gathered_rows_host<T, head_dim> rows(sel, {k.data(), k.size()}, {v.data(), v.size()});
  time_attention(state, rows, in, scale, scale);
}

template <class L>
void attention_kivi(benchmark::State& state) {
  attention_inputs in;
  // A real quantised cache: 8192 tokens, so quantized_len = 8064 and the window holds 128.
  std::vector<int32_t> lens = {0};
  const int len = 2 * attended;
  const L l = L::padded(heads, len, lens.data(), 1, {.group = group, .residual = residual});
  kvscout::kivi_host_storage store(l);
  {
    kvscout::kivi_append_host<L> w(l, store.buffers(), lens.data());
    std::vector<half> k(static_cast<std::size_t>(len) * heads * head_dim), v(k.size());
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : k) x = kvscout::from_float<half>(nd(rng));
    for (auto& x : v) x = kvscout::from_float<half>(nd(rng));
    w.append(0, len, {k.data(), k.size()}, {v.data(), v.size()});
  }
  const auto kv = store.buffers().view(l);
  const int selected = attended - l.residual_len(0);  // + the window = attended rows
  std::vector<int32_t> idx(static_cast<std::size_t>(heads) * selected), counts(heads, selected);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < selected; ++i) idx[h * selected + i] = 2 * i;
  const kvscout::selection_view<kvscout::host_space> sel{
      {idx.data(), idx.size()}, {counts.data(), counts.size()}, 1, heads, selected};
  using executor = kvscout::gather_executor_host<L>;
  const kvscout::host_gather_config cfg{{.num_seqs = 1, .num_kv_heads = heads}, selected, 1};
  const auto ws = kvscout::make_workspace<executor>(cfg);
  executor ex(cfg, ws.span());
  kvscout::host_buffer<std::byte> dk(idx.size() * l.k_row_bytes()), dv(idx.size() * l.v_row_bytes());
  const kvscout::gather_destination<kvscout::host_space> dst{{dk.data(), dk.size()},
                                                             {dv.data(), dv.size()}};
  ex.submit(kv.quantized(), sel, dst).wait();
  const kvscout::kivi_gathered_rows_host rows(l, sel, dst, kv.resident);
  time_attention(state, rows, in);
}

void BM_sparse_attention(benchmark::State& state) {
  const int bits = static_cast<int>(state.range(0));  // 16: fp16 rows, 8: fp8 (e4m3) rows
  const bool fp32_scales = state.range(1) == 32;
  if (bits == 16) return attention_rows_of<half>(state);
  if (bits == 8) return attention_rows_of<kvscout::fp8_e4m3>(state);
  kvscout::detail::dispatch(kvscout::detail::supported_kivi_bits, bits, "bits", [&](auto b) {
    constexpr int B = decltype(b)::value;
    if (fp32_scales) {
      attention_kivi<kivi<B, float>>(state);
    } else {
      attention_kivi<kivi<B, half>>(state);
    }
  });
}

}  // namespace

BENCHMARK(kivi2_bytes_per_row_vs_fp16)->Iterations(1);
BENCHMARK(BM_kivi_bytes_per_row)
    ->ArgNames({"head_dim", "bits", "scale"})
    ->ArgsProduct({{64, 128}, {2, 4}, {16, 32}})
    ->Iterations(1);
BENCHMARK(BM_gather)
    ->ArgNames({"bits", "threads"})
    ->ArgsProduct({{16, 8, 4, 2}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_sparse_attention)
    ->ArgNames({"bits", "scale", "threads"})
    ->Args({16, 16, 1})
    ->Args({16, 16, 2})
    ->Args({8, 16, 1})
    ->Args({4, 16, 1})
    ->Args({2, 16, 1})
    ->Args({2, 16, 2})
    ->Args({2, 32, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK_MAIN();
