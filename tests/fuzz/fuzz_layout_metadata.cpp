// libFuzzer target: the metadata kvscout checks before it touches memory. A KV layout (paged with
// a vLLM block table or a FlashInfer page table, runtime or static page size; contiguous, padded
// or ragged) is built from fuzzed dimensions and arrays, over real K / V buffers whose sizes come
// from the input too, and gather_executor_host submits a fuzzed selection (counts, indices,
// capacity) into a real destination.
//
// Every array and buffer is a heap allocation of exactly the size the API documents for the
// values given (e.g. FlashInfer's indices[indptr[num_seqs]]), so AddressSanitizer reports any
// read or write outside them. Whenever submit accepts, the destination must hold exactly the
// selected rows (compared with the source at the layout's offsets) and nothing else; whenever
// it rejects, it throws kvscout::error and the destination is untouched. Any other exception,
// crash or sanitizer report is a finding.
//
// Input framing (little-endian; fields past the end of the input read as zero):
//   u8  kind    bits 0-2: the layout
//                 0 paged<float, 4, nhd, block_table>      runtime page size
//                 1 paged<float, 4, hnd, block_table, 4>   static page size 4
//                 2 paged<half, 8, hnd, flashinfer>        runtime page size
//                 3 paged<half, 8, nhd, flashinfer, 2>     static page size 2
//                 4 contiguous<float, 4, nhd> padded       5 contiguous<half, 8, hnd> padded
//                 6 contiguous<float, 4, hnd> ragged       7 contiguous<half, 8, nhd> ragged
//               bit 3: compact selection (counts as u8; indices as u8 steps from the previous
//                      index, starting at -1: a step of 0 repeats an index)
//   u8  flags   bit 0: threads 2 (else 1)
//               bits 1-2: stores automatic, cached, streaming, or the invalid value 7
//               bit 3: paged only: K and V interleaved in one buffer, V at K + one dense page
//               bit 4: the selection's capacity is the executor's + 1
//               bit 5: the workspace is one byte short
//               bit 6: the destination K is one row short
//               bit 7: the destination K lies in the source K buffer
//   i32 num_seqs, num_kv_heads, capacity (the selection's), page_size (paged: the runtime page
//       size; contiguous: capacity / total_tokens), page_stride (paged; 0 = dense), max_blocks
//       (block table: max_blocks_per_seq), num_pages (paged: pages the K / V buffers hold),
//       k_delta, v_delta (bytes added to the K / V buffer sizes), prefetch_rows
//   then the arrays, i32 each:
//     block table:  seq_lens[num_seqs], table[num_seqs * max_blocks]
//     flashinfer:   indptr[num_seqs + 1], last_page_len[num_seqs], indices[indptr[num_seqs]]
//     padded:       seq_lens[num_seqs]
//     ragged:       indptr[num_seqs + 1]
//   then counts[num_seqs * num_kv_heads] and indices[num_seqs * num_kv_heads * capacity]
// Sizes are bounded (num_seqs <= 64, num_kv_heads <= 16, arrays <= 64 Ki entries, buffers
// <= 1 MiB); an input past a bound of an array the API reads is skipped, a buffer past its bound
// is cut to it (the library then sees a smaller buffer than the metadata wants).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/page_table.hpp"
#include "kvscout/kv/paged.hpp"

namespace {

using kvscout::host_space;

constexpr std::int64_t max_array = std::int64_t{1} << 16;
constexpr std::int64_t max_buffer = std::int64_t{1} << 20;
constexpr std::byte poison{0xCD};

/// A heap block of exactly n bytes (new[] of 0 bytes is a valid pointer ASan lets nothing
/// through).
struct block {
  std::unique_ptr<std::byte[]> p;
  std::size_t n = 0;
  explicit block(std::int64_t bytes)
      : p(new std::byte[static_cast<std::size_t>(bytes)]), n(static_cast<std::size_t>(bytes)) {}
  std::byte* data() const { return p.get(); }
};

/// An int32 array of exactly n entries (read from the input, or zero).
struct ints {
  std::unique_ptr<std::int32_t[]> p;
  std::size_t n = 0;
  explicit ints(std::int64_t count)
      : p(new std::int32_t[static_cast<std::size_t>(count)]()), n(static_cast<std::size_t>(count)) {}
  ints(fuzz::reader& in, std::int64_t count) : ints(count) {
    for (std::size_t i = 0; i < n; ++i) p[i] = in.i32();
  }
  std::int32_t* data() const { return p.get(); }
};

std::int64_t clamp_bytes(__int128 v) {
  if (v < 0) return 0;
  if (v > max_buffer) return max_buffer;
  return static_cast<std::int64_t>(v);
}

// Source bytes: a fixed pattern in which every 16-byte row differs, copied at an offset (K and V
// get different ones). Computed once: filling byte by byte on every run would cost more than
// the rest of the run.
constexpr std::size_t pattern_slack = 4096;
const std::byte* pattern() {
  static const std::vector<std::byte> p = [] {
    std::vector<std::byte> v(static_cast<std::size_t>(max_buffer) + pattern_slack);
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
    }
    return v;
  }();
  return p.data();
}
void fill(block& b, std::size_t seed) { std::memcpy(b.data(), pattern() + seed, b.n); }

