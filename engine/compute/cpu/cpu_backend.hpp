#pragma once
// The oneDNN CPU backend (internal header shared by the cpu/*.cpp files).
//
// Layouts: primitives are created with format_tag::any, so oneDNN picks its preferred blocked
// layout (nChw16c on AVX-512) and activations stay in it from layer to layer; such tensors carry
// a DnnlLayout. Inputs in another layout are reordered on entry, outputs that must be plain
// (parameter gradients, linear outputs, pooled [N, C]) are reordered on exit. Parameters stay
// plain: weights are reordered into a per-plan buffer at each call.
//
// Plans: every primitive descriptor is created once per shape (and input layout) and kept in
// per-instance maps; backward primitives use the forward descriptor as their hint.
#include <memory>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/compute/backend.hpp"
#include "engine/core/cpu_isa.hpp"

namespace tandem::engine::compute::cpu {

using dnnl::memory;

class DnnlLayout final : public Layout {
 public:
  explicit DnnlLayout(const memory::desc& md) : md_(md) {}
  std::string describe() const override;
  size_t size_bytes() const override { return md_.get_size(); }
  bool same_as(const Layout& other) const override;
  const memory::desc& md() const { return md_; }

 private:
  memory::desc md_;
};

// A short, unique text for a memory descriptor: dims, strides and inner blocks (plan keys).
std::string md_key(const memory::desc& md);
memory::desc plain_md(const Shape& s, memory::data_type dt = memory::data_type::f32);
// 4-D s stored as nchw (lanes 1) or channel-blocked nChw8c / nChw16c (lanes 8 / 16), and the
// inverse: md's lanes when it is one of those three for s, else 0.
memory::desc channel_blocked_md(const Shape& s, int64_t lanes, memory::data_type dt = memory::data_type::f32);
int64_t channel_block_lanes(const memory::desc& md, const Shape& s, memory::data_type dt = memory::data_type::f32);

// Applies settings::current()'s TANDEM_CPU_MAX_ISA to oneDNN (dnnl_set_max_cpu_isa: process-wide, and only
// before the process's first primitive; avx512 caps oneDNN at avx512_core_amx, avx2 at avx2, sse41 at sse41)
// and returns the variant of Tandem's own kernels under it (variant_cpu_isa). kUnsupported naming the
// setting when oneDNN already runs above the cap in this process. Every CpuBackend calls it first.
CpuIsa apply_cpu_isa_cap();
// oneDNN's effective ISA in this process ("avx2", "avx512_core_bf16", ...). Fixes it: a later cap fails.
const char* onednn_isa_name();

struct ConvPlan;
struct WinogradPlan;
struct WinogradWeights;
namespace winograd {
struct Geometry;
}
// A 3x3 stride-1 convolution's algorithm (TANDEM_CPU_WINOGRAD, cpu_conv.cpp's conv_algo): oneDNN's
// direct kernels, oneDNN's Winograd (AVX-512 only in oneDNN 2.6), or Tandem's (cpu_winograd.hpp).
enum class ConvAlgo { kDirect, kOnednnWinograd, kTandemWinograd };
std::string_view conv_algo_name(ConvAlgo a) noexcept;
struct NormPlan;
struct EltwisePlan;
struct PoolPlan;
struct MatmulPlan;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  void set_num_threads(int n) override;
  int num_threads() const override { return threads_; }
  // The variant of cpu_kernels.hpp's kernels this backend runs (apply_cpu_isa_cap at construction).
  CpuIsa kernel_isa() const { return isa_; }
  void synchronize() override {}

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor zeros(const Shape& shape, DType dtype) override;
  Tensor to_plain(const Tensor& x) override;
  void copy(const Tensor& src, Tensor& dst) override;
  Tensor to_host(const Tensor& x) override { return to_plain(x); }

  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override;
  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override;
  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override;

  BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               Tensor& running_mean, Tensor& running_var,
                                               const BatchNormParams& p) override;
  Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var, float eps) override;
  Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                             const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) override;

  Tensor activation_forward(Activation a, const Tensor& x, bool in_place) override;
  Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) override;

  PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) override;
  Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, const Shape& x_shape,
                       const PoolParams& p) override;
  Tensor global_avg_pool_forward(const Tensor& x) override;
  Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) override;

  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) override;
  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) override;
  void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, bool accumulate) override;

  DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) override;
  Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) override;

  LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   int64_t normalizer) override;

  Tensor add(const Tensor& a, const Tensor& b) override;
  void add_inplace(Tensor& a, const Tensor& b) override;
  void scale(Tensor& x, float alpha) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void fill(Tensor& x, float value) override;
  double sum_squares(const Tensor& x) override;

  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) override;
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) override;

  // The algorithm TANDEM_CPU_WINOGRAD's value `mode` (auto, on, off; 1 and 0 are auto and off) picks
  // for a convolution of these shapes under a backend whose kernels run `isa` (oneDNN's ISA follows
  // the same cap). Pure: the tests check every mode and ISA with it.
  static ConvAlgo conv_algo(std::string_view mode, CpuIsa isa, const Shape& x, const Shape& w, const ConvParams& p);
  // What this backend's plan for the convolution runs (TANDEM_CPU_WINOGRAD as it was when the
  // backend was made) (the plan is made now if it is not yet).
  ConvAlgo conv_algo_of(const Shape& x, const Shape& w, bool bias, const ConvParams& p);
  // Tandem's Winograd weight transforms so far (winograd_weights): made, and served from the cache; the
  // cache's weight tensors and bytes now.
  struct WinogradCacheStats {
    int64_t transforms = 0, hits = 0, entries = 0, bytes = 0;
  };
  WinogradCacheStats winograd_cache_stats() const;

  // ---- helpers for the cpu/*.cpp files ----
  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }
  // The descriptor of t's storage: its DnnlLayout, or the plain one for its shape.
  memory::desc md_of(const Tensor& t) const;
  memory mem(const Tensor& t, const memory::desc& md) { return memory(md, engine_, t.raw_data()); }
  memory mem(const Tensor& t) { return mem(t, md_of(t)); }
  // A new tensor of `shape` stored as `md` (plain when md is the plain layout).
  Tensor alloc(const memory::desc& md, const Shape& shape, DType dtype = DType::kF32);
  // t itself when already stored as `md`, else a reordered copy.
  Tensor as_layout(const Tensor& t, const memory::desc& md);
  void reorder(const Tensor& src, const memory::desc& src_md, const Tensor& dst, const memory::desc& dst_md);
  // dst = src or dst += src, where src is stored as src_md and dst (plain) as dst_md (same dims).
  void store_param_grad(const Tensor& src, const memory::desc& src_md, Tensor& dst, const memory::desc& dst_md,
                        bool accumulate);
  // A matmul primitive for these descriptors (c = a . b, or c += a . b), cached by descriptors.
  MatmulPlan& matmul_md(const memory::desc& a, const memory::desc& b, const memory::desc& bias,
                        const memory::desc& c, bool accumulate);
  // Executes a primitive on the calling thread with this backend's thread count (OpenMP's
  // setting is per thread, and the caller may not be the thread that created the backend).
  void run(const dnnl::primitive& p, const std::unordered_map<int, memory>& args, const char* what);
  // Elementwise kernels over n floats, parallel above a size threshold.
  void add_raw(float* out, const float* a, const float* b, int64_t n);

 private:
  // Convolutions with tiny output planes run as im2col + matmul (cpu_gemm_conv.cpp): oneDNN's
  // direct kernels are slow there and the matmul needs no weight reorders.
  static bool gemm_conv(const Shape& y, const ConvParams& p);
  Tensor gemm_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p, const Shape& ys);
  Tensor gemm_conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p);
  void gemm_conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                                  bool accumulate);
  // Weight gradients by cpu_kernels.hpp's direct kernel when it suits the shapes and layouts;
  // false when oneDNN should do it.
  bool direct_conv_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                           bool accumulate);
  // Tandem's Winograd forward (or backward data, flip set) of one plan's geometry (cpu_conv.cpp).
  Tensor winograd_run(const Tensor& x, const Tensor& w, const Tensor& bias, const winograd::Geometry& g, bool flip,
                      const Shape& ys);
  // w's Winograd transform for g (flip: backward data). A weight version (w's exact bytes) is transformed for
  // each call of its first two in a direction; from the third on the transform is kept until w's bytes change,
  // so training (one forward and one backward per version) keeps nothing, while evaluation, inference and
  // several micro-batches or accumulated gradients per step transform each version at most three times.
  Tensor winograd_weights(const Tensor& w, const winograd::Geometry& g, bool flip);
  ConvPlan& conv_plan(const Shape& x, const Shape& w, bool bias, const ConvParams& p);
  PoolPlan& pool_plan(PoolKind kind, const Shape& x, const memory::desc* src_md, const PoolParams& p);
  MatmulPlan& matmul_plan(int64_t m, int64_t k, int64_t n, int which, bool bias, bool accumulate);
  NormPlan& norm_plan(const memory::desc& md, float eps);
  EltwisePlan& eltwise_plan(Activation a, const memory::desc& md);

  int threads_;
  CpuIsa isa_;
  std::string winograd_mode_;  // TANDEM_CPU_WINOGRAD when the backend was made
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<std::string, std::unique_ptr<ConvPlan>> conv_plans_;
  std::unordered_map<std::string, std::unique_ptr<PoolPlan>> pool_plans_;
  std::unordered_map<std::string, PoolPlan*> last_pool_plan_;  // by shape and params, for backward
  std::unordered_map<std::string, std::unique_ptr<MatmulPlan>> matmul_plans_;
  std::unordered_map<std::string, std::unique_ptr<NormPlan>> norm_plans_;
  std::unordered_map<std::string, std::unique_ptr<EltwisePlan>> eltwise_plans_;
  std::unordered_map<std::string, std::unique_ptr<dnnl::reorder>> reorders_;
  // By the weights' address; entries are checked against their bytes on every use (WinogradWeights).
  std::unordered_map<const void*, std::unique_ptr<WinogradWeights>> wino_weights_;
  uint64_t wino_calls_ = 0;
  int64_t wino_bytes_ = 0;  // sum of the entries' bytes()
  WinogradCacheStats wino_stats_;
};

}  // namespace tandem::engine::compute::cpu
