// 00_host_gather: the smallest end-to-end use of kvscout.
//
// A paged KV cache (vLLM block-table form, fp16, head_dim 128, 8 KV heads, 4 sequences of
// different lengths) lives in host memory. A selection names, per (sequence, kv_head), the tokens
// to fetch; the host gather executor copies exactly those K and V rows, merging adjacent rows,
// into a contiguous buffer. The example checks every row against the cache and prints what moved.
//
//   ./examples/00_host_gather [--threads N] [--density PERCENT]

#include <kvscout/kvscout.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {
int arg_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}
}  // namespace

int main(int argc, char** argv) try {
  using T = kvscout::half;
  constexpr int head_dim = 128, page = 16, heads = 8;
  using layout = kvscout::paged_layout<T, head_dim, kvscout::nhd, kvscout::block_table, page>;
  using executor = kvscout::gather_executor_host<layout>;
  const int threads = arg_int(argc, argv, "--threads", 2);
  const int density = arg_int(argc, argv, "--density", 10);
  KVSCOUT_EXPECTS(density >= 1 && density <= 100, "--density must be in [1, 100], got ", density);

  // Four sequences; pages handed out in a shuffled order, as an allocator would after churn.
  std::vector<int32_t> lens = {4000, 2500, 7001, 1};
  const int max_blocks = (*std::max_element(lens.begin(), lens.end()) + page - 1) / page;
  int total_pages = 0;
  for (int len : lens) total_pages += (len + page - 1) / page;
  std::vector<int32_t> ids(total_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(2024);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(lens.size() * max_blocks, -1);
  for (std::size_t s = 0, next = 0; s < lens.size(); ++s)
    for (int b = 0; b < (lens[s] + page - 1) / page; ++b) table[s * max_blocks + b] = ids[next++];
  const int num_seqs = static_cast<int>(lens.size());
  layout l({.table = table.data(), .seq_lens = lens.data(), .max_blocks_per_seq = max_blocks,
            .seqs = num_seqs},
           heads);

  // The cache: [num_pages, page, heads, head_dim] for K and for V, seeded random values.
  const std::size_t elems = static_cast<std::size_t>(total_pages) * page * heads * head_dim;
  std::vector<T> k(elems), v(elems);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::size_t i = 0; i < elems; ++i) {
    k[i] = kvscout::from_float<T>(normal(rng));
    v[i] = kvscout::from_float<T>(normal(rng));
  }

  // Selection: `density` percent of each sequence's tokens per head, ascending.
  const int capacity = (*std::max_element(lens.begin(), lens.end()) * density + 99) / 100;
  std::vector<int32_t> indices(static_cast<std::size_t>(num_seqs) * heads * capacity);
  std::vector<int32_t> counts(static_cast<std::size_t>(num_seqs) * heads);
  std::size_t selected = 0;
  for (int s = 0; s < num_seqs; ++s)
    for (int h = 0; h < heads; ++h) {
      std::vector<int32_t> all(lens[s]);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const int n = std::min<int>(capacity, (lens[s] * density + 99) / 100);
      std::sort(all.begin(), all.begin() + n);
      const std::size_t r = static_cast<std::size_t>(s) * heads + h;
      std::copy(all.begin(), all.begin() + n, indices.begin() + r * capacity);
      counts[r] = n;
      selected += n;
    }

  // Setup: size query, caller-owned workspace, executor (starts its threads once).
  kvscout::host_gather_config cfg{{.num_seqs = num_seqs, .num_kv_heads = heads}, capacity, threads};
  auto ws = kvscout::make_workspace<executor>(cfg);  // workspace_bytes(cfg) at workspace_alignment
  executor gather(cfg, ws.span());

  std::vector<T> dk(indices.size() * head_dim), dv(dk.size());
  const kvscout::kv_view<layout, kvscout::host_space> source{
      l, kvscout::as_bytes(kvscout::host_span<const T>(k.data(), k.size())),
      kvscout::as_bytes(kvscout::host_span<const T>(v.data(), v.size()))};
  const kvscout::selection_view<kvscout::host_space> sel{
      {indices.data(), indices.size()}, {counts.data(), counts.size()}, num_seqs, heads, capacity};
  const kvscout::gather_destination<kvscout::host_space> dst{
      kvscout::as_writable_bytes(kvscout::host_span<T>(dk.data(), dk.size())),
      kvscout::as_writable_bytes(kvscout::host_span<T>(dv.data(), dv.size()))};

  const auto t0 = std::chrono::steady_clock::now();
  gather.submit(source, sel, dst).wait();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  // Check every gathered row against the cache.
  std::size_t bad = 0;
  for (int s = 0; s < num_seqs; ++s)
    for (int h = 0; h < heads; ++h) {
      const std::size_t r = static_cast<std::size_t>(s) * heads + h;
      for (int i = 0; i < counts[r]; ++i) {
        const int t = indices[r * capacity + i];
        const auto* want_k = reinterpret_cast<const std::byte*>(k.data()) + l.k_offset(s, t, h);
        const auto* want_v = reinterpret_cast<const std::byte*>(v.data()) + l.v_offset(s, t, h);
        bad += std::memcmp(&dk[(r * capacity + i) * head_dim], want_k, l.k_row_bytes()) != 0;
        bad += std::memcmp(&dv[(r * capacity + i) * head_dim], want_v, l.v_row_bytes()) != 0;
      }
    }

  std::size_t cached = 0;
  for (int len : lens) cached += static_cast<std::size_t>(len) * heads;
  const double moved = static_cast<double>(selected) * static_cast<double>(l.k_row_bytes() + l.v_row_bytes());
  const double dense = static_cast<double>(cached) * static_cast<double>(l.k_row_bytes() + l.v_row_bytes());
  std::printf("kvscout 00_host_gather: %d sequences, %d kv heads, head_dim %d, fp16, paged (%d-token pages)\n",
              num_seqs, heads, head_dim, page);
  std::printf("  selected %zu of %zu (token, head) rows (%.1f%%), %d thread(s)\n", selected, cached,
              100.0 * static_cast<double>(selected) / static_cast<double>(cached), threads);
  std::printf("  bytes moved %.2f MiB of %.2f MiB dense (%.3f)\n", moved / (1 << 20),
              dense / (1 << 20), moved / dense);
  std::printf("  gather took %.1f us (%.2f GB/s); rows checked against the cache: %s\n", us,
              moved / us / 1e3, bad == 0 ? "all equal" : "MISMATCH");
  return bad == 0 ? 0 : 1;
} catch (const kvscout::error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
