// 03_paged_engine: kvscout's parts composed by hand around an engine's own paged KV cache.
//
// The engine keeps its cache in vLLM's block-table form: fp16, pages of 16 tokens handed out in a
// shuffled order, 8 KV heads, 32 query heads, head_dim 128, three sequences of different lengths.
// For one layer it uses kvscout on the host without decode_pipeline_host, part by part:
//
//   setup    an InfiniGen policy (RoPE-plane plans without calibration: planes 0..15 of 64,
//            r = 32), a top-k selector, a host gather executor, each with its workspace sized
//            by its query, and every buffer of the decode step;
//   prefill  the engine writes K / V into its pages through the layout's address math and gives
//            the policy each token's keys (the policy keeps their partial keys);
//   decode   score -> select -> gather the selected rows out of the engine's pages -> sparse
//            attention over them plus the current token. Nothing in it allocates.
//
// Lengths follow kvscout's convention: seq_lens counts the cached tokens, the token being decoded
// excluded (it is attention's current_token). vLLM's seq_lens include it: subtract one.
//
// The example checks that a budget of every token gives dense attention's bits, then prints per
// budget the rows fetched, the output's relative error against dense attention and the share of
// the attention mass the selected rows carry. Last, continuous batching: a score() over two of
// the three sequences, out of order, named by score_context::seq_ids. The keys here are random,
// without the outlier channels of a trained model's keys, so 32 of 128 channels estimate the
// logits only roughly; docs/accuracy.md has the real model.
//
//   ./examples/03_paged_engine

#include <kvscout/kvscout.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace ks = kvscout;

