// The C++ side of tests/python/test_against_cpp.py: runs kvscout's host parts directly (no
// binding) on seeded inputs and writes each case's inputs and outputs as .npy files under
// OUT/<case>/, so that the Python package can be run on the same inputs and compared bit for bit.
//
//   kvscout_py_reference OUT
//
// Cases: topk (count and share budgets), threshold (both rules), correction, gather (contiguous HND float16 / NHD float32,
// paged NHD block table float16 / HND indptr float32), attention, the InfiniGen policy (2-bit
// rope_planes with a correction; float post_rope_skew), a KIVI-4 cache (append, gather,
// attention), the baselines (streaming, oracle, Quest, H2O), presets::budgets.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvscout/kvscout.hpp"

namespace {

namespace fs = std::filesystem;
using kvscout::half;

fs::path out_dir;

template <class T>
const char* npy_descr() {
  if constexpr (std::is_same_v<T, float>) return "<f4";
  if constexpr (std::is_same_v<T, double>) return "<f8";
  if constexpr (std::is_same_v<T, half>) return "<f2";
  if constexpr (std::is_same_v<T, std::int32_t>) return "<i4";
  if constexpr (std::is_same_v<T, std::int64_t>) return "<i8";
}

// NumPy's .npy format, version 1.0, C order.
template <class T>
void save(const std::string& c, const std::string& name, const std::vector<T>& v,
          const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  if (n != v.size()) {
    std::fprintf(stderr, "kvscout_py_reference: %s/%s holds %zu values, shape says %zu\n",
                 c.c_str(), name.c_str(), v.size(), n);
    std::exit(1);
  }
  std::string dims;
  for (std::size_t e : shape) dims += std::to_string(e) + ", ";
  std::string header = std::string("{'descr': '") + npy_descr<T>() +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  fs::create_directories(out_dir / c);
  std::ofstream f(out_dir / c / (name + ".npy"), std::ios::binary);
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}

std::mt19937 rng(20261208);

template <class T>
std::vector<T> normal(std::size_t n, float scale = 1.f, float step = 0.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<T> v(n);
  for (auto& x : v) {
    float f = d(rng);
    if (step > 0) f = std::round(f / step) * step;  // coarse values: many ties
    x = static_cast<T>(f);
  }
  return v;
}

template <class T>
kvscout::host_span<T> sp(std::vector<T>& v) { return {v.data(), v.size()}; }
template <class T>
kvscout::host_span<const T> csp(const std::vector<T>& v) { return {v.data(), v.size()}; }

constexpr int S = 2, H = 3, G = 2, HQ = H * G, T = 300, CAP = 48;
const std::vector<std::int32_t> lens{300, 211};

struct selection {
  std::vector<std::int32_t> indices, counts;
  int capacity;
  kvscout::selection_view<kvscout::host_space> view() const {
    return {csp(indices), csp(counts), S, H, capacity};
  }
};

selection topk(const std::string& c, const std::vector<float>& scores, int budget, double share) {
  const kvscout::topk_selector_host::config cfg{
      .shape = {.num_seqs = S, .num_kv_heads = H, .max_tokens = T},
      .capacity = CAP, .budget = budget, .keep = {.sinks = 4, .recent = 16},
      .budget_share = share};
  kvscout::host_workspace ws(kvscout::topk_selector_host::workspace_bytes(cfg), 64);
  kvscout::topk_selector_host sel(cfg, ws.span());
  selection out{std::vector<std::int32_t>(S * H * CAP, -1), std::vector<std::int32_t>(S * H), CAP};
  sel.select({csp(scores), csp(lens), S, H, T}, {sp(out.indices), sp(out.counts), S, H, CAP});
  save(c, "scores", scores, {S, H, T});
  save(c, "seq_lens", lens, {S});
  save(c, "indices", out.indices, {S, H, CAP});
  save(c, "counts", out.counts, {S, H});
  return out;
}

// Both rules of threshold_selector_host on the same scores.
void threshold(const std::vector<float>& scores) {
  for (const auto rule : {kvscout::threshold_rule::per_head, kvscout::threshold_rule::infinigen_mean}) {
    kvscout::threshold_selector_host::config cfg;
    cfg.shape = {.num_seqs = S, .num_kv_heads = H, .max_tokens = T};
    cfg.capacity = CAP;
    cfg.alpha = 0.75f;
    cfg.budget = CAP;
    cfg.rule = rule;
    cfg.keep = {.sinks = 4, .recent = 16};
    kvscout::host_workspace ws(kvscout::threshold_selector_host::workspace_bytes(cfg), 64);
    kvscout::threshold_selector_host sel(cfg, ws.span());
    std::vector<std::int32_t> idx(S * H * CAP, -1), cnt(S * H);
    sel.select({csp(scores), csp(lens), S, H, T}, {sp(idx), sp(cnt), S, H, CAP});
    const std::string c = rule == kvscout::threshold_rule::per_head ? "threshold_per_head"
                                                                   : "threshold_infinigen_mean";
    save(c, "indices", idx, {S, H, CAP});
    save(c, "counts", cnt, {S, H});
  }
}

void correction(const std::vector<float>& late, const selection& spec) {
  const int extra = 24;
  kvscout::correction_selector_host::config cfg;
  cfg.shape = {.num_seqs = S, .num_kv_heads = H, .max_tokens = T};
  cfg.capacity = extra;
  cfg.extra = extra;
  cfg.total_share = 0.2;
  kvscout::host_workspace ws(kvscout::correction_selector_host::workspace_bytes(cfg), 64);
  kvscout::correction_selector_host sel(cfg, ws.span());
  std::vector<std::int32_t> idx(S * H * extra, -1), cnt(S * H);
  sel.select({csp(late), csp(lens), S, H, T}, spec.view(), {sp(idx), sp(cnt), S, H, extra});
  save("correction", "scores", late, {S, H, T});
  save("correction", "indices", idx, {S, H, extra});
  save("correction", "counts", cnt, {S, H});
}

// Rows of `spec` out of kv into k_rows / v_rows [S, H, CAP, D].
template <class Layout>
void gather_into(const kvscout::kv_view<Layout, kvscout::host_space>& kv, const selection& spec,
                 std::vector<typename Layout::element_type>& kr,
                 std::vector<typename Layout::element_type>& vr) {
  const kvscout::host_gather_config cfg{.shape = {.num_seqs = S, .num_kv_heads = H},
                                        .capacity = CAP, .threads = 1};
  using executor = kvscout::gather_executor_host<Layout>;
  kvscout::host_workspace ws(executor::workspace_bytes(cfg), executor::workspace_alignment);
  executor g(cfg, ws.span());
  g.submit(kv, spec.view(), {kvscout::as_writable_bytes(sp(kr)), kvscout::as_writable_bytes(sp(vr))})
      .wait();
}

template <class E, int D, class O>
void gather_contiguous(const std::string& c, const selection& spec) {
  using layout = kvscout::contiguous_layout<E, D, O>;
  auto k = normal<E>(static_cast<std::size_t>(S) * H * T * D);
  auto v = normal<E>(k.size());
  const layout lay = layout::padded(H, T, lens.data(), S);
  std::vector<E> kr(static_cast<std::size_t>(S) * H * CAP * D), vr(kr.size());
  gather_into<layout>({lay, kvscout::as_bytes(csp(k)), kvscout::as_bytes(csp(v))}, spec, kr, vr);
  const bool hnd = std::is_same_v<O, kvscout::hnd>;
  const std::vector<std::size_t> shape = hnd ? std::vector<std::size_t>{S, H, T, D}
                                             : std::vector<std::size_t>{S, T, H, D};
  save(c, "k", k, shape);
  save(c, "v", v, shape);
  save(c, "k_rows", kr, {S, H, CAP, D});
  save(c, "v_rows", vr, {S, H, CAP, D});
}

// Pages of 16 tokens, in a shuffled order, vLLM's block table or FlashInfer's indptr form.
template <class E, int D, class O, class Table>
void gather_paged(const std::string& c, const selection& spec) {
  constexpr int page = 16;
  std::vector<int> blocks;
  int total = 0;
  for (int n : lens) blocks.push_back((n + page - 1) / page), total += blocks.back();
  const int P = total + 2;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(P));
  for (int i = 0; i < P; ++i) ids[static_cast<std::size_t>(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<std::size_t>(total));
  auto k = normal<E>(static_cast<std::size_t>(P) * page * H * D);
  auto v = normal<E>(k.size());
  std::vector<E> kr(static_cast<std::size_t>(S) * H * CAP * D), vr(kr.size());
  const bool hnd = std::is_same_v<O, kvscout::hnd>;
  const std::vector<std::size_t> shape = hnd ? std::vector<std::size_t>{std::size_t(P), H, page, D}
                                             : std::vector<std::size_t>{std::size_t(P), page, H, D};
  using layout = kvscout::paged_layout<E, D, O, Table>;
  if constexpr (std::is_same_v<Table, kvscout::block_table>) {
    const int max_blocks = std::max(blocks[0], blocks[1]);
    std::vector<std::int32_t> table(static_cast<std::size_t>(S) * max_blocks, -1);
    for (int s = 0, at = 0; s < S; at += blocks[static_cast<std::size_t>(s)], ++s)
      for (int b = 0; b < blocks[static_cast<std::size_t>(s)]; ++b)
        table[static_cast<std::size_t>(s) * max_blocks + b] = ids[static_cast<std::size_t>(at + b)];
    const kvscout::block_table pt{table.data(), lens.data(), max_blocks, S};
    gather_into<layout>({layout(pt, H, page), kvscout::as_bytes(csp(k)), kvscout::as_bytes(csp(v))},
                        spec, kr, vr);
    save(c, "block_table", table, {S, std::size_t(max_blocks)});
  } else {
    std::vector<std::int32_t> indptr{0, blocks[0], blocks[0] + blocks[1]};
    std::vector<std::int32_t> last{lens[0] - (blocks[0] - 1) * page, lens[1] - (blocks[1] - 1) * page};
    kvscout::flashinfer_page_table pt;
    pt.indptr = indptr.data();
    pt.indices = ids.data();
    pt.last_page_len = last.data();
    pt.seqs = S;
    gather_into<layout>({layout(pt, H, page), kvscout::as_bytes(csp(k)), kvscout::as_bytes(csp(v))},
                        spec, kr, vr);
    save(c, "indptr", indptr, {S + 1});
    save(c, "page_ids", ids, {ids.size()});
    save(c, "last_page_len", last, {S});
  }
  save(c, "k", k, shape);
  save(c, "v", v, shape);
  save(c, "k_rows", kr, {S, H, CAP, D});
  save(c, "v_rows", vr, {S, H, CAP, D});
}

void attention(const selection& spec) {
  constexpr int D = 64;
  auto kr = normal<half>(static_cast<std::size_t>(S) * H * CAP * D);
  auto vr = normal<half>(kr.size());
  auto q = normal<float>(static_cast<std::size_t>(S) * HQ * D);
  auto kc = normal<half>(static_cast<std::size_t>(S) * H * D);
  auto vc = normal<half>(kc.size());
  std::vector<float> out(q.size());
  const kvscout::gathered_rows_host<half, D> rows(spec.view(), csp(kr), csp(vr));
  kvscout::decode_attention_host(rows, kvscout::current_token<half>{csp(kc), csp(vc)}, csp(q),
                                 sp(out), {.num_q_heads = HQ, .scale = 0.125f});
  save("attention", "k_rows", kr, {S, H, CAP, D});
  save("attention", "v_rows", vr, {S, H, CAP, D});
  save("attention", "q", q, {S, HQ, D});
  save("attention", "k_cur", kc, {S, H, D});
  save("attention", "v_cur", vc, {S, H, D});
  save("attention", "out", out, {S, HQ, D});
}

// One layer's policy: its inputs (plans, W_Q, keys, x, q) and outputs (scores, late scores).
template <class PkT>
void policy(const std::string& c, kvscout::rope_mode mode) {
  constexpr int D = 64, DM = 48, r = 16;
  const bool planes_mode = mode == kvscout::rope_mode::rope_planes;
  kvscout::infinigen_config cfg;
  cfg.shape = {.num_seqs = S, .num_kv_heads = H, .num_q_heads = HQ, .head_dim = D, .d_model = DM,
               .max_tokens = T, .scale = 0.125f};
  cfg.mode = mode;
  cfg.r = r;
  cfg.aggregation = kvscout::gqa_aggregation::max_logit;
  if (planes_mode) {
    cfg.query_aggregation = kvscout::gqa_aggregation::sum_prob;
    cfg.correction_r = D;
  }
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<kvscout::skew_plan> plans, corr;
  std::vector<std::int32_t> planes, all_planes, channels;
  std::vector<float> A;
  for (int h = 0; h < H; ++h) {
    if (planes_mode) {
      std::vector<int> pl(D / 2);
      for (int i = 0; i < D / 2; ++i) pl[static_cast<std::size_t>(i)] = i;
      corr.push_back(kvscout::rope_planes_plan(rope, pl));
      all_planes.insert(all_planes.end(), pl.begin(), pl.end());
      std::shuffle(pl.begin(), pl.end(), rng);
      pl.resize(r / 2);
      std::sort(pl.begin(), pl.end());
      plans.push_back(kvscout::rope_planes_plan(rope, pl));
      planes.insert(planes.end(), pl.begin(), pl.end());
    } else {  // a permutation: orthogonal
      std::vector<int> perm(D), ch(D);
      for (int i = 0; i < D; ++i) perm[static_cast<std::size_t>(i)] = ch[static_cast<std::size_t>(i)] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::shuffle(ch.begin(), ch.end(), rng);
      ch.resize(r);
      std::sort(ch.begin(), ch.end());
      kvscout::skew_plan p;
      p.mode = mode;
      p.head_dim = D;
      p.r = r;
      p.rope = rope;
      p.A.assign(static_cast<std::size_t>(D) * D, 0.f);
      for (int i = 0; i < D; ++i) p.A[static_cast<std::size_t>(i) * D + perm[static_cast<std::size_t>(i)]] = 1.f;
      p.channels = ch;
      A.insert(A.end(), p.A.begin(), p.A.end());
      channels.insert(channels.end(), ch.begin(), ch.end());
      plans.push_back(std::move(p));
    }
  }
  const auto w_q = normal<float>(static_cast<std::size_t>(HQ) * D * DM, 0.2f);
  kvscout::host_workspace ws(kvscout::infinigen_policy_host<PkT>::workspace_bytes(cfg), 64);
  std::optional<kvscout::infinigen_policy_host<PkT>> held;
  if (planes_mode)
    held.emplace(cfg, plans, corr, csp(w_q), kvscout::host_span<const float>{}, ws.span());
  else
    held.emplace(cfg, plans, csp(w_q), kvscout::host_span<const float>{}, ws.span());
  auto& pol = *held;
  const int n = lens[0] + lens[1];
  const auto keys = normal<float>(static_cast<std::size_t>(n) * H * D);
  std::vector<std::int32_t> seq_ids, token_ids;
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t) seq_ids.push_back(s), token_ids.push_back(t);
  pol.append(csp(keys), csp(seq_ids), csp(token_ids), n);
  const auto x = normal<float>(static_cast<std::size_t>(S) * DM);
  const std::vector<std::int32_t> positions{lens[0], lens[1]};
  std::vector<float> scores(static_cast<std::size_t>(S) * H * T, 0.f);
  kvscout::score_context<kvscout::host_space> ctx{};
  ctx.x = csp(x);
  ctx.positions = csp(positions);
  ctx.seq_lens = csp(lens);
  pol.score(ctx, {sp(scores), S, H, T});
  save(c, "scores", scores, {S, H, T});
  if (planes_mode) {
    const auto q = normal<float>(static_cast<std::size_t>(S) * HQ * D);
    std::vector<float> late(scores.size(), 0.f);
    pol.score_query(csp(q), ctx, {sp(late), S, H, T});
    save(c, "q", q, {S, HQ, D});
    save(c, "late", late, {S, H, T});
    save(c, "planes", planes, {H, r / 2});
    save(c, "correction_planes", all_planes, {H, D / 2});
  } else {
    save(c, "A", A, {H, D, D});
    save(c, "channels", channels, {H, r});
  }
  save(c, "w_q", w_q, {HQ * D, DM});
  save(c, "keys", keys, {std::size_t(n), H, D});
  save(c, "seq_ids", seq_ids, {std::size_t(n)});
  save(c, "token_ids", token_ids, {std::size_t(n)});
  save(c, "x", x, {S, DM});
  save(c, "positions", positions, {S});
  save(c, "seq_lens", lens, {S});
}

