// A small program a downstream engine might write: gather 3 selected rows from a paged cache.
#include <kvscout/kvscout.hpp>

#include <cstdio>
#include <vector>

int main() {
  using layout = kvscout::paged_layout<kvscout::half, 64, kvscout::hnd,
                                       kvscout::block_table, 16>;
  std::vector<int32_t> table = {1, 0}, lens = {20};
  layout l({table.data(), lens.data(), 2, 1}, /*num_kv_heads=*/1);
  std::vector<kvscout::half> k(2 * 16 * 64), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = kvscout::from_float<kvscout::half>(static_cast<float>(i % 97));
    v[i] = kvscout::from_float<kvscout::half>(-static_cast<float>(i % 89));
  }
  std::vector<int32_t> idx = {0, 1, 19}, count = {3};
  kvscout::host_gather_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = 1}, .capacity = 3};
  using ex_t = kvscout::gather_executor_host<layout>;
  auto ws = kvscout::make_workspace<ex_t>(cfg);
  ex_t ex(cfg, ws.span());
  std::vector<kvscout::half> dk(3 * 64), dv(3 * 64);
  ex.submit({l, kvscout::as_bytes(kvscout::host_span<const kvscout::half>(k.data(), k.size())),
             kvscout::as_bytes(kvscout::host_span<const kvscout::half>(v.data(), v.size()))},
            {{idx.data(), idx.size()}, {count.data(), count.size()}, 1, 1, 3},
            {kvscout::as_writable_bytes(kvscout::host_span<kvscout::half>(dk.data(), dk.size())),
             kvscout::as_writable_bytes(kvscout::host_span<kvscout::half>(dv.data(), dv.size()))})
      .wait();
  // token 19 sits in logical page 1 = physical page 0, slot 3: element (3 * 64) of K.
  const float got = kvscout::to_float(dk[2 * 64]);
  const float want = static_cast<float>((3 * 64) % 97);
  std::printf("consumer: gathered token 19, first element %.1f (expected %.1f)\n", got, want);
  return got == want ? 0 : 1;
}