bool untouched(const std::byte* p, std::size_t n) {
  static const std::vector<std::byte> ref(static_cast<std::size_t>(max_buffer), poison);
  return n == 0 || std::memcmp(p, ref.data(), n) == 0;
}

struct header {
  std::uint8_t kind, flags;
  std::int32_t num_seqs, num_kv_heads, capacity, page_size, page_stride, max_blocks, num_pages,
      k_delta, v_delta, prefetch_rows;
};

/// The selection, the destination and the submit, over a layout and its K / V buffers.
template <class Layout>
void gather(const header& h, fuzz::reader& in, const Layout& l, const std::byte* k,
            std::size_t k_size, const std::byte* v, std::size_t v_size, block& k_buf) {
  const std::int64_t pairs =
      std::int64_t{std::max(h.num_seqs, 0)} * std::max(h.num_kv_heads, 0);
  const std::int64_t cap = std::max(h.capacity, 0);
  const std::int64_t slots = pairs * cap;
  const bool compact = h.kind & 8;

  ints counts(pairs);
  const std::int64_t n_idx = std::min(slots, max_array);
  std::unique_ptr<std::int32_t[]> idx(new std::int32_t[static_cast<std::size_t>(n_idx)]);
  std::fill_n(idx.get(), n_idx, -7);
  if (compact) {
    for (std::int64_t r = 0; r < pairs; ++r) counts.p[r] = in.u8();
    for (std::int64_t r = 0; r < pairs && cap > 0; ++r) {
      std::int32_t prev = -1;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(counts.p[r], cap); ++i) {
        const std::int64_t at = r * cap + i;
        if (at >= n_idx) break;
        prev = static_cast<std::int32_t>(prev + in.u8());
        idx[at] = prev;
      }
    }
  } else {
    for (std::int64_t r = 0; r < pairs; ++r) counts.p[r] = in.i32();
    for (std::int64_t i = 0; i < n_idx; ++i) idx[i] = in.i32();
  }

  const std::size_t kb = l.k_row_bytes(), vb = l.v_row_bytes();
  std::int64_t dk_size = std::min<std::int64_t>(slots * static_cast<std::int64_t>(kb), max_buffer);
  const std::int64_t dv_size =
      std::min<std::int64_t>(slots * static_cast<std::int64_t>(vb), max_buffer);
  if ((h.flags & 64) && dk_size >= static_cast<std::int64_t>(kb)) dk_size -= kb;
  block dk(dk_size), dv(dv_size);
  std::fill_n(dk.data(), dk.n, poison);
  std::fill_n(dv.data(), dv.n, poison);
  std::byte* dk_ptr = dk.data();
  std::size_t dk_n = dk.n;
  if ((h.flags & 128) && k_buf.n > 0) {  // over the source: must be refused
    dk_ptr = k_buf.data();
    dk_n = std::min(k_buf.n, dk.n);
  }

  kvscout::host_gather_config cfg{};
  cfg.shape.num_seqs = h.num_seqs;
  cfg.shape.num_kv_heads = h.num_kv_heads;
  cfg.capacity = h.capacity;
  cfg.threads = 1 + (h.flags & 1);
  cfg.prefetch_rows = h.prefetch_rows;
  const int stores = (h.flags >> 1) & 3;
  cfg.stores = static_cast<kvscout::gather_stores>(stores == 3 ? 7 : stores);

  using exec = kvscout::gather_executor_host<Layout>;
  std::size_t ws_bytes = 0;
  try {
    ws_bytes = exec::workspace_bytes(cfg);
  } catch (const kvscout::error&) {
    return;
  }
  if (ws_bytes > static_cast<std::size_t>(max_buffer)) return;
  std::vector<std::int64_t> ws(ws_bytes / sizeof(std::int64_t) + 1);
  const std::size_t ws_given = (h.flags & 32) && ws_bytes > 0 ? ws_bytes - 1 : ws_bytes;

  const kvscout::kv_view<Layout, host_space> src{l, {k, k_size}, {v, v_size}};
  kvscout::selection_view<host_space> sel{{idx.get(), static_cast<std::size_t>(n_idx)},
                                          {counts.data(), counts.n},
                                          h.num_seqs,
                                          h.num_kv_heads,
                                          h.capacity + ((h.flags & 16) ? 1 : 0)};
  if ((h.flags & 16) && h.capacity == INT32_MAX) sel.capacity = 0;
  const kvscout::gather_destination<host_space> dst{{dk_ptr, dk_n}, {dv.data(), dv.n}};

  bool accepted = false;
  try {
    exec g(cfg, {reinterpret_cast<std::byte*>(ws.data()), ws_given});
    g.submit(src, sel, dst).wait();
    accepted = true;
  } catch (const kvscout::error&) {
  }
  if (dk_ptr != dk.data()) {
    FUZZ_CHECK(!accepted || slots == 0, "a destination over the source was accepted");
    return;
  }
  if (!accepted) {
    FUZZ_CHECK(untouched(dk.data(), dk.n), "rejected, but the destination K was written");
    FUZZ_CHECK(untouched(dv.data(), dv.n), "rejected, but the destination V was written");
    return;
  }
  // Accepted: every selected row where selection.hpp says, everything else untouched.
  FUZZ_CHECK(slots <= n_idx && dk.n >= static_cast<std::size_t>(slots) * kb &&
             dv.n >= static_cast<std::size_t>(slots) * vb);
  for (std::int64_t r = 0; r < pairs; ++r) {
    const int s = static_cast<int>(r / h.num_kv_heads);
    const int head = static_cast<int>(r % h.num_kv_heads);
    const std::int32_t n = counts.p[r];
    FUZZ_CHECK(n >= 0 && n <= h.capacity);
    FUZZ_CHECK(n <= l.seq_len(s));
    for (std::int64_t i = 0; i < cap; ++i) {
      const std::size_t at = static_cast<std::size_t>(r * cap + i);
      if (i < n) {
        const int t = idx[at];
        FUZZ_CHECK(t >= 0 && t < l.seq_len(s));
        const std::size_t ko = l.k_offset(s, t, head), vo = l.v_offset(s, t, head);
        FUZZ_CHECK(ko + kb <= k_size && vo + vb <= v_size, "an accepted row lies outside K / V");
        FUZZ_CHECK(std::memcmp(dk.data() + at * kb, k + ko, kb) == 0, "wrong K row");
        FUZZ_CHECK(std::memcmp(dv.data() + at * vb, v + vo, vb) == 0, "wrong V row");
      } else {
        FUZZ_CHECK(untouched(dk.data() + at * kb, kb), "an unselected K slot was written");
        FUZZ_CHECK(untouched(dv.data() + at * vb, vb), "an unselected V slot was written");
      }
    }
  }
}