// KIVI-4 over float16 rows, head_dim 64, G 32, R 64: two sequences appended in chunks; the five
// buffers, the records of a selection of quantised tokens, and attention over them.
void kivi() {
  constexpr int D = 64, cap = 320;
  using layout = kvscout::kivi_layout<half, D, 4>;
  std::vector<std::int32_t> seq_lens(S, 0);
  const layout l = layout::padded(H, cap, seq_lens.data(), S, {.group = 32, .residual = 64});
  const kvscout::kivi_host_storage storage(l);
  const auto b = storage.buffers();
  kvscout::kivi_append_host<layout> w(l, b, seq_lens.data());
  const std::vector<std::vector<int>> chunks{{37, 100, 1, 150}, {5, 200, 6}};
  for (int s = 0; s < S; ++s) {
    int n = 0;
    for (int c : chunks[static_cast<std::size_t>(s)]) n += c;
    const auto k = normal<half>(static_cast<std::size_t>(n) * H * D);
    const auto v = normal<half>(k.size());
    for (int at = 0; int c : chunks[static_cast<std::size_t>(s)]) {
      const std::size_t off = static_cast<std::size_t>(at) * H * D, len = static_cast<std::size_t>(c) * H * D;
      w.append(s, c, csp(k).subspan(off, len), csp(v).subspan(off, len));
      at += c;
    }
    save("kivi", "k" + std::to_string(s), k, {std::size_t(n), H, D});
    save("kivi", "v" + std::to_string(s), v, {std::size_t(n), H, D});
  }
  const char* names[5] = {"k_codes", "v_records", "k_params", "k_residual", "v_residual"};
  const kvscout::host_span<std::byte> bufs[5] = {b.k_codes, b.v_records, b.k_params, b.k_residual,
                                                 b.v_residual};
  for (int i = 0; i < 5; ++i) {
    const auto* p = reinterpret_cast<const std::int32_t*>(bufs[i].data());  // bytes, as int32 words
    save("kivi", names[i], std::vector<std::int32_t>(p, p + bufs[i].size() / 4), {bufs[i].size() / 4});
  }
  // Every 7th quantised token, at most 30 per (sequence, head).
  constexpr int C = 30;
  selection sel{std::vector<std::int32_t>(S * H * C, 0), std::vector<std::int32_t>(S * H), C};
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      int n = 0;
      for (int t = h; t < l.seq_len(s) && n < C; t += 7) sel.indices[(s * H + h) * C + n++] = t;
      sel.counts[static_cast<std::size_t>(s * H + h)] = n;
    }
  const kvscout::host_gather_config cfg{.shape = {.num_seqs = S, .num_kv_heads = H}, .capacity = C,
                                        .threads = 1};
  using executor = kvscout::gather_executor_host<layout>;
  kvscout::host_workspace ws(executor::workspace_bytes(cfg), executor::workspace_alignment);
  executor g(cfg, ws.span());
  std::vector<std::int32_t> kr(static_cast<std::size_t>(S) * H * C * l.k_row_bytes() / 4),
      vr(static_cast<std::size_t>(S) * H * C * l.v_row_bytes() / 4);
  const auto kb = kvscout::as_writable_bytes(sp(kr)), vb = kvscout::as_writable_bytes(sp(vr));
  g.submit(b.view(l).quantized(), sel.view(), {kb, vb}).wait();
  const auto q = normal<float>(static_cast<std::size_t>(S) * HQ * D);
  const auto kc = normal<half>(static_cast<std::size_t>(S) * H * D);
  const auto vc = normal<half>(kc.size());
  std::vector<float> out(q.size());
  const kvscout::kivi_gathered_rows_host<layout> rows(l, sel.view(), kvscout::host_span<const std::byte>(kb),
                                                       kvscout::host_span<const std::byte>(vb),
                                                       b.view(l).resident);
  kvscout::decode_attention_host(rows, kvscout::current_token<half>{csp(kc), csp(vc)}, csp(q),
                                 sp(out), {.num_q_heads = HQ, .scale = 0.125f});
  save("kivi", "indices", sel.indices, {S, H, C});
  save("kivi", "counts", sel.counts, {S, H});
  save("kivi", "k_rows", kr, {S, H, C, l.k_row_bytes() / 4});
  save("kivi", "v_rows", vr, {S, H, C, l.v_row_bytes() / 4});
  save("kivi", "q", q, {S, HQ, D});
  save("kivi", "k_cur", kc, {S, H, D});
  save("kivi", "v_cur", vc, {S, H, D});
  save("kivi", "out", out, {S, HQ, D});
  save("kivi", "seq_lens", seq_lens, {S});
}

