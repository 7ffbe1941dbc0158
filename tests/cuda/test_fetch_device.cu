// CUDA prefetch executors (fetch/zero_copy.cuh, fetch/copy_engine.cuh, fetch/staged.cuh) against
// gather_executor_host, bit-exact, on seeded random bytes: contiguous NHD / HND (padded, ragged),
// paged with both page tables, KIVI-2 / KIVI-4 records; 256- and 512-byte rows (and KIVI's
// 32-80-byte records); densities 5 / 10 / 25 %; empty selections; destinations poisoned first, so
// unselected slots must stay poisoned; and the device status word on bad device data (an index
// >= seq_len, a count > capacity, a page id outside the buffer), where the bad rows must be
// skipped and everything else still gathered.

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fetch_fixtures.cuh"
#include "kvscout/core/configured.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/copy_engine.cuh"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/fetch/staged.cuh"
#include "kvscout/fetch/zero_copy.cuh"

using namespace fetch_test;
using kvscout::bfloat16;
using kvscout::half;

// The executors hand back their configuration the way every configured component does.
using configured_layout = kvscout::contiguous_layout<half, 64, kvscout::hnd>;
static_assert(kvscout::configured<kvscout::copy_engine_executor_cuda<configured_layout>>);
static_assert(kvscout::configured<kvscout::staged_executor_cuda<configured_layout>>);
static_assert(kvscout::configured<kvscout::zero_copy_executor_cuda<configured_layout>>);

namespace {

constexpr std::byte poison{0xff};  // device_vector's poison

struct stream_holder {
  cudaStream_t s{};
  stream_holder() { KVSCOUT_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~stream_holder() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(s)); }
};

void expect_same(const std::string& what, const std::vector<std::byte>& got,
                 const std::vector<std::byte>& want) {
  const long long at = first_mismatch(got, want);
  if (at >= 0) {
    std::fprintf(stderr, "%s: first mismatch at byte %lld of %zu (got %d, want %d)\n",
                 what.c_str(), at, want.size(),
                 got.size() > static_cast<std::size_t>(at) ? static_cast<int>(got[at]) : -1,
                 static_cast<int>(want[at]));
  }
  GPU_CHECK(at < 0);
}