/// Paged: a page table from the input, K / V buffers of num_pages pages (+ deltas).
template <class Layout, bool Flashinfer>
void run_paged(const header& h, fuzz::reader& in) {
  using T = typename Layout::element_type;
  const std::int64_t seqs = std::max(h.num_seqs, 0);
  if (seqs > 64 || h.num_kv_heads > 16) return;

  std::unique_ptr<ints> a, b, c;
  typename Layout::page_table_type table{};
  if constexpr (Flashinfer) {
    a = std::make_unique<ints>(in, seqs + 1);      // indptr
    b = std::make_unique<ints>(in, seqs);          // last_page_len
    const std::int64_t n_indices = std::max(a->p[seqs], 0);
    if (n_indices > max_array) return;
    c = std::make_unique<ints>(in, n_indices);     // indices
    table = {a->data(), c->data(), b->data(), h.num_seqs};
  } else {
    const std::int64_t n_table = seqs * std::max(h.max_blocks, 0);
    if (n_table > max_array) return;
    a = std::make_unique<ints>(in, seqs);          // seq_lens
    b = std::make_unique<ints>(in, n_table);       // table
    table = {b->data(), a->data(), h.max_blocks, h.num_seqs};
  }

  Layout l;
  try {
    if constexpr (Layout::static_page_size == kvscout::dynamic_extent) {
      l = Layout(table, h.num_kv_heads, h.page_size, h.page_stride);
    } else {
      l = Layout(table, h.num_kv_heads, h.page_stride);
    }
  } catch (const kvscout::error&) {
    return;
  }
  const __int128 page_bytes = static_cast<__int128>(l.page_stride()) * sizeof(T);
  const __int128 pages = std::max(h.num_pages, 0);
  block k_buf(clamp_bytes(pages * page_bytes + h.k_delta));
  fill(k_buf, 1);
  if (h.flags & 8) {
    // Interleaved: V starts one dense page into the K buffer.
    const std::size_t half = static_cast<std::size_t>(l.page_size()) * l.num_kv_heads() *
                             Layout::head_dim * sizeof(T);
    const std::size_t off = std::min(half, k_buf.n);
    gather(h, in, l, k_buf.data(), k_buf.n, k_buf.data() + off, k_buf.n - off, k_buf);
    return;
  }
  block v_buf(clamp_bytes(pages * page_bytes + h.v_delta));
  fill(v_buf, 977);
  gather(h, in, l, k_buf.data(), k_buf.n, v_buf.data(), v_buf.n, k_buf);
}