// The baselines: streaming, the oracle over a contiguous HND float16 cache, Quest (pages of 16)
// and H2O (one observe of a selection with given probabilities).
void baselines(const selection& spec) {
  constexpr int D = 64, page = 16;
  kvscout::decode_shape shape;
  shape.num_layers = 1;
  shape.num_seqs = S;
  shape.num_kv_heads = H;
  shape.num_q_heads = HQ;
  shape.head_dim = D;
  shape.max_tokens = T;
  shape.scale = 0.125f;
  kvscout::score_context<kvscout::host_space> ctx{};
  ctx.seq_lens = csp(lens);
  const auto scores_into = [&](std::vector<float>& v) {
    return kvscout::score_buffer<kvscout::host_space>{sp(v), S, H, T};
  };
  std::vector<float> out(static_cast<std::size_t>(S) * H * T, 0.f);
  kvscout::streaming_policy_host({.shape = shape, .sinks = 4}).score(ctx, scores_into(out));
  save("streaming", "scores", out, {S, H, T});

  using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;
  const auto k = normal<half>(static_cast<std::size_t>(S) * H * T * D);
  const auto q = normal<float>(static_cast<std::size_t>(S) * HQ * D);
  ctx.q = csp(q);
  const layout lay = layout::padded(H, T, lens.data(), S);
  const kvscout::oracle_policy_host<layout> oracle(
      {.shape = shape, .aggregation = kvscout::gqa_aggregation::sum_prob},
      {{lay, kvscout::as_bytes(csp(k)), kvscout::as_bytes(csp(k))}});
  std::fill(out.begin(), out.end(), 0.f);
  oracle.score(0, ctx, scores_into(out));
  save("oracle", "k", k, {S, H, T, D});
  save("oracle", "q", q, {S, HQ, D});
  save("oracle", "scores", out, {S, H, T});

  using quest_t = kvscout::quest_policy_host<D>;
  const quest_t::config qc{.shape = shape, .page_size = page};
  kvscout::host_workspace qws(quest_t::workspace_bytes(qc), quest_t::workspace_alignment);
  quest_t quest(qc, qws.span());
  const auto keys = normal<float>(static_cast<std::size_t>(S) * T * H * D);  // [S, T, H, D]
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t)
      quest.append(0, s, t, nullptr, keys.data() + (static_cast<std::size_t>(s) * T + t) * H * D);
  std::fill(out.begin(), out.end(), 0.f);
  quest.score(0, ctx, scores_into(out));
  save("quest", "keys", keys, {S, T, H, D});
  save("quest", "scores", out, {S, H, T});

  kvscout::h2o_policy_host h2o({.shape = shape});
  const int stride = CAP + 1;
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> probs(static_cast<std::size_t>(S) * H * stride);
  for (auto& p : probs) p = u(rng);
  // observe reads the selection's tokens only, not the rows.
  const std::vector<float> no_rows(static_cast<std::size_t>(S) * H * CAP * D);
  const kvscout::gathered_rows_host<float, D> rows(spec.view(), csp(no_rows), csp(no_rows));
  h2o.observe(0, ctx, rows, csp(probs), stride, true);
  std::fill(out.begin(), out.end(), 0.f);
  h2o.score(0, ctx, scores_into(out));
  save("h2o", "probs", probs, {S, H, std::size_t(stride)});
  save("h2o", "scores", out, {S, H, T});
}

