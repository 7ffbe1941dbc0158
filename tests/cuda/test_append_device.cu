// Device append (kv/append.cuh) against the host: KIVI appends (kivi_append_cuda) against
// kivi_append_host byte for byte (codes, key group scales / zeros, value records with their
// padding, residual rings, lengths), across several group boundaries, fp16 and fp32 scales,
// 2 and 4 bits, T and float input, the records in mapped pinned memory and the rest on the
// device; rejected input (NaN, a full sequence) leaves everything unchanged and sets the status;
// generic appends (append_token_cuda) into contiguous and paged layouts against the layout's
// own offsets.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fetch_fixtures.cuh"
#include "kvscout/kv/append.cuh"
#include "kvscout/kv/append.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"

using namespace fetch_test;
using kvscout::bfloat16;
using kvscout::half;

namespace {

std::vector<std::byte> to_vec(const std::byte* p, std::size_t n) { return {p, p + n}; }

void expect_bytes(const std::string& what, const std::vector<std::byte>& got,
                  const std::vector<std::byte>& want) {
  const long long at = first_mismatch(got, want);
  if (at >= 0)
    std::fprintf(stderr, "%s: first differing byte %lld of %zu\n", what.c_str(), at, want.size());
  GPU_CHECK(at < 0);
}

// One token per sequence per step, `steps` steps, host writer vs device kernel.
template <class L, class In>
void kivi_append_case(int steps, std::uint32_t seed, int residual = 64, int heads = 2) {
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  const int H = heads, S = 3, cap = 256;
  const kvscout::kivi_options opt{.group = 32, .residual = residual};
  // Start from different lengths, some right before a key block boundary (64, 128, 192; R = 0:
  // every 32): with 50 steps or more every sequence crosses one at R = 64, two of three at 128.
  const std::vector<int32_t> start = {0, 71, 100};
  kivi_cache<L> host(start, H, cap, opt, seed);  // the host cache, filled by the writer
  const auto hb = host.store.buffers();
  // Device copy of the initial state: records in mapped pinned memory, the rest on the device.
  pinned_vector<std::byte> kc(hb.k_codes.size()), vr(hb.v_records.size());
  std::memcpy(kc.data(), hb.k_codes.data(), kc.bytes());
  std::memcpy(vr.data(), hb.v_records.data(), vr.bytes());
  auto up = [](const kvscout::host_span<std::byte>& s) {
    return device_vector<std::byte>(std::vector<std::byte>(s.data(), s.data() + s.size()));
  };
  auto kp = up(hb.k_params), kr = up(hb.k_residual), vres = up(hb.v_residual);
  device_vector<int32_t> dlens(host.lens);
  const L dl = L::padded(H, cap, dlens.data(), S, opt);
  const kvscout::kivi_buffers<kvscout::device_space> db{{kc.device_data(), kc.bytes()},
                                                        {vr.device_data(), vr.bytes()},
                                                        {kp.data(), kp.bytes()},
                                                        {kr.data(), kr.bytes()},
                                                        {vres.data(), vres.bytes()}};
  kvscout::kivi_append_host<L> writer(host.layout, hb, host.lens.data());
  device_vector<int> status(1);
  clear_status(status);
  const std::size_t tok = static_cast<std::size_t>(S) * H * D;
  for (int step = 0; step < steps; ++step) {
    auto kin = random_values<In>(tok, seed + 100 + step), vin = random_values<In>(tok, seed + 900 + step);
    // The host writer takes T: the float input rounded as the device rounds it.
    std::vector<T> kt(tok), vt(tok);
    for (std::size_t i = 0; i < tok; ++i) {
      kt[i] = kvscout::detail::convert<T>(kin[i]);
      vt[i] = kvscout::detail::convert<T>(vin[i]);
    }
    for (int s = 0; s < S; ++s) {
      const std::size_t off = static_cast<std::size_t>(s) * H * D;
      writer.append(s, {kt.data() + off, static_cast<std::size_t>(H) * D},
                    {vt.data() + off, static_cast<std::size_t>(H) * D});
    }
    device_vector<In> dk(kin), dv(vin);
    kvscout::kivi_append_cuda(dl, db, dlens.data(), kvscout::device_span<const In>(dk.data(), tok),
                              kvscout::device_span<const In>(dv.data(), tok),
                              {nullptr, status.data()});
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string name = "kivi k" + std::to_string(L::key_bits) + "v" +
                           std::to_string(L::value_bits) + " R" + std::to_string(residual) + "/" +
                           std::string(kvscout::dtype_traits<T>::name) + "/d" + std::to_string(D);
  GPU_CHECK(dlens.download() == host.lens);
  expect_bytes(name + " k_codes", to_vec(kc.data(), kc.bytes()), to_vec(hb.k_codes.data(), hb.k_codes.size()));
  expect_bytes(name + " v_records", to_vec(vr.data(), vr.bytes()), to_vec(hb.v_records.data(), hb.v_records.size()));
  expect_bytes(name + " k_params", kp.download(), to_vec(hb.k_params.data(), hb.k_params.size()));
  expect_bytes(name + " k_residual", kr.download(), to_vec(hb.k_residual.data(), hb.k_residual.size()));
  expect_bytes(name + " v_residual", vres.download(), to_vec(hb.v_residual.data(), hb.v_residual.size()));
  GPU_CHECK(read_status(status) == 0);
}

// NaN input and a full sequence: nothing written, lengths unchanged, status bits set.
void kivi_rejects() {
  using L = kvscout::kivi_layout<half, 64, 2>;
  const int H = 1, S = 2, cap = 64;
  std::vector<int32_t> lens = {10, cap};
  device_vector<int32_t> dlens(lens);
  const L l = L::padded(H, cap, dlens.data(), S, {.group = 16, .residual = 16});
  device_vector<std::byte> kc(l.required_k_bytes() + 16), vr(l.required_v_bytes() + 16),
      kp(l.required_k_params_bytes() + 16), kr(l.required_residual_bytes()),
      vres(l.required_residual_bytes());
  const kvscout::kivi_buffers<kvscout::device_space> b{{kc.data(), kc.bytes()}, {vr.data(), vr.bytes()},
                                                       {kp.data(), kp.bytes()}, {kr.data(), kr.bytes()},
                                                       {vres.data(), vres.bytes()}};
  std::vector<float> k(S * H * 64, 0.5f), v(S * H * 64, 0.25f);
  k[3] = std::numeric_limits<float>::quiet_NaN();  // sequence 0
  device_vector<float> dk(k), dv(v);
  device_vector<int> status(1);
  clear_status(status);
  const auto before = kr.download();
  kvscout::kivi_append_cuda(l, b, dlens.data(), kvscout::device_span<float>(dk.data(), k.size()),
                            kvscout::device_span<float>(dv.data(), v.size()),
                            {nullptr, status.data()});
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(dlens.download() == lens);
  GPU_CHECK(kr.download() == before);
  GPU_CHECK(read_status(status) ==
            (kvscout::device_status::bad_value | kvscout::device_status::bad_index));
}

// Generic layouts: the row at (s, position, h) holds the converted input (float input divided by
// `scales` first), nothing else changes. Sequences marked in `skip` must be left alone (their
// position is not theirs) and the status must then be `want_status`.
template <class L, class In>
void generic_case(const std::string& name, const L& host_l, const L& dev_l, std::size_t bytes,
                  const std::vector<int32_t>* positions, std::uint32_t seed,
                  const std::vector<bool>& skip = {}, int want_status = 0,
                  kvscout::kv_scales scales = {}) {
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  const int S = host_l.num_seqs(), H = host_l.num_kv_heads();
  std::vector<std::byte> init(bytes);
  fill_random_bytes(init.data(), bytes, seed);
  pinned_vector<std::byte> k(bytes);  // K in mapped host memory
  std::memcpy(k.data(), init.data(), bytes);
  device_vector<std::byte> v(init);  // V on the device
  const std::size_t tok = static_cast<std::size_t>(S) * H * D;
  auto kin = random_values<In>(tok, seed + 1), vin = random_values<In>(tok, seed + 2);
  device_vector<In> dk(kin), dv(vin);
  device_vector<int32_t> dpos(positions ? *positions : std::vector<int32_t>{0});
  device_vector<int> status(1);
  clear_status(status);
  kvscout::append_token_cuda(dev_l, kvscout::device_span<std::byte>(k.device_data(), bytes),
                             kvscout::device_span<std::byte>(v.data(), bytes),
                             kvscout::device_span<In>(dk.data(), tok),  // non-const spans
                             kvscout::device_span<In>(dv.data(), tok),  // deduce too
                             positions ? dpos.data() : nullptr, scales,
                             {nullptr, status.data()});
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::byte> want_k = init, want_v = init;
  for (int s = 0; s < S; ++s) {
    if (!skip.empty() && skip[static_cast<std::size_t>(s)]) continue;
    const int t = positions ? (*positions)[s] : host_l.seq_len(s);
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < D; ++c) {
        const std::size_t in = (static_cast<std::size_t>(s) * H + h) * D + c;
        T kx, vx;
        if constexpr (std::is_same_v<In, T> && !std::is_same_v<In, float>) {
          kx = kin[in], vx = vin[in];  // input in a narrower T: stored as given
        } else {
          kx = kvscout::from_float<T>(kvscout::to_float(kin[in]) / scales.k);
          vx = kvscout::from_float<T>(kvscout::to_float(vin[in]) / scales.v);
        }
        std::memcpy(&want_k[host_l.k_offset(s, t, h) + c * sizeof(T)], &kx, sizeof(T));
        std::memcpy(&want_v[host_l.v_offset(s, t, h) + c * sizeof(T)], &vx, sizeof(T));
      }
  }
  expect_bytes(name + " K (mapped)", to_vec(k.data(), bytes), want_k);
  expect_bytes(name + " V (device)", v.download(), want_v);
  // The host append (kv/append.hpp) writes the device append's bytes, or refuses what the device
  // skips (naming the position), writing nothing.
  std::vector<std::byte> hk = init, hv = init;
  const std::vector<int32_t> hpos = positions ? *positions : std::vector<int32_t>{};
  auto host_append = [&] {
    kvscout::append_token_host(host_l, kvscout::host_span<std::byte>(hk.data(), bytes),
                               kvscout::host_span<std::byte>(hv.data(), bytes),
                               kvscout::host_span<const In>(kin.data(), tok),
                               kvscout::host_span<const In>(vin.data(), tok),
                               kvscout::host_span<const int32_t>(hpos.data(), hpos.size()), scales);
  };
  if (want_status == 0) {
    host_append();
    expect_bytes(name + " K (host append)", hk, want_k);
    expect_bytes(name + " V (host append)", hv, want_v);
  } else {
    GPU_CHECK(gpu_test::throws_with(host_append, "sequence "));
    expect_bytes(name + " K (host append refused)", hk, init);
  }
  const int st = read_status(status);
  if (st != want_status)
    std::fprintf(stderr, "%s: status %d (%s), expected %d\n", name.c_str(), st,
                 kvscout::device_status::describe(st).c_str(), want_status);
  GPU_CHECK(st == want_status);
}

void generic_contiguous() {
  using L = kvscout::contiguous_layout<half, 128, kvscout::nhd>;
  std::vector<int32_t> lens = {5, 0, 12};
  device_vector<int32_t> dlens(lens);
  const L hl = L::padded(4, 16, lens.data(), 3), dl = L::padded(4, 16, dlens.data(), 3);
  generic_case<L, float>("contiguous nhd f16 (float in)", hl, dl, hl.required_bytes(), nullptr, 1);
  generic_case<L, half>("contiguous nhd f16 (f16 in)", hl, dl, hl.required_bytes(), nullptr, 2);
}

// An fp8 cache that stores K / k_scale and V / v_scale: float input is divided by the scales
// before rounding (saturating), fp8 input is stored as given.
void generic_fp8() {
  using L = kvscout::contiguous_layout<kvscout::fp8_e4m3, 128, kvscout::nhd>;
  std::vector<int32_t> lens = {5, 0, 12};
  device_vector<int32_t> dlens(lens);
  const L hl = L::padded(4, 16, lens.data(), 3), dl = L::padded(4, 16, dlens.data(), 3);
  generic_case<L, float>("contiguous nhd e4m3 (float in, scaled)", hl, dl, hl.required_bytes(),
                         nullptr, 21, {}, 0, {0.05f, 0.011f});
  generic_case<L, kvscout::fp8_e4m3>("contiguous nhd e4m3 (e4m3 in)", hl, dl, hl.required_bytes(),
                                     nullptr, 22, {}, 0, {0.05f, 0.011f});
  using Case = kvtest::layout_case<kvtest::kind::vllm, kvscout::hnd, kvscout::fp8_e5m2, 64>;
  std::mt19937 rng(23);
  kvtest::layout_fixture<Case> f({20, 9}, 2, rng);
  device_layout<Case> dpl(f);
  const std::vector<int32_t> positions = {19, 8};
  generic_case<Case::layout, float>("paged vllm hnd e5m2 (float in, scaled)", f.layout,
                                    dpl.layout, f.bytes, &positions, 24, {}, 0, {3.f, 0.25f});
  // A float cache with scales: the input is divided too.
  using LF = kvscout::contiguous_layout<float, 64, kvscout::hnd>;
  const LF hf = LF::padded(2, 16, lens.data(), 3), df = LF::padded(2, 16, dlens.data(), 3);
  generic_case<LF, float>("contiguous hnd f32 (float in, scaled)", hf, df, hf.required_bytes(),
                          nullptr, 25, {}, 0, {0.5f, 4.f});
}

void generic_paged() {
  using Case = kvtest::layout_case<kvtest::kind::vllm, kvscout::hnd, float, 128>;
  std::mt19937 rng(3);
  kvtest::layout_fixture<Case> f({20, 9}, 2, rng);
  device_layout<Case> dl(f);
  const std::vector<int32_t> positions = {19, 8};  // overwrite the last token (its page exists)
  generic_case<Case::layout, float>("paged vllm hnd f32", f.layout, dl.layout, f.bytes, &positions, 4);
}

// A position outside the slots a sequence owns is skipped (bad_index), never written into a
// neighbour's slots: the padded t == capacity (the next sequence's slot 0 in NHD, the next head's
// in HND), a ragged sequence past its tokens (the next one's first token) while the last one may
// grow into the free tail, a full FlashInfer last page with no next page, and a block-table
// position past the row's width (which would read the next sequence's entries); an unallocated
// (-1) block-table entry within the width is caught by the buffer bounds (out_of_bounds).
void generic_rejects_foreign_slots() {
  constexpr int bad_index = kvscout::device_status::bad_index;
  {  // padded: sequence 0 is full (its t = 8 would be sequence 1's token 0 in NHD)
    using L = kvscout::contiguous_layout<half, 128, kvscout::nhd>;
    std::vector<int32_t> lens = {8, 3};
    device_vector<int32_t> dlens(lens);
    const L hl = L::padded(2, 8, lens.data(), 2), dl = L::padded(2, 8, dlens.data(), 2);
    generic_case<L, float>("padded nhd full seq 0", hl, dl, hl.required_bytes(), nullptr, 5,
                           {true, false}, bad_index);
  }
  {  // padded HND: the last sequence full (t = 8 of head 0 would be head 1's token 0)
    using L = kvscout::contiguous_layout<float, 64, kvscout::hnd>;
    std::vector<int32_t> lens = {3, 8};
    device_vector<int32_t> dlens(lens);
    const L hl = L::padded(2, 8, lens.data(), 2), dl = L::padded(2, 8, dlens.data(), 2);
    generic_case<L, float>("padded hnd full last seq", hl, dl, hl.required_bytes(), nullptr, 6,
                           {false, true}, bad_index);
  }
  {  // ragged NHD, indptr {0, 4, 9, 11}, 13 slots: sequences 0 and 1 cannot grow in place, the
     // last one grows into slot 11 of the free tail
    using L = kvscout::contiguous_layout<half, 128, kvscout::nhd>;
    std::vector<int32_t> indptr = {0, 4, 9, 11};
    device_vector<int32_t> dind(indptr);
    const L hl = L::ragged(2, 13, indptr.data(), 3), dl = L::ragged(2, 13, dind.data(), 3);
    generic_case<L, half>("ragged nhd grow", hl, dl, hl.required_bytes(), nullptr, 7,
                          {true, true, false}, bad_index);
    // Explicit positions inside each sequence's own tokens (the tail for the last) are fine.
    const std::vector<int32_t> pos = {3, 0, 2};
    generic_case<L, half>("ragged nhd own slots", hl, dl, hl.required_bytes(), &pos, 8);
  }
  {  // ragged HND: the last sequence at slot 13 == total_tokens (would be head 1's slot 0)
    using L = kvscout::contiguous_layout<float, 64, kvscout::hnd>;
    std::vector<int32_t> indptr = {0, 4, 9, 11};
    device_vector<int32_t> dind(indptr);
    const L hl = L::ragged(2, 13, indptr.data(), 3), dl = L::ragged(2, 13, dind.data(), 3);
    const std::vector<int32_t> pos = {0, 4, 4};
    generic_case<L, float>("ragged hnd past total", hl, dl, hl.required_bytes(), &pos, 9,
                           {false, false, true}, bad_index);
  }
  {  // FlashInfer, page 16: sequence 0 fills its only page, so seq_len = 16 has no page
    using Case = kvtest::layout_case<kvtest::kind::flashinfer, kvscout::nhd, half, 128>;
    std::mt19937 rng(11);
    kvtest::layout_fixture<Case> f({16, 5}, 2, rng);
    device_layout<Case> dl(f);
    generic_case<Case::layout, float>("paged flashinfer full page", f.layout, dl.layout, f.bytes,
                                      nullptr, 10, {true, false}, bad_index);
  }
  {  // block table, page 7, width 4 (28 slots): t = 28 is past the row; sequence 2's logical
     // page 2 is unallocated (-1)
    using Case = kvtest::layout_case<kvtest::kind::vllm, kvscout::hnd, float, 128>;
    std::mt19937 rng(12);
    kvtest::layout_fixture<Case> f({20, 9, 9}, 2, rng);
    device_layout<Case> dl(f);
    const std::vector<int32_t> pos = {28, 9, 14};
    generic_case<Case::layout, float>("paged vllm past width", f.layout, dl.layout, f.bytes, &pos,
                                      13, {true, false, true},
                                      bad_index | kvscout::device_status::out_of_bounds);
  }
}

}  // namespace

