#pragma once
// The Python binding's argument checks and dispatch, shared by its translation units: a tensor's
// device, shape, contiguity and dtype, a number's range, a kvscout::error turned into ValueError,
// and the K / V element x head_dim instances the package builds.

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"

namespace ffi = tvm::ffi;

namespace kvscout_py {

// A view of no elements (int32, shape [0]) for an argument that does not apply.
inline ffi::TensorView no_tensor() {
  static std::int64_t zero = 0;
  static DLTensor none{nullptr, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, &zero, nullptr, 0};
  return ffi::TensorView(&none);
}

// ---- argument checks ---------------------------------------------------------------------------

inline bool is(DLDataType t, int code, int bits) { return t.code == code && t.bits == bits && t.lanes == 1; }

inline std::string dtype_name(DLDataType t) {
  if (is(t, kDLFloat, 64)) return "float64";
  if (is(t, kDLFloat, 32)) return "float32";
  if (is(t, kDLFloat, 16)) return "float16";
  if (is(t, kDLBfloat, 16)) return "bfloat16";
  if (is(t, kDLInt, 32)) return "int32";
  if (is(t, kDLInt, 64)) return "int64";
  if (is(t, kDLUInt, 8)) return "uint8";
  return "code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
}

inline std::string shape_of(const ffi::TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// A CPU tensor, C-contiguous, with `shape` (-1: any extent); returns it unchanged.
inline const ffi::TensorView& expect(const ffi::TensorView& t, const char* name,
                              std::initializer_list<std::int64_t> shape) {
  if (t.device().device_type != kDLCPU)
    TVM_FFI_THROW(ValueError) << name << ": a tensor on device type " << t.device().device_type
                              << ", expected a CPU tensor (this build has the host backend only)";
  std::string want = "[";
  int i = 0;
  bool ok = t.ndim() == static_cast<int>(shape.size());
  for (std::int64_t e : shape) {
    want += (i ? ", " : "") + (e < 0 ? std::string("*") : std::to_string(e));
    if (ok && e >= 0 && t.size(i) != e) ok = false;
    ++i;
  }
  want += "]";
  if (!ok) TVM_FFI_THROW(ValueError) << name << ": shape " << shape_of(t) << ", expected " << want;
  if (!t.IsContiguous())
    TVM_FFI_THROW(ValueError) << name << ": not contiguous (shape " << shape_of(t)
                              << "); pass a C-contiguous array (numpy.ascontiguousarray)";
  return t;
}

inline void expect_dtype(const ffi::TensorView& t, const char* name, int code, int bits) {
  if (!is(t.dtype(), code, bits))
    TVM_FFI_THROW(TypeError) << name << ": dtype " << dtype_name(t.dtype()) << ", expected "
                             << dtype_name(DLDataType{static_cast<std::uint8_t>(code),
                                                      static_cast<std::uint8_t>(bits), 1});
}

inline int as_int(std::int64_t v, const char* name) {
  if (v < INT32_MIN || v > INT32_MAX)
    TVM_FFI_THROW(ValueError) << name << " = " << v << " does not fit a 32-bit int";
  return static_cast<int>(v);
}

// The first element's address (the data pointer plus the byte offset).
inline char* first_byte(const ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

inline std::size_t size_bytes(const ffi::TensorView& t) {
  return static_cast<std::size_t>(t.numel()) * ((t.dtype().bits * t.dtype().lanes + 7) / 8);
}

template <class T>
kvscout::host_span<T> span_of(const ffi::TensorView& t) {
  char* p = first_byte(t);
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
    TVM_FFI_THROW(ValueError) << "a tensor's data at " << static_cast<const void*>(p)
                              << " is not aligned to its element's " << alignof(T) << " bytes";
  return {reinterpret_cast<T*>(p), static_cast<std::size_t>(t.numel())};
}

struct named_tensor {
  const char* name;
  const ffi::TensorView* tensor;
};

// Every output's bytes are apart from every other tensor's, output or input: a part reads its
// inputs after it starts writing, so an alias would change what was checked.
inline void expect_disjoint(std::initializer_list<named_tensor> outputs,
                            std::initializer_list<named_tensor> inputs) {
  const auto overlap = [](const ffi::TensorView& a, const ffi::TensorView& b) {
    const char *pa = first_byte(a), *pb = first_byte(b);
    const std::size_t na = size_bytes(a), nb = size_bytes(b);
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
  };
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (auto p = o + 1; p != outputs.end(); ++p)
      if (overlap(*o->tensor, *p->tensor))
        TVM_FFI_THROW(ValueError) << o->name << " and " << p->name
                                  << " share memory; each output needs its own";
    for (const named_tensor& i : inputs)
      if (overlap(*o->tensor, *i.tensor))
        TVM_FFI_THROW(ValueError) << "the output " << o->name << " shares memory with the input "
                                  << i.name << "; give the output its own";
  }
}

// Runs f, a kvscout::error becoming ValueError with its message.
template <class F>
auto guarded(F&& f) {
  try {
    return f();
  } catch (const kvscout::error& e) {
    TVM_FFI_THROW(ValueError) << e.message();
  } catch (const std::bad_alloc&) {
    TVM_FFI_THROW(MemoryError) << "kvscout: out of host memory";
  } catch (const ffi::Error&) {
    throw;
  } catch (const std::exception& e) {
    TVM_FFI_THROW(RuntimeError) << e.what();
  }
  __builtin_unreachable();  // each handler throws (TVM_FFI_THROW throws at the statement's end)
}

// The DLPack dtype of a K / V element type.
template <class T>
DLDataType element_dtype() {
  if constexpr (std::is_same_v<T, float>)
    return {kDLFloat, 32, 1};
  else if constexpr (std::is_same_v<T, kvscout::half>)
    return {kDLFloat, 16, 1};
  else
    return {kDLBfloat, 16, 1};
}

// The K / V element dtype Python names ("float32", "float16", "bfloat16").
inline DLDataType element_named(const std::string& name) {
  if (name == "float32") return {kDLFloat, 32, 1};
  if (name == "float16") return {kDLFloat, 16, 1};
  if (name == "bfloat16") return {kDLBfloat, 16, 1};
  TVM_FFI_THROW(TypeError) << "dtype '" << name << "', expected float32, float16 or bfloat16";
  __builtin_unreachable();  // TVM_FFI_THROW throws at the statement's end
}

// f.template operator()<T, D>() for the K / V element type of dtype `d` and head_dim D; `name`
// labels the errors.
template <class F>
void with_element(DLDataType d, const char* name, std::int64_t head_dim, F&& f) {
  const auto at_dim = [&]<class T>() {
    if (head_dim == 64)
      f.template operator()<T, 64>();
    else if (head_dim == 128)
      f.template operator()<T, 128>();
    else
      TVM_FFI_THROW(ValueError) << name << ": head_dim " << head_dim
                                << " was not built, expected 64 or 128";
  };
  if (is(d, kDLFloat, 32))
    at_dim.template operator()<float>();
  else if (is(d, kDLFloat, 16))
    at_dim.template operator()<kvscout::half>();
  else if (is(d, kDLBfloat, 16))
    at_dim.template operator()<kvscout::bfloat16>();
  else
    TVM_FFI_THROW(TypeError) << name << ": dtype " << dtype_name(d)
                             << ", expected float32, float16 or bfloat16";
}

template <class F>
void with_element(const ffi::TensorView& t, const char* name, std::int64_t head_dim, F&& f) {
  with_element(t.dtype(), name, head_dim, static_cast<F&&>(f));
}

}  // namespace kvscout_py
