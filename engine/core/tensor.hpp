#pragma once
// Tensors: a shape (int64 dims), a dtype, a device and reference-counted storage from a caching
// allocator. Copying a Tensor is shallow (it shares storage); views share storage too.
//
// Layout: a tensor is either PLAIN (dense, row-major over its shape: NCHW for 4-D, [O,I,KH,KW]
// for conv weights) or carries an opaque backend Layout (e.g. oneDNN's blocked nChw16c) that
// only the backend which produced it can interpret. Read values only from plain tensors; ask the
// backend for `to_plain(t)` first. Backends guarantee that parameters, parameter gradients,
// optimizer state, losses and their gradients, and linear-layer outputs are plain.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "engine/core/allocator.hpp"
#include "engine/core/dtype.hpp"

namespace tandem {

constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;  // rank 0: a scalar with one element
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const noexcept { return rank_; }
  // Negative i counts from the end; throws kInvalidArgument when out of range.
  int64_t dim(int i) const;
  int64_t operator[](int i) const { return dim(i); }
  void set_dim(int i, int64_t v);
  int64_t numel() const noexcept;
  const int64_t* data() const noexcept { return dims_.data(); }
  std::span<const int64_t> dims() const noexcept { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::string str() const;  // "[64, 3, 32, 32]"
  friend bool operator==(const Shape& a, const Shape& b) noexcept;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

// An opaque memory layout owned by a backend. Interface: pure virtuals only.
struct Layout {
  virtual ~Layout() = default;
  virtual std::string describe() const = 0;    // for error messages, e.g. "dnnl:nChw16c"
  virtual size_t size_bytes() const = 0;       // bytes of storage the layout needs (may include padding)
  virtual bool same_as(const Layout& other) const = 0;
};

// A block of memory on one device. Frees back to its allocator when the last tensor drops it;
// a non-owning Storage (wrap()) never frees.
class Storage {
 public:
  Storage(void* data, size_t size_bytes, Device device, CachingAllocator* owner) noexcept
      : data_(data), size_bytes_(size_bytes), device_(device), owner_(owner) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const noexcept { return data_; }
  size_t size_bytes() const noexcept { return size_bytes_; }
  Device device() const noexcept { return device_; }

 private:
  void* data_;
  size_t size_bytes_;
  Device device_;
  CachingAllocator* owner_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined (defined() is false); used for "no bias" and the like

  // Uninitialised plain tensor from the device's caching allocator.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  // Plain host tensors with every element set (f32/f64/i32/i64/u8).
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32);
  // Host f32/i64/... tensor holding a copy of `values`; values.size() must equal shape.numel().
  static Tensor from_vector(const Shape& shape, std::span<const float> values);
  static Tensor from_vector(const Shape& shape, std::span<const int64_t> values);
  // Non-owning plain tensor over caller memory, which must outlive every copy of the tensor.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  // A tensor in a backend layout (for backends): storage of layout->size_bytes().
  static Tensor with_layout(const Shape& shape, DType dtype, Device device, std::shared_ptr<const Layout> layout);

  bool defined() const noexcept { return storage_ != nullptr; }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const noexcept { return shape_.numel(); }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  bool is_plain() const noexcept { return layout_ == nullptr; }
  const Layout* layout() const noexcept { return layout_.get(); }
  const std::shared_ptr<const Layout>& layout_ptr() const noexcept { return layout_; }
  // Bytes this tensor's elements occupy: numel * dtype size when plain, else the layout's size.
  size_t nbytes() const noexcept;
  size_t offset_bytes() const noexcept { return offset_bytes_; }
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  bool shares_storage_with(const Tensor& o) const noexcept { return storage_ && storage_ == o.storage_; }

  // Start of this tensor's elements (any device, any layout); nullptr when undefined.
  void* raw_data() const noexcept;
  // Typed host pointer: checks defined, host device, plain layout and that T matches dtype.
  template <typename T> T* data() const;

  // Same storage, new shape (same numel; plain only; -1 in one place is inferred).
  Tensor view(const Shape& shape) const;
  // Plain view of `shape` starting `offset_elems` elements into this plain tensor's storage
  // (e.g. one parameter inside a flat buffer). Checks the view fits.
  Tensor slice(int64_t offset_elems, const Shape& shape) const;
  // Deep host copy (plain host tensors only); fill a plain host tensor.
  Tensor clone() const;
  void fill(double value);
  // Copies a same-shape, same-dtype plain host tensor's values into this one.
  void copy_from(const Tensor& src);

  std::string str() const;  // "f32[64, 3, 32, 32] cpu" (+ " dnnl:nChw16c" when not plain)

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_;
  std::shared_ptr<const Layout> layout_;
};

// Maps a C++ element type to its DType (float, double, int32_t, int64_t, uint8_t; uint16_t = f16 bits).
template <typename T> constexpr DType dtype_of() noexcept;
template <> constexpr DType dtype_of<float>() noexcept { return DType::kF32; }
template <> constexpr DType dtype_of<double>() noexcept { return DType::kF64; }
template <> constexpr DType dtype_of<int32_t>() noexcept { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() noexcept { return DType::kI64; }
template <> constexpr DType dtype_of<uint8_t>() noexcept { return DType::kU8; }
template <> constexpr DType dtype_of<uint16_t>() noexcept { return DType::kF16; }

namespace detail {
void check_host_access(const Tensor& t, DType want);  // throws naming the tensor and the mismatch
}

template <typename T> T* Tensor::data() const {
  detail::check_host_access(*this, dtype_of<std::remove_const_t<T>>());
  return static_cast<T*>(raw_data());
}

// Throws kInvalidArgument "<what>: expected <shape>, got <shape>" when shapes differ.
void check_shape(const Tensor& t, const Shape& expected, std::string_view what);
void check_dtype(const Tensor& t, DType expected, std::string_view what);

}  // namespace tandem
