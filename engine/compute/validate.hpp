#pragma once
// Argument checks shared by every backend, so that all of them reject bad input with the same
// message (which names the op, the argument and expected vs got).
#include <cstdint>

#include "engine/compute/backend.hpp"

namespace tandem::engine::compute::validate {

// Defined, on `device`, of dtype f32 (or f64 when allow_f64), with the given rank.
void tensor(const Tensor& t, const char* op, const char* arg, Device device, int rank, bool allow_f64 = false);
void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name, const char* b_name);
void same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* a_name, const char* b_name);
// Plain, f32 (or the given dtype), on device, with exactly `shape`.
void plain(const Tensor& t, const char* op, const char* arg, Device device, const Shape& shape, DType dtype);

// Full conv argument checks; returns y's shape.
Shape conv(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p, Device device);
void conv_params(const ConvParams& p);
Shape pool(const Tensor& x, const PoolParams& p, Device device);
// Checks x [N, C, ...] against gamma/beta/stat tensors of [C]; returns C.
int64_t batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Device device);
// Returns {N, in} for x flattened against w [out, in].
std::pair<int64_t, int64_t> linear(const Tensor& x, const Tensor& w, const Tensor& bias, Device device);
struct LinearDims {
  int64_t n, in, out;
};
// linear_backward_data: dy [N, out] and w [out, in] against x_shape.
LinearDims linear_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, Device device, bool allow_f64);
// linear_backward_weights: x, dy and the plain gradient outputs dw [out, in], dbias [out] (optional).
LinearDims linear_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias, Device device);
// Returns {N, K}; checks label dtype and that the batch sizes agree (label range is checked by the kernels).
std::pair<int64_t, int64_t> loss(const Tensor& logits, const Tensor& labels, Device device);
void optimizer_buffers(const Tensor& param, const Tensor& grad, const Tensor* state1, const Tensor* state2,
                       const char* op, Device device);
void sgd(const SgdParams& p);
void adam(const AdamParams& p);
void dropout_p(float p);

}  // namespace tandem::engine::compute::validate