// Runs the three executors on one source / selection and compares with the host gather.
template <class Layout>
void check_executors(const std::string& name, const Layout& host_l, const Layout& dev_l,
                     const pinned_vector<std::byte>& k, const pinned_vector<std::byte>& v,
                     const host_selection& sel) {
  const int S = sel.num_seqs, H = sel.heads, cap = sel.capacity;
  const std::size_t slots = static_cast<std::size_t>(S) * H * cap;
  const std::size_t kb = host_l.k_row_bytes(), vb = host_l.v_row_bytes();
  stream_holder stream;

  // Reference: the host gather over the same (pinned) bytes.
  kvscout::host_gather_config hc{.shape = {.num_seqs = S, .num_kv_heads = H}, .capacity = cap};
  auto ws = kvscout::make_workspace<kvscout::gather_executor_host<Layout>>(hc);
  kvscout::gather_executor_host<Layout> gather(hc, ws.span());
  std::vector<std::byte> ref_k(slots * kb, poison), ref_v(slots * vb, poison);
  const kvscout::kv_view<Layout, kvscout::host_space> host_src{
      host_l, {k.data(), k.bytes()}, {v.data(), v.bytes()}};
  gather.submit(host_src, sel.view(), {{ref_k.data(), ref_k.size()}, {ref_v.data(), ref_v.size()}});

  device_selection dsel(sel);
  device_vector<std::byte> dk(slots * kb), dv(slots * vb);
  const kvscout::gather_destination<kvscout::device_space> dst{{dk.data(), slots * kb},
                                                              {dv.data(), slots * vb}};
  device_vector<int> status(1);
  clear_status(status);

  {  // zero copy: device aliases of the mapped source, device-resident metadata and selection
    kvscout::zero_copy_config zc{.shape = {.num_seqs = S, .num_kv_heads = H}, .capacity = cap};
    GPU_CHECK(kvscout::zero_copy_executor_cuda<Layout>::workspace_bytes(zc) == 0);
    kvscout::zero_copy_executor_cuda<Layout> ex(zc);
    const kvscout::kv_view<Layout, kvscout::device_space> src{
        dev_l, {k.device_data(), k.bytes()}, {v.device_data(), v.bytes()}};
    auto c = ex.submit(src, dsel.view(), dst, {stream.s, status.data()});
    GPU_CHECK(c.event() == ex.event());
    c.wait();
    GPU_CHECK(c.ready());
    expect_same(name + " zero_copy K", dk.download(), ref_k);
    expect_same(name + " zero_copy V", dv.download(), ref_v);
    GPU_CHECK(read_status(status) == 0);
  }
  for (bool batch : {true, false}) {  // copy engine
    dk.poison();
    dv.poison();
    kvscout::copy_engine_config cc{.shape = {.num_seqs = S, .num_kv_heads = H}, .capacity = cap,
                                   .use_batch_api = batch};
    auto cws = kvscout::make_workspace<kvscout::copy_engine_executor_cuda<Layout>>(cc);
    kvscout::copy_engine_executor_cuda<Layout> ex(cc, cws.span());
    ex.submit(host_src, sel.view(), dst, {stream.s}).wait();
    const std::string tag = name + (batch ? " copy_engine(batch)" : " copy_engine(per run)");
    expect_same(tag + " K", dk.download(), ref_k);
    expect_same(tag + " V", dv.download(), ref_v);
    GPU_CHECK(ex.last_copy_count() <= 2 * static_cast<std::size_t>(sel.total()));
  }
  {  // staged: two threads, two stages, three submits (the stages rotate and are reused), the
     // second on another stream (each bulk copy waits for the previous submit's scatter)
    stream_holder other;
    kvscout::staged_config sc{.shape = {.num_seqs = S, .num_kv_heads = H}, .capacity = cap,
                              .k_row_bytes = kb, .v_row_bytes = vb, .threads = 2, .stages = 2};
    pinned_vector<std::byte> pws(kvscout::staged_executor_cuda<Layout>::workspace_bytes(sc));
    device_vector<std::byte> dws(kvscout::staged_executor_cuda<Layout>::device_workspace_bytes(sc));
    kvscout::staged_executor_cuda<Layout> ex(sc, {pws.data(), pws.bytes()}, {dws.data(), dws.bytes()});
    for (int rep = 0; rep < 3; ++rep) {
      dk.poison();
      dv.poison();
      ex.submit(host_src, sel.view(), dst, {rep == 1 ? other.s : stream.s}).wait();
      expect_same(name + " staged K rep " + std::to_string(rep), dk.download(), ref_k);
      expect_same(name + " staged V rep " + std::to_string(rep), dv.download(), ref_v);
    }
  }
}

template <class Case>
void layout_case(double density, std::uint32_t seed, bool empty = false) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> lens = {300, 1, 0, 517};
  const int heads = 3;
  kvtest::layout_fixture<Case> f(lens, heads, rng);
  pinned_vector<std::byte> k(f.bytes), v(f.bytes);
  fill_random_bytes(k.data(), k.bytes(), seed * 3 + 1);
  fill_random_bytes(v.data(), v.bytes(), seed * 3 + 2);
  device_layout<Case> dl(f);
  const std::vector<int> ilens(lens.begin(), lens.end());
  host_selection sel(ilens, heads, /*cap=*/160, empty ? 0.0 : density, rng);
  check_executors(Case::name() + " density " + std::to_string(density), f.layout, dl.layout, k, v,
                  sel);
}

template <class L>
void kivi_case(double density, std::uint32_t seed) {
  const std::vector<int32_t> lens = {700, 90, 391};
  fetch_test::kivi_cache<L> cache(lens, 2, 768, {.group = 32, .residual = 64}, seed);
  const auto b = cache.store.buffers();
  pinned_vector<std::byte> k(b.k_codes.size()), v(b.v_records.size());
  std::memcpy(k.data(), b.k_codes.data(), k.bytes());
  std::memcpy(v.data(), b.v_records.data(), v.bytes());
  device_vector<int32_t> dlens(cache.lens);
  const L dev_l = L::padded(2, 768, dlens.data(), 3, {.group = 32, .residual = 64});
  std::vector<int> qlens;
  for (int s = 0; s < 3; ++s) qlens.push_back(cache.layout.seq_len(s));
  std::mt19937 rng(seed);
  host_selection sel(qlens, 2, 128, density, rng);
  check_executors("kivi" + std::to_string(L::key_bits) + "v" + std::to_string(L::value_bits) + "/d" + std::to_string(L::head_dim) +
                      " density " + std::to_string(density),
                  cache.layout, dev_l, k, v, sel);
}

template <class Case>
void all_densities() {
  std::uint32_t seed = 11;
  for (double d : {0.05, 0.10, 0.25}) layout_case<Case>(d, seed++);
}

