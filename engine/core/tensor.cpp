#include "engine/core/tensor.hpp"

#include <algorithm>
#include <cstring>

#include "engine/core/error.hpp"

namespace tandem {

// ---------------------------------------------------------------- Shape

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  TANDEM_REQUIRE(dims.size() <= static_cast<size_t>(kMaxDims), "shape has {} dims; at most {} are supported",
                 dims.size(), kMaxDims);
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    // -1 is allowed here so that view() can infer one dimension; numel() rejects it elsewhere.
    TANDEM_REQUIRE(dims[i] >= -1, "shape dim {} is {}; dims must be >= 0", i, dims[i]);
    dims_[i] = dims[i];
  }
}

int64_t Shape::dim(int i) const {
  const int j = i < 0 ? i + rank_ : i;
  TANDEM_REQUIRE(j >= 0 && j < rank_, "dim index {} out of range for shape {}", i, str());
  return dims_[j];
}

void Shape::set_dim(int i, int64_t v) {
  const int j = i < 0 ? i + rank_ : i;
  TANDEM_REQUIRE(j >= 0 && j < rank_, "dim index {} out of range for shape {}", i, str());
  TANDEM_REQUIRE(v >= 0, "shape dim {} set to {}; dims must be >= 0", i, v);
  dims_[j] = v;
}

int64_t Shape::numel() const noexcept {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) noexcept {
  return a.rank_ == b.rank_ && std::equal(a.dims_.begin(), a.dims_.begin() + a.rank_, b.dims_.begin());
}

// ---------------------------------------------------------------- Storage / Tensor

Storage::~Storage() {
  if (owner_ != nullptr) owner_->deallocate(data_, size_bytes_);
}

