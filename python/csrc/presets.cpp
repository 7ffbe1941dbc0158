// The presets for Python: a preset's fields by name (presets::infinigen_paper, kvscout_default,
// kvscout_speculation_only), its budgets at a share of the rows (presets::budgets with the
// calibration's layer shares), and, where the package was built with Eigen, presets::calibrate
// on a calibration text's queries and keys, writing its plans into the caller's arrays.
//
// A preset crosses as a flat list of numbers, the order of `preset_fields` below;
// python/kvscout/presets.py gives them names. Every field is checked here.

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/string.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checks.hpp"
#include "preset_args.hpp"
#include "kvscout/kvscout.hpp"
#if KVSCOUT_PY_EIGEN
#include "kvscout/calibrate.hpp"
#endif

namespace {

using namespace kvscout_py;

ffi::Array<double> preset_named(ffi::String name, std::int64_t head_dim) {
  const std::string n = name;
  const int D = as_int(head_dim, "head_dim");
  return guarded([&] {
    if (n == "infinigen_paper") return fields_of(presets::infinigen_paper(D));
    if (n == "kvscout_default") return fields_of(presets::kvscout_default(D));
    if (n == "kvscout_speculation_only") return fields_of(presets::kvscout_speculation_only(D));
    TVM_FFI_THROW(ValueError) << "preset '" << n << "', expected infinigen_paper, "
                              << "kvscout_default or kvscout_speculation_only";
  });
}

// presets::budgets at `budget` with layer_shares [L] float64 (or empty): writes speculated [L] and
// total [L] float64; returns [capacity, correction_capacity].
ffi::Array<std::int64_t> preset_budgets(ffi::String name, ffi::Array<double> fields,
                                        ffi::Array<std::int64_t> dims, double budget,
                                        ffi::TensorView layer_shares, ffi::TensorView speculated,
                                        ffi::TensorView total) {
  const presets::speculation_preset p = preset_of(name, fields);
  const kvscout::decode_shape shape = shape_of_dims(dims);
  std::vector<double> shares;
  if (layer_shares.numel() > 0) {
    expect_dtype(layer_shares, "layer_shares", kDLFloat, 64);
    expect(layer_shares, "layer_shares", {shape.num_layers});
    const auto v = span_of<const double>(layer_shares);
    shares.assign(v.begin(), v.end());
  }
  for (const auto* t : {&speculated, &total}) {
    expect_dtype(*t, "speculated / total", kDLFloat, 64);
    expect(*t, "speculated / total", {shape.num_layers});
  }
  return guarded([&] {
    const presets::step_budgets b = presets::budgets(p, shape, budget, shares);
    const auto sp = span_of<double>(speculated), to = span_of<double>(total);
    for (std::size_t l = 0; l < b.speculated.size(); ++l) sp[l] = b.speculated[l], to[l] = b.total[l];
    return ffi::Array<std::int64_t>{b.capacity, b.correction_capacity};
  });
}

// calibration::layer_shares of mass curves [L, bins] float64 at `budget`, into out [L] float64.
void preset_layer_shares(ffi::String name, ffi::Array<double> fields, ffi::TensorView mass_curves,
                         std::int64_t first_layer, double budget, ffi::TensorView out) {
  const presets::speculation_preset p = preset_of(name, fields);
  expect_dtype(mass_curves, "mass_curves", kDLFloat, 64);
  expect(mass_curves, "mass_curves", {-1, -1});
  expect_dtype(out, "out", kDLFloat, 64);
  expect(out, "out", {mass_curves.size(0)});
  presets::calibration c;
  const auto m = span_of<const double>(mass_curves);
  c.mass_curves.assign(m.begin(), m.end());
  c.bins = as_int(mass_curves.size(1), "bins");
  c.first_layer = as_int(first_layer, "first_layer");
  guarded([&] {
    const std::vector<double> s = c.layer_shares(p, budget);
    if (s.size() != static_cast<std::size_t>(out.numel()))
      TVM_FFI_THROW(ValueError) << p.name << " has no layer_rule: its layers share the budget evenly";
    std::copy(s.begin(), s.end(), span_of<double>(out).begin());
    return 0;
  });
}

bool built_with_calibration() { return KVSCOUT_PY_EIGEN != 0; }

// presets::calibrate on q [L, n, Hq, D] and k [L, n, H, D] float32 (after RoPE). Writes, for the
// layers from first_layer on: rope_planes mode planes [L, H, r / 2] int32; the skew modes A
// [L, H, D, D] float32 and channels [L, H, r] int32; the same for the correction (empty arrays
// where the preset has none); mass_curves [L, bins] float64 where the preset has a layer rule.
// Returns first_layer.
std::int64_t preset_calibrate(ffi::String name, ffi::Array<double> fields,
                              ffi::Array<std::int64_t> dims, double theta, std::int64_t style,
                              ffi::TensorView q, ffi::TensorView k, ffi::TensorView planes,
                              ffi::TensorView A, ffi::TensorView channels,
                              ffi::TensorView corr_planes, ffi::TensorView corr_A,
                              ffi::TensorView corr_channels, ffi::TensorView mass_curves) {
#if KVSCOUT_PY_EIGEN
  const presets::speculation_preset p = preset_of(name, fields);
  const kvscout::decode_shape shape = shape_of_dims(dims);
  const int L = shape.num_layers, H = shape.num_kv_heads, Hq = shape.num_q_heads,
            D = shape.head_dim;
  expect_dtype(q, "q", kDLFloat, 32);
  expect(q, "q", {L, -1, Hq, D});
  const std::int64_t n = q.size(1);
  expect_dtype(k, "k", kDLFloat, 32);
  expect(k, "k", {L, n, H, D});
  if (style != 0 && style != 1)
    TVM_FFI_THROW(ValueError) << "rope style " << style << ", expected 0 or 1";
  const kvscout::rope_config rope{D, static_cast<float>(theta),
                                  static_cast<kvscout::rope_style>(style)};
  const auto per_layer = [](const ffi::TensorView& t, int L_, std::size_t each) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(L_));
    const auto all = span_of<const float>(t);
    for (int l = 0; l < L_; ++l)
      out[l].assign(all.begin() + l * each, all.begin() + (l + 1) * each);
    return out;
  };
  const std::size_t qn = static_cast<std::size_t>(n) * Hq * D, kn = static_cast<std::size_t>(n) * H * D;
  const presets::calibration c = guarded([&] {
    return presets::calibrate(p, shape, rope, per_layer(q, L, qn), per_layer(k, L, kn),
                              as_int(n, "n"));
  });
  const auto write = [&](const std::vector<std::vector<kvscout::skew_plan>>& plans, int r,
                         const ffi::TensorView& pl, const ffi::TensorView& a,
                         const ffi::TensorView& ch, const char* what) {
    if (plans.empty()) return;
    if (p.mode == kvscout::rope_mode::rope_planes) {
      expect_dtype(pl, what, kDLInt, 32);
      expect(pl, what, {L, H, r / 2});
      std::int32_t* out = span_of<std::int32_t>(pl).data();
      for (int l = c.first_layer; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const std::vector<int>& got = plans[l][h].planes;
          if (got.size() != static_cast<std::size_t>(r / 2))
            TVM_FFI_THROW(RuntimeError) << "calibration gave " << got.size() << " planes, expected "
                                        << r / 2;
          std::copy(got.begin(), got.end(), out + (static_cast<std::size_t>(l) * H + h) * (r / 2));
        }
      return;
    }
    expect_dtype(a, "A", kDLFloat, 32);
    expect(a, "A", {L, H, D, D});
    expect_dtype(ch, what, kDLInt, 32);
    expect(ch, what, {L, H, r});
    float* ao = span_of<float>(a).data();
    std::int32_t* co = span_of<std::int32_t>(ch).data();
    for (int l = c.first_layer; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const kvscout::skew_plan& sp = plans[l][h];
        if (sp.A.size() != static_cast<std::size_t>(D) * D ||
            sp.channels.size() != static_cast<std::size_t>(r))
          TVM_FFI_THROW(RuntimeError) << "calibration gave a plan of " << sp.channels.size()
                                      << " channels and " << sp.A.size() << " rotation entries, "
                                      << "expected " << r << " and " << D * D;
        std::copy(sp.A.begin(), sp.A.end(), ao + (static_cast<std::size_t>(l) * H + h) * D * D);
        std::copy(sp.channels.begin(), sp.channels.end(),
                  co + (static_cast<std::size_t>(l) * H + h) * r);
      }
  };
  write(c.plans, p.r, planes, A, channels, "planes");
  write(c.correction_plans, p.correction_channels(), corr_planes, corr_A, corr_channels,
        "correction planes");
  if (!c.mass_curves.empty()) {
    expect_dtype(mass_curves, "mass_curves", kDLFloat, 64);
    expect(mass_curves, "mass_curves", {L, c.bins});
    std::copy(c.mass_curves.begin(), c.mass_curves.end(), span_of<double>(mass_curves).begin());
  }
  return c.first_layer;
#else
  (void)name, (void)fields, (void)dims, (void)theta, (void)style, (void)q, (void)k, (void)planes,
      (void)A, (void)channels, (void)corr_planes, (void)corr_A, (void)corr_channels,
      (void)mass_curves;
  TVM_FFI_THROW(RuntimeError) << "kvscout was built without Eigen: calibration is not available "
                              << "(install Eigen 3, e.g. libeigen3-dev, and reinstall)";
#endif
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(preset_named, preset_named);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(preset_budgets, preset_budgets);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(preset_layer_shares, preset_layer_shares);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(preset_calibrate, preset_calibrate);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(built_with_calibration, built_with_calibration);