// Bad device data: an index == seq_len, a count > capacity, a page id far outside the buffer.
void bad_device_data() {
  using Case = kvtest::layout_case<kvtest::kind::vllm, kvscout::hnd, half, 128>;
  using Layout = Case::layout;
  std::mt19937 rng(5);
  const std::vector<int32_t> lens = {40, 30};
  const int heads = 2, cap = 8;
  kvtest::layout_fixture<Case> f(lens, heads, rng);
  pinned_vector<std::byte> k(f.bytes), v(f.bytes);
  fill_random_bytes(k.data(), k.bytes(), 1);
  fill_random_bytes(v.data(), v.bytes(), 2);
  device_layout<Case> dl(f);
  // (0,0): entry 1 is seq_len (bad). (0,1): count 12 > capacity (clamped to 8 valid rows).
  // (1,0): tokens 0..3, whose page is corrupted below. (1,1): fine.
  std::vector<int32_t> idx(2 * heads * cap, 0), counts = {3, 12, 4, 2};
  const int i00[] = {2, 40, 39};
  for (int i = 0; i < 3; ++i) idx[i] = i00[i];
  for (int i = 0; i < cap; ++i) idx[cap + i] = 3 * i;
  for (int i = 0; i < 4; ++i) idx[2 * cap + i] = i;
  idx[3 * cap] = 10, idx[3 * cap + 1] = 29;
  device_vector<int32_t> d_idx(idx), d_counts(counts);
  // Corrupt logical page 0 of sequence 1 (tokens 0..6) in the device block table.
  std::vector<int32_t> table = f.a;
  const std::size_t max_blocks = f.a.size() / 2;
  table[max_blocks] = 1 << 24;
  dl.a.upload(table);
  const std::size_t slots = 2 * heads * cap, row = 256;
  device_vector<std::byte> dk(slots * row), dv(slots * row);
  device_vector<int> status(1);
  clear_status(status);
  kvscout::zero_copy_config zc{.shape = {.num_seqs = 2, .num_kv_heads = heads}, .capacity = cap};
  kvscout::zero_copy_executor_cuda<Layout> ex(zc);
  ex.submit({dl.layout, {k.device_data(), k.bytes()}, {v.device_data(), v.bytes()}},
            {{d_idx.data(), idx.size()}, {d_counts.data(), counts.size()}, 2, heads, cap},
            {{dk.data(), dk.bytes()}, {dv.data(), dv.bytes()}}, {nullptr, status.data()})
      .wait();
  const int st = read_status(status);
  GPU_CHECK(st == (kvscout::device_status::bad_index | kvscout::device_status::bad_count |
                   kvscout::device_status::out_of_bounds));
  if (st != 0) std::printf("  status: %s\n", kvscout::device_status::describe(st).c_str());
  // Expected: every valid row in place, skipped rows poisoned.
  std::vector<std::byte> want(slots * row, poison);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < heads; ++h) {
      const int r = s * heads + h;
      const int n = std::min(counts[r], cap);
      for (int i = 0; i < n; ++i) {
        const int t = idx[r * cap + i];
        if (t >= lens[s]) continue;
        if (s == 1 && t < 7) continue;  // corrupted page
        std::memcpy(&want[(static_cast<std::size_t>(r) * cap + i) * row],
                    k.data() + f.layout.k_offset(s, t, h), row);
      }
    }
  expect_same("bad data K", dk.download(), want);
}

// What both row-cache tests share: a padded HND half cache of head_dim 128 (256-byte rows) in
// pinned host memory, two random selections A and B, device buffers for the rows of each, and a
// zero-copy executor. fetch_a_then_rewrite() fetches A, keeps the host bytes it read (old_k /
// old_v) and rewrites the source with new bytes, so that a row served from the cache (old bytes)
// and one that crossed the link (new bytes) can be told apart.
struct row_cache_case {
  using Case = kvtest::layout_case<kvtest::kind::padded, kvscout::hnd, half, 128>;
  using Layout = Case::layout;
  static constexpr std::size_t row = 256;
  std::uint32_t seed;
  std::mt19937 rng;
  std::vector<int32_t> lens;
  int S, heads, cap;
  std::size_t slots;
  kvtest::layout_fixture<Case> f;
  pinned_vector<std::byte> k, v;
  device_layout<Case> dl;
  host_selection a, b;
  device_selection da, db;
  device_vector<std::byte> ak, av, bk, bv;
  device_vector<int> status;
  device_vector<unsigned long long> hits;
  kvscout::zero_copy_executor_cuda<Layout> ex;
  kvscout::kv_view<Layout, kvscout::device_space> src;
  std::vector<std::byte> old_k, old_v;