int main() try {
  using T = ks::half;
  constexpr int D = 128, H = 8, Hq = 32, P = 16, d_model = 512, max_tokens = 640;
  using layout_t = ks::paged_layout<T, D, ks::nhd, ks::block_table, P>;
  using gather_t = ks::gather_executor_host<layout_t>;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);

  // ---- the engine's cache: pages, block table, lengths (cached tokens, current one excluded)
  std::vector<int32_t> lens = {37, 200, 513};
  const int S = static_cast<int>(lens.size());
  const int max_blocks = max_tokens / P;
  int pages = 3;  // a few spare pages, as an allocator keeps
  for (int len : lens) pages += (len + P - 1) / P;
  std::vector<int32_t> page_ids(static_cast<std::size_t>(pages));
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  std::vector<int32_t> block_table(static_cast<std::size_t>(S) * max_blocks, -1);
  for (int s = 0, next = 0; s < S; ++s)
    for (int b = 0; b < (lens[s] + P - 1) / P; ++b)
      block_table[s * max_blocks + b] = page_ids[next++];
  std::vector<T> k_pages(static_cast<std::size_t>(pages) * P * H * D);
  std::vector<T> v_pages(k_pages.size());
  const layout_t layout({.table = block_table.data(), .seq_lens = lens.data(),
                         .max_blocks_per_seq = max_blocks, .seqs = S},
                        H);
  const ks::kv_view<layout_t, ks::host_space> kv{layout,
                                                 ks::as_bytes(ks::host_span<const T>(k_pages)),
                                                 ks::as_bytes(ks::host_span<const T>(v_pages))};

  // ---- the model's layer: W_Q [Hq * D, d_model] (no bias), RoPE split-half
  const ks::rope_config rope{.head_dim = D, .theta = 10000.f, .style = ks::rope_style::split_half};
  std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * d_model);
  for (auto& w : w_q) w = normal(rng) * 0.15f;  // logits of std ~3.4: peaked, as models' are
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int cached_rows = std::accumulate(lens.begin(), lens.end(), 0) * H;

  // ---- setup: policy, selector, executor and the step's buffers
  std::vector<int> planes(16);
  std::iota(planes.begin(), planes.end(), 0);
  const std::vector<ks::skew_plan> plans(H, ks::rope_planes_plan(rope, planes));  // per KV head
  const ks::decode_shape shape{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D,
                               .d_model = d_model, .max_tokens = max_tokens, .scale = scale};
  const ks::infinigen_config policy_cfg{.shape = shape, .r = plans[0].r,  // 16 planes: 32
                                        .mode = ks::rope_mode::rope_planes};
  // The policy's partial keys, partial W_Q rows and scratch, in one workspace it asks for.
  using policy_t = ks::infinigen_policy_host<>;
  const auto policy_ws = ks::make_workspace<policy_t>(policy_cfg);
  policy_t policy(policy_cfg, plans, {w_q.data(), w_q.size()}, {}, policy_ws.span());

  // ---- prefill: the engine writes its pages; the policy gets each token's keys after RoPE
  std::vector<float> k(H * D), v(H * D);
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < lens[s]; ++t) {
      for (int i = 0; i < H * D; ++i) k[i] = normal(rng), v[i] = normal(rng);
      for (int h = 0; h < H; ++h) ks::apply_rope(k.data() + h * D, t, rope);
      // Token t of sequence s into its page (checked: a slot s owns, inside the pool).
      ks::write_tokens_host(layout, ks::as_writable_bytes(ks::host_span<T>(k_pages)),
                            ks::as_writable_bytes(ks::host_span<T>(v_pages)), s, t, 1,
                            ks::host_span<const float>(k), ks::host_span<const float>(v));
      const int32_t seq = s, token = t;  // rope_planes keys: after RoPE
      policy.append(ks::host_span<const float>(k), {&seq, 1}, {&token, 1}, 1);
    }

  // ---- the decode step's inputs: the layer input x, the query (RoPE'd at the position), the
  // current token's K / V
  std::vector<float> x(static_cast<std::size_t>(S) * d_model);
  std::vector<float> q(static_cast<std::size_t>(S) * Hq * D);
  for (auto& e : x) e = normal(rng);
  for (int s = 0; s < S; ++s)
    for (int row = 0; row < Hq * D; ++row) {
      float acc = 0.f;
      for (int j = 0; j < d_model; ++j)
        acc += w_q[static_cast<std::size_t>(row) * d_model + j] * x[s * d_model + j];
      q[static_cast<std::size_t>(s) * Hq * D + row] = acc;
    }
  const std::vector<int32_t> positions = lens;  // the new token's position is the cached length
  for (int s = 0; s < S; ++s)
    for (int qh = 0; qh < Hq; ++qh)
      ks::apply_rope(q.data() + (static_cast<std::size_t>(s) * Hq + qh) * D, positions[s], rope);
  std::vector<T> k_cur(static_cast<std::size_t>(S) * H * D), v_cur(k_cur.size());
  for (auto& e : k_cur) e = ks::from_float<T>(normal(rng));
  for (auto& e : v_cur) e = ks::from_float<T>(normal(rng));
  const ks::current_token<T> cur{k_cur, v_cur};
  const ks::attention_params attn{.num_q_heads = Hq, .scale = scale};

  // Dense attention, the reference; its probabilities (summed over each group) give the mass.
  const int probs_stride = max_tokens + 1;
  std::vector<float> dense(q.size()), probs(static_cast<std::size_t>(S) * H * probs_stride);
  ks::decode_attention_host(ks::layout_rows_host(kv), cur, q, dense, attn, probs, probs_stride);

  // One selector, executor and set of buffers per budget, all sized before the step.
  std::vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens);
  const ks::score_buffer<ks::host_space> score_rows{scores, S, H, max_tokens};
  bool full_is_dense = false;
  for (const int budget : {max_tokens, 128, 64, 32}) {
    const ks::topk_selector_host::config sc{.shape = shape, .capacity = budget, .budget = budget,
                                            .keep = {.sinks = 4, .recent = 16}};
    auto select_ws = ks::make_workspace<ks::topk_selector_host>(sc);
    ks::topk_selector_host topk(sc, select_ws.span());
    const ks::host_gather_config gc{.shape = shape, .capacity = budget, .threads = 1};
    auto gather_ws = ks::make_workspace<gather_t>(gc);
    gather_t gather(gc, gather_ws.span());
    std::vector<int32_t> indices(static_cast<std::size_t>(S) * H * budget), counts(S * H);
    const ks::selection_buffers<ks::host_space> sel{indices, counts, S, H, budget};
    std::vector<T> k_rows(indices.size() * D), v_rows(k_rows.size());
    const ks::gather_destination<ks::host_space> rows{
        ks::as_writable_bytes(ks::host_span<T>(k_rows)),
        ks::as_writable_bytes(ks::host_span<T>(v_rows))};
    std::vector<float> sparse(q.size());

    // ---- the decode step: score, select, gather, attend
    // (.q stays empty: InfiniGen scores before layer i has a query. In an engine x is layer
    // i-1's normalised input, read while layer i-1 runs; here one x serves both, for brevity.)
    policy.score({.x = x, .q = {}, .positions = positions, .seq_lens = lens}, score_rows);
    topk.select(score_rows.view(lens), sel);
    gather.submit(kv, sel.view(), rows).wait();
    ks::decode_attention_host(ks::gathered_rows_host(layout, sel.view(), rows), cur, q, sparse, attn);

    long fetched = 0;
    double mass = 0;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const int r = s * H + h;
        fetched += counts[r];
        mass += ks::attention_mass_recall(&probs[static_cast<std::size_t>(r) * probs_stride],
                                          lens[s], &indices[static_cast<std::size_t>(r) * budget],
                                          counts[r]);
      }
    const double err = ks::relative_error(sparse, dense);
    std::printf("budget %4d: %5ld of %5d rows fetched, relative error %.3g, attention mass %.3f\n",
                budget, fetched, cached_rows, err, mass / (S * H));
    if (budget == max_tokens) full_is_dense = sparse == dense;
  }
  std::printf("every token selected gives dense attention's bits: %s\n",
              full_is_dense ? "yes" : "NO");

  // ---- continuous batching: sequence 1 has finished and the next step decodes sequences 2 and
  // 0, in that order. The policy keeps its three sequences; score_context::seq_ids names each
  // batch row's, so with the same inputs each row scores what its sequence scored above.
  const std::vector<int32_t> live = {2, 0};
  const int B = static_cast<int>(live.size());
  std::vector<float> live_x;
  std::vector<int32_t> live_pos, live_lens;
  for (int s : live) {
    live_x.insert(live_x.end(), x.begin() + s * d_model, x.begin() + (s + 1) * d_model);
    live_pos.push_back(positions[s]);
    live_lens.push_back(lens[s]);
  }
  std::vector<float> live_scores(static_cast<std::size_t>(B) * H * max_tokens);
  const ks::score_buffer<ks::host_space> live_rows{live_scores, B, H, max_tokens};
  policy.score({.x = live_x, .q = {}, .positions = live_pos, .seq_lens = live_lens,
                   .seq_ids = live},
               live_rows);
  bool same_rows = true;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      same_rows = same_rows && std::equal(live_rows.row(b, h), live_rows.row(b, h) + live_lens[b],
                                          score_rows.row(live[b], h));
  std::printf("a batch of sequences 2 and 0 (seq_ids) scores as they did in the full batch: %s\n",
              same_rows ? "yes" : "NO");
  return full_is_dense && same_rows ? 0 : 1;
} catch (const kvscout::error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