int main() {
  return gpu_test::run_all(
      "append_device",
      {
          {"kivi2_f16_d128_f16_scales", [] { kivi_append_case<kvscout::kivi_layout<half, 128, 2>, half>(80, 1); }},
          {"kivi4_f16_d128_float_input", [] { kivi_append_case<kvscout::kivi_layout<half, 128, 4>, float>(70, 2); }},
          {"kivi4_bf16_d64_f32_scales", [] { kivi_append_case<kvscout::kivi_layout<bfloat16, 64, 4, float>, bfloat16>(70, 3); }},
          {"kivi2_f32_d64", [] { kivi_append_case<kvscout::kivi_layout<float, 64, 2, float>, float>(50, 4); }},
          {"kivi_k2v4_f16_d128_r0", [] { kivi_append_case<kvscout::kivi_layout<half, 128, kvscout::kivi_bits{2, 4}>, half>(70, 5, 0); }},
          {"kivi_k4v2_f16_d64", [] { kivi_append_case<kvscout::kivi_layout<half, 64, kvscout::kivi_bits{4, 2}>, float>(70, 6); }},
          // Llama-shaped heads and block: (8 heads x 4 groups x 32 code bytes) = 1024 items, so
          // every thread of the flush takes four.
          {"kivi2_f16_d128_h8_r128", [] { kivi_append_case<kvscout::kivi_layout<half, 128, 2>, half>(80, 7, 128, 8); }},
          {"kivi_rejects_bad_input", kivi_rejects},
          {"generic_contiguous", generic_contiguous},
          {"generic_paged", generic_paged},
          {"generic_fp8_scaled", generic_fp8},
          {"generic_rejects_foreign_slots", generic_rejects_foreign_slots},
      });
}