  row_cache_case(std::uint32_t seed_, std::vector<int32_t> seq_lens, int kv_heads, int capacity,
                 double density)
      : seed(seed_), rng(seed_), lens(std::move(seq_lens)), S(static_cast<int>(lens.size())),
        heads(kv_heads),
        cap(capacity), slots(static_cast<std::size_t>(S) * heads * cap), f(lens, heads, rng),
        k(f.bytes), v(f.bytes), dl(f),
        a(std::vector<int>(lens.begin(), lens.end()), heads, cap, density, rng),
        b(std::vector<int>(lens.begin(), lens.end()), heads, cap, density, rng), da(a), db(b),
        ak(slots * row), av(slots * row), bk(slots * row), bv(slots * row), status(1), hits(1),
        ex({.shape = {.num_seqs = S, .num_kv_heads = heads}, .capacity = cap}),
        src{dl.layout, {k.device_data(), k.bytes()}, {v.device_data(), v.bytes()}} {
    fill_random_bytes(k.data(), k.bytes(), seed + 1);
    fill_random_bytes(v.data(), v.bytes(), seed + 2);
    clear_status(status);
    KVSCOUT_CUDA_CHECK(cudaMemset(hits.data(), 0, sizeof(unsigned long long)));
  }
  // The execution argument of every submit: the default stream, this case's status word.
  kvscout::cuda_exec x() { return {nullptr, status.data()}; }
  kvscout::gather_destination<kvscout::device_space> a_rows() {
    return {{ak.data(), ak.bytes()}, {av.data(), av.bytes()}};
  }
  kvscout::gather_destination<kvscout::device_space> b_rows() {
    return {{bk.data(), bk.bytes()}, {bv.data(), bv.bytes()}};
  }
  void fetch_a_then_rewrite() {
    ex.submit(src, da.view(), a_rows(), x()).wait();
    old_k.assign(k.data(), k.data() + k.bytes());
    old_v.assign(v.data(), v.data() + v.bytes());
    fill_random_bytes(k.data(), k.bytes(), seed + 3);  // the source changes: hits must not read it
    fill_random_bytes(v.data(), v.bytes(), seed + 4);
  }
};

// The row cache: a first submit fetches selection A; the host rows of every token are then
// rewritten; a second submit of selection B with the cache {A, its rows} must return, for the
// tokens of B that A holds, the bytes A fetched (from the device, old), and for the others the
// rewritten source (across the link, new). The hit counter equals |A n B| per (seq, head), summed.
void row_cache_serves_hits_from_device() {
  row_cache_case rc(31, {400, 3, 250}, 2, 64, 0.12);
  const int S = rc.S, heads = rc.heads, cap = rc.cap;
  const std::size_t slots = rc.slots, row = rc.row;
  const auto& a = rc.a;
  const auto& b = rc.b;
  rc.fetch_a_then_rewrite();
  const kvscout::row_cache_view cache{rc.da.view(), rc.a_rows(), rc.hits.data()};
  rc.ex.submit(rc.src, rc.db.view(), rc.b_rows(), cache, rc.x()).wait();
  GPU_CHECK(read_status(rc.status) == 0);
  std::vector<std::byte> want(slots * row, poison), want_v(slots * row, poison);
  unsigned long long common = 0;
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < heads; ++h) {
      const std::size_t r = static_cast<std::size_t>(s) * heads + h;
      const int32_t* ar = &a.indices[r * cap];
      for (int i = 0; i < b.counts[r]; ++i) {
        const int t = b.indices[r * cap + i];
        const bool in_a = std::binary_search(ar, ar + a.counts[r], t);
        common += in_a;
        const std::byte* from = (in_a ? rc.old_k.data() : rc.k.data()) + rc.f.layout.k_offset(s, t, h);
        std::memcpy(&want[(r * cap + i) * row], from, row);
        const std::byte* from_v =
            (in_a ? rc.old_v.data() : rc.v.data()) + rc.f.layout.v_offset(s, t, h);
        std::memcpy(&want_v[(r * cap + i) * row], from_v, row);
      }
    }
  std::printf("  row cache: %llu of %lld rows were cached\n", common, static_cast<long long>(b.total()));
  GPU_CHECK(common > 0 && common < static_cast<unsigned long long>(b.total()));  // both paths run
  GPU_CHECK(rc.hits.download()[0] == common);
  expect_same("row cache K", rc.bk.download(), want);
  expect_same("row cache V", rc.bv.download(), want_v);
  // An overlapping cache is refused on the host.
  bool thrown = false;
  try {
    rc.ex.submit(rc.src, rc.db.view(), rc.a_rows(), cache, rc.x());
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("overlap") != std::string::npos;
  }
  GPU_CHECK(thrown);
}