namespace {

void check_concrete(const Shape& s) {
  for (int64_t d : s.dims()) TANDEM_REQUIRE(d >= 0, "shape {} has a negative dim", s.str());
}

std::shared_ptr<Storage> allocate_storage(size_t bytes, Device device) {
  CachingAllocator& a = allocator_for(device);
  void* p = a.allocate(bytes);
  try {
    return std::make_shared<Storage>(p, bytes, device, &a);
  } catch (...) {
    a.deallocate(p, bytes);
    throw;
  }
}

template <typename T> void fill_typed(void* p, int64_t n, double v) {
  std::fill_n(static_cast<T*>(p), n, static_cast<T>(v));
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_concrete(shape);
  TANDEM_REQUIRE(dtype_valid(static_cast<int32_t>(dtype)), "invalid dtype {}", static_cast<int32_t>(dtype));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = allocate_storage(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, std::span<const float> values) {
  TANDEM_REQUIRE(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: {} values for shape {} ({} elements)",
                 values.size(), shape.str(), shape.numel());
  Tensor t = empty(shape, DType::kF32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, std::span<const int64_t> values) {
  TANDEM_REQUIRE(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: {} values for shape {} ({} elements)",
                 values.size(), shape.str(), shape.numel());
  Tensor t = empty(shape, DType::kI64);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  check_concrete(shape);
  TANDEM_REQUIRE(data != nullptr || shape.numel() == 0, "wrap: null data for shape {}", shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape.numel()) * dtype_size(dtype), device, nullptr);
  return t;
}

Tensor Tensor::with_layout(const Shape& shape, DType dtype, Device device, std::shared_ptr<const Layout> layout) {
  check_concrete(shape);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  const size_t bytes = layout ? layout->size_bytes() : static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  t.layout_ = std::move(layout);
  t.storage_ = allocate_storage(bytes, device);
  return t;
}

size_t Tensor::nbytes() const noexcept {
  if (layout_) return layout_->size_bytes();
  return static_cast<size_t>(shape_.numel()) * dtype_size(dtype_);
}

void* Tensor::raw_data() const noexcept {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::view(const Shape& shape) const {
  TANDEM_REQUIRE(defined(), "view of an undefined tensor");
  TANDEM_REQUIRE(is_plain(), "view {} of {}: the tensor is in backend layout {}; call the backend's to_plain first",
                 shape.str(), str(), layout_->describe());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (s.dim(i) == -1) {
      TANDEM_REQUIRE(infer < 0, "view {}: more than one -1", shape.str());
      infer = i;
    } else {
      known *= s.dim(i);
    }
  }
  if (infer >= 0) {
    TANDEM_REQUIRE(known > 0 && numel() % known == 0, "view {} of {}: cannot infer the -1 dim", shape.str(), str());
    s.set_dim(infer, numel() / known);
  }
  TANDEM_REQUIRE(s.numel() == numel(), "view {} of {}: element counts differ ({} vs {})", shape.str(), str(),
                 s.numel(), numel());
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice(int64_t offset_elems, const Shape& shape) const {
  TANDEM_REQUIRE(defined() && is_plain(), "slice of {}: needs a defined plain tensor", str());
  check_concrete(shape);
  TANDEM_REQUIRE(offset_elems >= 0 && offset_elems + shape.numel() <= numel(),
                 "slice {} at element {} does not fit in {} ({} elements)", shape.str(), offset_elems, str(), numel());
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(offset_elems) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone() const {
  detail::check_host_access(*this, dtype_);
  Tensor t = empty(shape_, dtype_);
  std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

void Tensor::fill(double value) {
  detail::check_host_access(*this, dtype_);
  void* p = raw_data();
  const int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: fill_typed<float>(p, n, value); break;
    case DType::kF64: fill_typed<double>(p, n, value); break;
    case DType::kI32: fill_typed<int32_t>(p, n, value); break;
    case DType::kI64: fill_typed<int64_t>(p, n, value); break;
    case DType::kU8: fill_typed<uint8_t>(p, n, value); break;
    case DType::kF16: std::fill_n(static_cast<uint16_t*>(p), n, float_to_half(static_cast<float>(value))); break;
    case DType::kBF16: std::fill_n(static_cast<uint16_t*>(p), n, float_to_bf16(static_cast<float>(value))); break;
  }
}

void Tensor::copy_from(const Tensor& src) {
  detail::check_host_access(*this, dtype_);
  detail::check_host_access(src, dtype_);
  check_shape(src, shape_, "copy_from source");
  std::memmove(raw_data(), src.raw_data(), nbytes());
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  std::string s = fmt::format("{}{} {}", dtype_name(dtype_), shape_.str(), device_.str());
  if (layout_) s += " " + layout_->describe();
  return s;
}

namespace detail {
void check_host_access(const Tensor& t, DType want) {
  TANDEM_REQUIRE(t.defined(), "access to an undefined tensor");
  TANDEM_REQUIRE(t.device().is_cpu(), "host access to {}: the tensor lives on {}; copy it to the host first", t.str(),
                 t.device().str());
  TANDEM_REQUIRE(t.is_plain(), "host access to {}: backend layout {}; call the backend's to_plain first", t.str(),
                 t.layout()->describe());
  const bool ok = t.dtype() == want || (want == DType::kF16 && t.dtype() == DType::kBF16);
  TANDEM_REQUIRE(ok, "tensor {} accessed as {}", t.str(), dtype_name(want));
}
}  // namespace detail

void check_shape(const Tensor& t, const Shape& expected, std::string_view what) {
  TANDEM_REQUIRE(t.defined(), "{}: undefined tensor, expected shape {}", what, expected.str());
  TANDEM_REQUIRE(t.shape() == expected, "{}: expected shape {}, got {}", what, expected.str(), t.shape().str());
}

void check_dtype(const Tensor& t, DType expected, std::string_view what) {
  TANDEM_REQUIRE(t.defined(), "{}: undefined tensor, expected dtype {}", what, dtype_name(expected));
  TANDEM_REQUIRE(t.dtype() == expected, "{}: expected dtype {}, got {}", what, dtype_name(expected),
                 dtype_name(t.dtype()));
}

}  // namespace tandem
