#pragma once
// Launchers for the CUDA backend's own kernels (everything except convolution, which is cuDNN,
// and the linear layers' GEMMs, which are cuBLAS). Plain pointers and sizes, NCHW layouts; all
// launches go to `s` and return without waiting. Declared without CUDA headers so that the
// host-compiled backend can include this.
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace tandem::engine::compute::cuda::kernels {

void fill(float* x, int64_t n, float v, cudaStream_t s);
// bf16 (stored as uint16_t, round to nearest even) to and from f32; from_bf16 adds into y when accumulate.
void to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);
void from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate, cudaStream_t s);
// IEEE half likewise (__float2half_rn: round to nearest even, subnormals, overflow to inf).
void to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);
void from_f16(const uint16_t* x, float* y, int64_t n, bool accumulate, cudaStream_t s);
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t s);
void scale(float* x, int64_t n, float alpha, cudaStream_t s);
void axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s);
// *out (device double, zeroed here) = sum x^2
void sum_squares(const float* x, int64_t n, double* out, cudaStream_t s);

// hi = +inf for ReLU, 6 for ReLU6
void clamp_forward(const float* x, float* y, int64_t n, float hi, cudaStream_t s);
void clamp_backward(const float* dy, const float* y, float* dx, int64_t n, float hi, cudaStream_t s);

// y[n, c, i] += b[c] over [N, C, S]; db[c] (=|+=) sum of dy[n, c, i]
void bias_add(float* y, const float* b, int64_t N, int64_t C, int64_t S, cudaStream_t s);
void bias_grad(const float* dy, float* db, int64_t N, int64_t C, int64_t S, bool accumulate, cudaStream_t s);

// Batch norm over [N, C, S] (N * C * S < 2^31, else std::length_error): statistics (biased variance),
// normalisation, running update, and backward. acc2c: device scratch of 2C doubles (zeroed here).
void bn_stats(const float* x, float* mean, float* var, double* acc2c, int64_t N, int64_t C, int64_t S,
              cudaStream_t s);
void bn_apply(const float* x, float* y, const float* gamma, const float* beta, const float* mean, const float* var,
              float eps, int64_t N, int64_t C, int64_t S, cudaStream_t s);
void bn_running_update(float* rm, float* rv, const float* mean, const float* var, int64_t C, float momentum,
                       float unbias, cudaStream_t s);
// dgamma/dbeta (= or +=) and dx
void bn_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* var, float eps,
                 float* dx, float* dgamma, float* dbeta, bool accumulate, float* scratch2c, double* acc2c, int64_t N,
                 int64_t C, int64_t S, cudaStream_t s);

// Pooling over planes [NC, H, W] -> [NC, OH, OW]; max records the in-plane argmax in idx.
void pool_forward(bool max, const float* x, float* y, int32_t* idx, int64_t NC, int64_t H, int64_t W, int64_t OH,
                  int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                  bool include_pad, cudaStream_t s);
void pool_backward(bool max, const float* dy, const int32_t* idx, float* dx, int64_t NC, int64_t H, int64_t W,
                   int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                   bool include_pad, cudaStream_t s);
void gap_forward(const float* x, float* y, int64_t NC, int64_t S, cudaStream_t s);
void gap_backward(const float* dy, float* dx, int64_t NC, int64_t S, cudaStream_t s);

// Per row: loss[n] = lse - x[label], correct[n] = argmax == label, dlogits (optional) =
// (softmax - onehot) / norm; *bad_row = the first row whose label is out of range (or -1, set here).
void softmax_cross_entropy(const float* logits, const void* labels, bool labels_i32, int64_t N, int64_t K, double norm,
                           float* dlogits, double* loss, int32_t* correct, int64_t* bad_row, cudaStream_t s);

void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t n, uint64_t seed, uint32_t threshold24,
                     float scale, cudaStream_t s);
void dropout_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float scale, cudaStream_t s);

void sgd(float* w, const float* g, float* buf, int64_t n, float lr, float wd, float momentum, float damp, bool first,
         bool nesterov, cudaStream_t s);
void adam(float* w, const float* g, float* m, float* v, int64_t n, float step, float inv_sqrt_bc2, float b1, float b2,
          float eps, float l2, float decay, cudaStream_t s);

}  // namespace tandem::engine::compute::cuda::kernels