// The row cache across a reordered batch (continuous batching): the cache {A, its rows} was
// fetched with rows 0, 1, 2 holding sequences 0, 1, 2; the next submit's rows hold sequences 2, a
// new one, 0, and row_map = {2, -1, 0} says so. Row 0 must hit A's row 2 (the bytes fetched for
// its sequence), row 1 nothing, row 2 A's row 0; without the map, row 0 would hit A's row 0: the
// bytes of another sequence (the test checks that this gives other bytes, so it can tell). Then
// an entry outside [-1, num_seqs) is served from the source and raises bad_seq_id.
void row_cache_follows_its_row_map() {
  row_cache_case rc(37, {300, 300, 300}, 2, 128, 0.3);  // equal lengths: a token of one row is one of any
  const int S = rc.S, heads = rc.heads, cap = rc.cap;
  const std::size_t slots = rc.slots, row = rc.row;
  const auto& a = rc.a;
  const auto& b = rc.b;
  const auto& f = rc.f;
  const auto& old_k = rc.old_k;
  const auto& old_v = rc.old_v;
  auto& k = rc.k;
  auto& v = rc.v;
  auto& bk = rc.bk;
  auto& bv = rc.bv;
  auto& hits = rc.hits;
  auto& status = rc.status;
  auto& ex = rc.ex;
  rc.fetch_a_then_rewrite();  // the batch changed: the source rows are new bytes
  // What the second submit must return for a map (hits from old bytes of the mapped row).
  auto expected = [&](const std::vector<int32_t>& map, unsigned long long& common) {
    std::vector<std::byte> want(2 * slots * row, poison);
    common = 0;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < heads; ++h) {
        const std::size_t r = static_cast<std::size_t>(s) * heads + h;
        const int cs = map[static_cast<std::size_t>(s)] >= -1 && map[static_cast<std::size_t>(s)] < S
                           ? map[static_cast<std::size_t>(s)]
                           : -1;
        for (int i = 0; i < b.counts[r]; ++i) {
          const int t = b.indices[r * cap + i];
          bool in_a = false;
          if (cs >= 0) {
            const int32_t* ar = &a.indices[(static_cast<std::size_t>(cs) * heads + h) * cap];
            in_a = std::binary_search(ar, ar + a.counts[static_cast<std::size_t>(cs) * heads + h], t);
          }
          common += in_a;
          const std::size_t ko = in_a ? f.layout.k_offset(cs, t, h) : f.layout.k_offset(s, t, h);
          const std::size_t vo = in_a ? f.layout.v_offset(cs, t, h) : f.layout.v_offset(s, t, h);
          std::memcpy(&want[(r * cap + i) * row], (in_a ? old_k.data() : k.data()) + ko, row);
          std::memcpy(&want[slots * row + (r * cap + i) * row], (in_a ? old_v.data() : v.data()) + vo,
                      row);
        }
      }
    return want;
  };
  auto run = [&](const std::vector<int32_t>& map, bool with_map) {
    device_vector<int32_t> dmap(map);
    KVSCOUT_CUDA_CHECK(cudaMemset(hits.data(), 0, sizeof(unsigned long long)));
    KVSCOUT_CUDA_CHECK(cudaMemset(bk.data(), static_cast<int>(poison), bk.bytes()));
    KVSCOUT_CUDA_CHECK(cudaMemset(bv.data(), static_cast<int>(poison), bv.bytes()));
    kvscout::row_cache_view cache{rc.da.view(), rc.a_rows(), hits.data()};
    if (with_map) cache.row_map = {dmap.data(), dmap.size()};
    ex.submit(rc.src, rc.db.view(), rc.b_rows(), cache, rc.x()).wait();
    std::vector<std::byte> got = bk.download(), gv = bv.download();
    got.insert(got.end(), gv.begin(), gv.end());
    return std::make_pair(got, hits.download()[0]);
  };
  const std::vector<int32_t> map = {2, -1, 0};
  unsigned long long common = 0, common_identity = 0;
  const std::vector<std::byte> want = expected(map, common);
  const std::vector<std::byte> want_identity = expected({0, 1, 2}, common_identity);
  GPU_CHECK(common > 0);
  GPU_CHECK(want != want_identity);  // the map changes the answer: the test can tell
  const auto [got, got_hits] = run(map, true);
  GPU_CHECK(read_status(status) == 0);
  std::printf("  row map {2, -1, 0}: %llu of %lld rows from the cache\n", got_hits,
              static_cast<long long>(b.total()));
  GPU_CHECK(got_hits == common);
  expect_same("row map K+V", got, want);
  // Without the map the executor takes row s for cached row s (documented): the other answer.
  const auto [got_id, hits_id] = run(map, false);
  GPU_CHECK(hits_id == common_identity);
  expect_same("no row map K+V", got_id, want_identity);
  // Entry 5 is outside [-1, 3): row 0 crosses the link; rows 1 and 2 follow their entries.
  const std::vector<int32_t> bad = {5, 0, -1};
  unsigned long long common_bad = 0;
  const std::vector<std::byte> want_bad = expected(bad, common_bad);
  const auto [got_bad, hits_bad] = run(bad, true);
  GPU_CHECK(read_status(status) == kvscout::device_status::bad_seq_id);
  GPU_CHECK(hits_bad == common_bad);
  expect_same("bad row map K+V", got_bad, want_bad);
  // A map shorter than num_seqs is refused on the host.
  device_vector<int32_t> short_map(std::vector<int32_t>{0, 1});
  bool thrown = false;
  try {
    ex.submit(rc.src, rc.db.view(), rc.b_rows(),
              {rc.da.view(), rc.a_rows(), nullptr, {short_map.data(), short_map.size()}}, rc.x());
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("row_map holds 2 entries, expected num_seqs = 3") !=
             std::string::npos;
  }
  GPU_CHECK(thrown);
}

}  // namespace

