// Binding-side validation shared by every family's binding (the second line behind the
// Python layer, elman/core/validate.py): device, dtype, exact shape, contiguity, alignment,
// empty dimensions. Bad input raises ValueError (TypeError for a dtype) before any launch.
//
// Messages are built as std::string (std::to_string, shape() below) and thrown as pybind11
// exceptions: streaming a 64-bit integer or sizes() into TORCH_CHECK's message instantiates
// std::ostream insertions in the module, and on the H100 host that crashed the process with a
// segmentation fault instead of raising.
#pragma once

#include <torch/extension.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace elman {
namespace check {

inline std::string num(int64_t v) { return std::to_string(v); }

template <class Sizes>
std::string shape(const Sizes& sizes) {
  std::string s = "[";
  bool first = true;
  for (const int64_t v : sizes) {
    s += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return s + "]";
}
inline std::string shape(std::initializer_list<int64_t> sizes) {
  return shape(std::vector<int64_t>(sizes));
}

[[noreturn]] inline void value_error(const std::string& msg) { throw pybind11::value_error(msg); }
[[noreturn]] inline void type_error(const std::string& msg) { throw pybind11::type_error(msg); }

inline void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}

inline std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

// The tensors of one call: all CUDA, on one device, of one dtype, contiguous, each of an exact
// shape.
struct Tensors {
  at::Device device;
  at::ScalarType dtype;

  void operator()(const at::Tensor& t, const char* name, const std::vector<int64_t>& expected) const {
    if (!t.defined()) value_error(std::string(name) + " is missing (got an undefined tensor)");
    if (!t.is_cuda())
      value_error(std::string(name) + " must be a CUDA tensor, got one on " + t.device().str());
    if (t.device() != device)
      value_error(std::string(name) + " is on " + t.device().str() +
                  " but the other inputs are on " + device.str());
    if (t.scalar_type() != dtype)
      type_error(std::string(name) + " has dtype " + dtype_name(t.scalar_type()) + "; expected " +
                 dtype_name(dtype) + " (all tensors of one call share a dtype)");
    const auto sizes = t.sizes();
    if (std::vector<int64_t>(sizes.begin(), sizes.end()) != expected)
      value_error(std::string(name) + " has shape " + shape(sizes) + "; expected " + shape(expected));
    if (!t.is_contiguous())
      value_error(std::string(name) + " must be contiguous (call .contiguous() first)");
  }
};

// The first tensor of a call fixes device and dtype: it must be CUDA, of `rank` dimensions,
// none of them empty, of an allowed dtype.
inline Tensors leading(const at::Tensor& t, const char* name, int64_t rank, const char* dims,
                       std::initializer_list<at::ScalarType> allowed) {
  if (!t.defined()) value_error(std::string(name) + " is missing (got an undefined tensor)");
  if (!t.is_cuda())
    value_error(std::string(name) + " must be a CUDA tensor, got one on " + t.device().str());
  if (t.dim() != rank)
    value_error(std::string(name) + " must be " + dims + ", got " + num(t.dim()) +
                " dimensions (shape " + shape(t.sizes()) + ")");
  for (int64_t d = 0; d < rank; ++d)
    if (t.size(d) < 1)
      value_error(std::string(name) + " has an empty dimension: shape " + shape(t.sizes()) + " (" +
                  dims + " must all be >= 1)");
  bool ok = false;
  std::string names;
  for (const auto a : allowed) {
    ok = ok || t.scalar_type() == a;
    names += (names.empty() ? "" : " or ") + dtype_name(a);
  }
  if (!ok) type_error(std::string(name) + " has dtype " + dtype_name(t.scalar_type()) + "; the kernels take " + names);
  return Tensors{t.device(), t.scalar_type()};
}

// Kernels that stage inputs with 16-byte copies (cp.async) fault on a view that starts at an
// address not a multiple of 16, taking the CUDA context with it.
inline void aligned16(const at::Tensor& t, const char* name, const char* instead) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
    value_error(std::string(name) + " must start at a 16-byte aligned address (it is a view with " +
                "storage offset " + num(t.storage_offset()) + "); pass a copy (.clone())" + instead);
}

}  // namespace check
}  // namespace elman