/// Contiguous: lengths (padded) or indptr (ragged) from the input, buffers of the size the
/// layout needs (+ deltas).
template <class Layout, bool Ragged>
void run_contiguous(const header& h, fuzz::reader& in) {
  using T = typename Layout::element_type;
  const std::int64_t seqs = std::max(h.num_seqs, 0);
  if (seqs > 64 || h.num_kv_heads > 16) return;
  const ints arr(in, Ragged ? seqs + 1 : seqs);
  Layout l;
  try {
    l = Ragged ? Layout::ragged(h.num_kv_heads, h.page_size, arr.data(), h.num_seqs)
               : Layout::padded(h.num_kv_heads, h.page_size, arr.data(), h.num_seqs);
  } catch (const kvscout::error&) {
    return;
  }
  const __int128 need = static_cast<__int128>(Ragged ? 1 : seqs) * std::max(h.page_size, 0) *
                        std::max(h.num_kv_heads, 0) * Layout::head_dim * sizeof(T);
  block k_buf(clamp_bytes(need + h.k_delta));
  block v_buf(clamp_bytes(need + h.v_delta));
  fill(k_buf, 1);
  fill(v_buf, 977);
  gather(h, in, l, k_buf.data(), k_buf.n, v_buf.data(), v_buf.n, k_buf);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::reader in(data, size);
  header h{};
  h.kind = in.u8();
  h.flags = in.u8();
  h.num_seqs = in.i32();
  h.num_kv_heads = in.i32();
  h.capacity = in.i32();
  h.page_size = in.i32();
  h.page_stride = in.i32();
  h.max_blocks = in.i32();
  h.num_pages = in.i32();
  h.k_delta = in.i32();
  h.v_delta = in.i32();
  h.prefetch_rows = in.i32();
  using kvscout::half;
  using kvscout::hnd;
  using kvscout::nhd;
  using kvscout::block_table;
  using kvscout::flashinfer_page_table;
  switch (h.kind & 7) {
    case 0: run_paged<kvscout::paged_layout<float, 4, nhd, block_table>, false>(h, in); break;
    case 1: run_paged<kvscout::paged_layout<float, 4, hnd, block_table, 4>, false>(h, in); break;
    case 2: run_paged<kvscout::paged_layout<half, 8, hnd, flashinfer_page_table>, true>(h, in); break;
    case 3: run_paged<kvscout::paged_layout<half, 8, nhd, flashinfer_page_table, 2>, true>(h, in); break;
    case 4: run_contiguous<kvscout::contiguous_layout<float, 4, nhd>, false>(h, in); break;
    case 5: run_contiguous<kvscout::contiguous_layout<half, 8, hnd>, false>(h, in); break;
    case 6: run_contiguous<kvscout::contiguous_layout<float, 4, hnd>, true>(h, in); break;
    case 7: run_contiguous<kvscout::contiguous_layout<half, 8, nhd>, true>(h, in); break;
  }
  return 0;
}