int main() {
  using kvtest::kind;
  using kvscout::hnd;
  using kvscout::nhd;
  return gpu_test::run_all(
      "fetch_device",
      {
          {"padded_nhd_f16_d128_256B", [] { all_densities<kvtest::layout_case<kind::padded, nhd, half, 128>>(); }},
          {"padded_hnd_f32_d128_512B", [] { all_densities<kvtest::layout_case<kind::padded, hnd, float, 128>>(); }},
          {"ragged_hnd_f16_d256_512B", [] { all_densities<kvtest::layout_case<kind::ragged, hnd, half, 256>>(); }},
          {"ragged_nhd_bf16_d128_256B", [] { all_densities<kvtest::layout_case<kind::ragged, nhd, bfloat16, 128>>(); }},
          {"paged_flashinfer_nhd_f16_d128", [] { all_densities<kvtest::layout_case<kind::flashinfer, nhd, half, 128>>(); }},
          {"paged_flashinfer_hnd_bf16_d256", [] { all_densities<kvtest::layout_case<kind::flashinfer, hnd, bfloat16, 256>>(); }},
          {"paged_vllm_hnd_f16_d128", [] { all_densities<kvtest::layout_case<kind::vllm, hnd, half, 128>>(); }},
          {"paged_vllm_nhd_f32_d128", [] { all_densities<kvtest::layout_case<kind::vllm, nhd, float, 128>>(); }},
          {"kivi2_f16_d128", [] { for (double d : {0.05, 0.10, 0.25}) kivi_case<kvscout::kivi_layout<half, 128, 2>>(d, 3); }},
          {"kivi4_f16_d128_f32_scales", [] { for (double d : {0.05, 0.10, 0.25}) kivi_case<kvscout::kivi_layout<half, 128, 4, float>>(d, 4); }},
          {"kivi4_bf16_d64", [] { for (double d : {0.05, 0.25}) kivi_case<kvscout::kivi_layout<bfloat16, 64, 4>>(d, 5); }},
          {"kivi_k4v2_f16_d64", [] { kivi_case<kvscout::kivi_layout<half, 64, kvscout::kivi_bits{4, 2}>>(0.1, 6); }},
          {"empty_selection", [] { layout_case<kvtest::layout_case<kind::padded, hnd, half, 128>>(0.1, 9, /*empty=*/true); }},
          {"bad_device_data_sets_status", bad_device_data},
          {"row_cache_serves_hits_from_device", row_cache_serves_hits_from_device},
          {"row_cache_follows_its_row_map", row_cache_follows_its_row_map},
      });
}
