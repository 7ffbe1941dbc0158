// Host gather of selected rows against memcpy of the same number of bytes, in the same run.
//
// The cache: one sequence, 8 KV heads, fp16, head_dim 64 / 128 / 256 (rows of 128 / 256 / 512 B),
// 128 MiB for K and 128 MiB for V, far above the last-level cache. Each iteration gathers one of
// four seeded random selections (density 5 / 10 / 25 % of tokens per head), so the rows read are
// cold. The anchor copies the same number of bytes from a contiguous region that moves through
// the same 256 MiB. Both write the same destination and use the same thread count.
//
// Reported: bytes_per_second (bytes moved: K + V rows). scripts/bench_report.sh turns the pair
// into the ratio gather / memcpy.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvscout/core/thread_pool.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"

namespace {

constexpr std::size_t arena_bytes = std::size_t{128} << 20;  // per K and per V
constexpr int heads = 8;
constexpr int rotations = 4;

kvscout::host_pages huge() {
  const char* e = std::getenv("KVSCOUT_BENCH_PAGES");
  return e && std::string(e) == "normal" ? kvscout::host_pages::normal : kvscout::host_pages::huge;
}

struct arena {
  kvscout::host_buffer<std::byte> k, v, dk, dv;
  arena()
      : k(arena_bytes, huge()), v(arena_bytes, huge()), dk(arena_bytes / 4 + 4096, huge()),
        dv(arena_bytes / 4 + 4096, huge()) {
    // Cheap seeded non-zero fill; touches every page so first-use faults are not timed.
    std::uint32_t x = 0x9e3779b9u;
    for (std::size_t i = 0; i < arena_bytes; i += 4) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      std::memcpy(&k[i], &x, 4);
      const std::uint32_t y = ~x;
      std::memcpy(&v[i], &y, 4);
    }
    std::fill(dk.begin(), dk.end(), std::byte{1});
    std::fill(dv.begin(), dv.end(), std::byte{2});
  }
};

arena& the_arena() {
  static arena a;
  return a;
}

struct selections {
  int capacity = 0;
  std::vector<int32_t> counts;
  std::vector<std::vector<int32_t>> indices;  // one per rotation
  std::size_t rows = 0;                       // rows per selection
};

selections make_selections(int tokens, int density_percent) {
  selections s;
  s.capacity = static_cast<int>(static_cast<std::int64_t>(tokens) * density_percent / 100);
  s.counts.assign(heads, s.capacity);
  s.rows = static_cast<std::size_t>(s.capacity) * heads;
  std::mt19937 rng(1234 + density_percent);
  std::vector<int32_t> all(tokens);
  for (int r = 0; r < rotations; ++r) {
    std::vector<int32_t> idx(static_cast<std::size_t>(heads) * s.capacity);
    for (int h = 0; h < heads; ++h) {
      std::iota(all.begin(), all.end(), 0);
      for (int i = 0; i < s.capacity; ++i) {  // partial Fisher-Yates
        std::uniform_int_distribution<int> pick(i, tokens - 1);
        std::swap(all[i], all[pick(rng)]);
      }
      std::sort(all.begin(), all.begin() + s.capacity);
      std::copy(all.begin(), all.begin() + s.capacity, idx.begin() + h * s.capacity);
    }
    s.indices.push_back(std::move(idx));
  }
  return s;
}

template <int HeadDim, class Order>
void run_gather(benchmark::State& state, int density, int threads) {
  using layout = kvscout::contiguous_layout<kvscout::half, HeadDim, Order>;
  using executor = kvscout::gather_executor_host<layout>;
  arena& a = the_arena();
  const std::size_t row = HeadDim * sizeof(kvscout::half);
  const int tokens = static_cast<int>(arena_bytes / (heads * row));
  const int32_t len = tokens;
  const layout l = layout::padded(heads, tokens, &len, 1);
  const selections sel = make_selections(tokens, density);
  kvscout::host_gather_config cfg{{.num_seqs = 1, .num_kv_heads = heads}, sel.capacity, threads};
  auto ws = kvscout::make_workspace<executor>(cfg);
  executor ex(cfg, ws.span());
  const kvscout::kv_view<layout, kvscout::host_space> src{l, {a.k.data(), a.k.size()},
                                                          {a.v.data(), a.v.size()}};
  const kvscout::gather_destination<kvscout::host_space> dst{{a.dk.data(), a.dk.size()},
                                                             {a.dv.data(), a.dv.size()}};
  int r = 0;
  for (auto _ : state) {
    const kvscout::selection_view<kvscout::host_space> view{
        {sel.indices[r].data(), sel.indices[r].size()},
        {sel.counts.data(), sel.counts.size()}, 1, heads, sel.capacity};
    ex.submit(src, view, dst).wait();
    benchmark::DoNotOptimize(a.dk.data());
    benchmark::ClobberMemory();
    r = (r + 1) % rotations;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(sel.rows * row * 2));
  state.counters["rows"] = static_cast<double>(sel.rows);
}

template <int HeadDim>
void run_memcpy(benchmark::State& state, int density, int threads) {
  arena& a = the_arena();
  const std::size_t row = HeadDim * sizeof(kvscout::half);
  const int tokens = static_cast<int>(arena_bytes / (heads * row));
  const std::size_t rows = static_cast<std::size_t>(tokens * static_cast<std::int64_t>(density) / 100) * heads;
  const std::size_t bytes = rows * row;  // per K and per V
  kvscout::thread_pool pool(threads);
  std::size_t offset = 0;
  for (auto _ : state) {
    const std::size_t off = offset;
    pool.run([&](int part, int parts) noexcept {
      const std::size_t b0 = bytes * part / parts, b1 = bytes * (part + 1) / parts;
      std::memcpy(a.dk.data() + b0, a.k.data() + off + b0, b1 - b0);
      std::memcpy(a.dv.data() + b0, a.v.data() + off + b0, b1 - b0);
    });
    benchmark::DoNotOptimize(a.dk.data());
    benchmark::ClobberMemory();
    offset += bytes;
    if (offset + bytes > arena_bytes) offset = 0;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes * 2));
}

template <int HeadDim>
void dispatch_gather(benchmark::State& state) {
  const int density = static_cast<int>(state.range(1));
  const int hnd = static_cast<int>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  if (hnd) {
    run_gather<HeadDim, kvscout::hnd>(state, density, threads);
  } else {
    run_gather<HeadDim, kvscout::nhd>(state, density, threads);
  }
}

void BM_host_gather(benchmark::State& state) {
  // range(0) = row bytes: the one runtime-to-static dispatch of this benchmark.
  const int head_dim = static_cast<int>(state.range(0)) / 2;
  kvscout::dispatch_head_dim(head_dim, [&](auto hd) { dispatch_gather<decltype(hd)::value>(state); });
}

void BM_memcpy(benchmark::State& state) {
  const int head_dim = static_cast<int>(state.range(0)) / 2;
  kvscout::dispatch_head_dim(head_dim, [&](auto hd) {
    run_memcpy<decltype(hd)::value>(state, static_cast<int>(state.range(1)),
                                    static_cast<int>(state.range(2)));
  });
}

}  // namespace

BENCHMARK(BM_memcpy)
    ->ArgNames({"row", "density", "threads"})
    ->ArgsProduct({{128, 256, 512}, {5, 10, 25}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_host_gather)
    ->ArgNames({"row", "density", "hnd", "threads"})
    ->ArgsProduct({{128, 256, 512}, {5, 10, 25}, {0, 1}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK_MAIN();