void budgets() {
  const auto p = kvscout::presets::kvscout_default(64);
  kvscout::decode_shape shape;
  shape.num_layers = 6;
  shape.num_seqs = 1;
  shape.num_kv_heads = 3;
  shape.num_q_heads = 9;
  shape.head_dim = 64;
  shape.max_tokens = 4096;
  const std::vector<double> shares{0, 0, 0.6, 1.4, 0.9, 1.1};
  const auto b = kvscout::presets::budgets(p, shape, 0.1, shares);
  save("budgets", "layer_shares", shares, {6});
  save("budgets", "speculated", b.speculated, {6});
  save("budgets", "total", b.total, {6});
  save("budgets", "capacities", std::vector<std::int64_t>{b.capacity, b.correction_capacity}, {2});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvscout_py_reference OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  const auto scores = normal<float>(static_cast<std::size_t>(S) * H * T, 1.f, 0.25f);
  const selection spec = topk("topk", scores, 40, 0);
  topk("topk_share", normal<float>(scores.size(), 1.f, 0.25f), CAP, 0.1);
  correction(normal<float>(scores.size(), 1.f, 0.25f), spec);
  threshold(scores);
  gather_contiguous<half, 64, kvscout::hnd>("gather_hnd", spec);
  gather_contiguous<float, 128, kvscout::nhd>("gather_nhd", spec);
  gather_paged<half, 64, kvscout::nhd, kvscout::block_table>("gather_block_table", spec);
  gather_paged<float, 128, kvscout::hnd, kvscout::flashinfer_page_table>("gather_indptr", spec);
  attention(spec);
  policy<kvscout::quantized_keys<2>>("policy_2bit", kvscout::rope_mode::rope_planes);
  policy<float>("policy_skew", kvscout::rope_mode::post_rope_skew);
  kivi();
  baselines(spec);
  budgets();
  std::printf("kvscout_py_reference: wrote %s\n", out_dir.c_str());
  return 0;
}
