// The CUDA backend: cuDNN convolutions, cuBLAS GEMMs for linear layers, own kernels for the rest
// (engine/compute/cuda/kernels.cu). Tensors are plain NCHW in device memory from a per-device
// caching allocator. All work goes to the device's legacy default stream, which orders it
// against every other backend on the device, so a block freed to the cache can be handed out
// again at once.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/compute/backend.hpp"
#include "engine/compute/cuda/cuda_libs.hpp"
#include "engine/compute/cuda/kernels.hpp"
#include "engine/compute/dropout_mask.hpp"
#include "engine/compute/fp16_math.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::compute {
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
}

namespace tandem::engine::compute::cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) TANDEM_THROW(Status::kBackend, "CUDA {} failed: {}", what, cudaGetErrorString(e));
}
void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

void* open_library(const std::string& name) {
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    TANDEM_THROW(Status::kUnsupported, "cuda backend: cannot load {}: {}", name, err ? err : "unknown error");
  }
  return h;
}

template <typename Fn> void load_symbol(void* lib, const char* lib_name, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  TANDEM_CHECK(out != nullptr, Status::kUnsupported, "cuda backend: {} lacks {}", lib_name, name);
}

// ---------------------------------------------------------------- device memory

class CudaRaw final : public RawAllocator {
 public:
  explicit CudaRaw(int device) : device_(device) {}
  void* allocate(size_t bytes) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      TANDEM_THROW(Status::kOutOfMemory, "cudaMalloc of {} bytes on cuda:{} failed: {}", bytes, device_,
                   cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { cudaFree(p); }

 private:
  int device_;
};

constexpr int kMaxDevices = 64;
std::mutex g_alloc_mu;
std::array<CachingAllocator*, kMaxDevices> g_allocators{};  // never freed: tensors may outlive backends

CachingAllocator* device_allocator(int32_t index) {
  if (index < 0 || index >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  if (g_allocators[index] == nullptr) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || index >= count) {
      cudaGetLastError();
      return nullptr;
    }
    g_allocators[index] = new CachingAllocator(Device::cuda(index), std::make_unique<CudaRaw>(index));
  }
  return g_allocators[index];
}

// ---------------------------------------------------------------- this process's device memory (NVML)

// NVML, the driver's management library (libnvidia-ml.so.1, installed with the driver), loaded on first use for the
// per-process figure nvidia-smi shows. The toolkit ships no nvml.h: the three calls and the process record of the v3
// query are declared here from NVML's reference (return 0 = success, 7 = the array was too small).
struct NvmlProcess {
  unsigned int pid;
  unsigned long long used_bytes;  // ULLONG_MAX: not available
  unsigned int gpu_instance, compute_instance;
};
struct Nvml {
  int (*init)() = nullptr;                                        // nvmlInit_v2
  int (*by_uuid)(const char*, void**) = nullptr;                  // nvmlDeviceGetHandleByUUID
  int (*processes)(void*, unsigned int*, NvmlProcess*) = nullptr;  // nvmlDeviceGetComputeRunningProcesses_v3
};

const Nvml* nvml() noexcept {
  static const Nvml* lib = []() -> const Nvml* {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return nullptr;
    static Nvml n;
    n.init = reinterpret_cast<int (*)()>(dlsym(h, "nvmlInit_v2"));
    n.by_uuid = reinterpret_cast<int (*)(const char*, void**)>(dlsym(h, "nvmlDeviceGetHandleByUUID"));
    n.processes = reinterpret_cast<int (*)(void*, unsigned int*, NvmlProcess*)>(
        dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3"));
    if (n.init == nullptr || n.by_uuid == nullptr || n.processes == nullptr || n.init() != 0) return nullptr;
    return &n;  // the handle stays open for the process's life
  }();
  return lib;
}

// Bytes this process holds on cuda:index by NVML's count; 0 when NVML, the device or the process record is missing.
double process_memory_bytes(int32_t index) noexcept {
  const Nvml* n = nvml();
  cudaDeviceProp prop{};
  if (n == nullptr || cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char uuid[48];
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  void* dev = nullptr;
  if (n->by_uuid(uuid, &dev) != 0) return 0;
  std::array<NvmlProcess, 256> ps{};
  unsigned int count = static_cast<unsigned int>(ps.size());
  if (n->processes(dev, &count, ps.data()) != 0) return 0;  // 7: more than 256 processes on one GPU
  const unsigned int self = static_cast<unsigned int>(getpid());
  for (unsigned int i = 0; i < count && i < ps.size(); ++i) {
    if (ps[i].pid == self && ps[i].used_bytes != ~0ULL) return static_cast<double>(ps[i].used_bytes);
  }
  return 0;
}

// ---------------------------------------------------------------- convolution plans

struct ConvPlan {
  const CudaLibs* L = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t ws_fwd = 0, ws_data = 0, ws_filter = 0;
  bool half = false;  // 16-bit math for this convolution (half_math_for_conv: grouped ones stay f32)
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    if (!L) return;
    if (x) L->cudnnDestroyTensorDescriptor(x);
    if (y) L->cudnnDestroyTensorDescriptor(y);
    if (w) L->cudnnDestroyFilterDescriptor(w);
    if (conv) L->cudnnDestroyConvolutionDescriptor(conv);
  }
};

constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

int as_int(int64_t v, const char* what) {
  TANDEM_REQUIRE(v >= 0 && v <= INT32_MAX, "cuda backend: {} {} does not fit cuDNN's int", what, v);
  return static_cast<int>(v);
}

// ---------------------------------------------------------------- the backend

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : dev_(options.device_index) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      TANDEM_THROW(Status::kUnsupported, "cuda backend unavailable: {} (no usable NVIDIA GPU and driver here)",
                   cudaGetErrorString(e));
    }
    TANDEM_CHECK(count > 0, Status::kUnsupported, "cuda backend unavailable: no CUDA device");
    TANDEM_REQUIRE(dev_ >= 0 && dev_ < count, "cuda backend: device index {} out of range ({} devices)", dev_, count);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, dev_), "cudaGetDeviceProperties");
    TANDEM_CHECK(prop.major * 10 + prop.minor >= 75, Status::kUnsupported,
                 "cuda backend: {} has compute capability {}.{}; this build needs 7.5 or newer", prop.name, prop.major,
                 prop.minor);
    check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
    L_ = &CudaLibs::get();
    register_device_allocator(Device::Kind::kCuda, &device_allocator);
    register_device_memory_probe(Device::Kind::kCuda, &process_memory_bytes);
    TANDEM_CHECK(L_->cudnnCreate(&dnn_) == CUDNN_STATUS_SUCCESS, Status::kBackend, "cudnnCreate failed on cuda:{}", dev_);
    if (L_->cublasCreate_v2(&blas_) != CUBLAS_STATUS_SUCCESS) {
      L_->cudnnDestroy(dnn_);
      TANDEM_THROW(Status::kBackend, "cublasCreate failed on cuda:{}", dev_);
    }
    // TF32 tensor cores change results in the 3rd decimal; opt in with TANDEM_CUDA_ALLOW_TF32=1 (convolutions and
    // GEMMs alike, as PyTorch's two allow_tf32 switches together).
    allow_tf32_ = settings::current()->flag("TANDEM_CUDA_ALLOW_TF32").value_or(false);
    if (allow_tf32_) L_->cublasSetMathMode(blas_, CUBLAS_TF32_TENSOR_OP_MATH);
    // bf16 / fp16 math: convolutions and GEMMs take their inputs rounded to bf16 (8-bit mantissa) or IEEE half
    // (11-bit, range +-65504) on the tensor cores and accumulate in f32; every tensor between layers, the weights
    // and the optimizer state stay f32. bf16 is the trade of PyTorch's float32_matmul_precision "medium", applied
    // to convolutions too; fp16's narrow range needs loss scaling (the trainer's, engine/train/loss_scaler.hpp).
    // The host backends emulate fp16 math bit for bit in their operands (TANDEM_CPU_MATH=fp16, fp16_math.hpp).
    const std::string math = settings::current()->text("TANDEM_CUDA_MATH").value_or("f32");
    half_ = math == "bf16" ? Half::kBF16 : math == "fp16" ? Half::kF16 : Half::kNone;
    TANDEM_CHECK(half_ != Half::kBF16 || prop.major >= 8, Status::kUnsupported,
                 "cuda backend: TANDEM_CUDA_MATH=bf16 needs bf16 tensor cores (compute capability 8.0 or newer); {} "
                 "has {}.{}", prop.name, prop.major, prop.minor);
    TANDEM_CHECK(half_ != Half::kF16 || prop.major >= 7, Status::kUnsupported,
                 "cuda backend: TANDEM_CUDA_MATH=fp16 needs fp16 tensor cores (compute capability 7.0 or newer); {} "
                 "has {}.{}", prop.name, prop.major, prop.minor);
  }

  ~CudaBackend() override {
    conv_plans_.clear();
    if (blas_) L_->cublasDestroy_v2(blas_);
    if (dnn_) L_->cudnnDestroy(dnn_);
  }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(dev_); }
  void set_num_threads(int n) override { TANDEM_REQUIRE(n >= 1, "set_num_threads: {} must be >= 1", n); }
  int num_threads() const override { return 1; }
  void synchronize() override {
    on_device();
    check_cuda(cudaDeviceSynchronize(), "synchronize");
  }

  // ---- memory ----
  Tensor empty(const Shape& shape, DType dtype) override {
    on_device();
    return Tensor::empty(shape, dtype, device());
  }
  Tensor zeros(const Shape& shape, DType dtype) override {
    Tensor t = empty(shape, dtype);
    check_cuda(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), stream_), "cudaMemset");
    return t;
  }
  Tensor to_plain(const Tensor& x) override {
    TANDEM_REQUIRE(x.defined() && x.is_plain(), "to_plain (cuda): {} must be a defined plain tensor", x.str());
    if (x.device() == device()) return x;
    Tensor out = empty(x.shape(), x.dtype());
    copy(x, out);
    return out;
  }
  void copy(const Tensor& src, Tensor& dst) override {
    TANDEM_REQUIRE(src.defined() && dst.defined() && src.is_plain() && dst.is_plain(),
                   "copy (cuda): needs defined plain tensors, got {} and {}", src.str(), dst.str());
    TANDEM_REQUIRE(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy (cuda): {} into {}: shape or dtype differ",
                   src.str(), dst.str());
    for (const Tensor* t : {&src, static_cast<const Tensor*>(&dst)})
      TANDEM_REQUIRE(t->device().is_cpu() || t->device() == device(), "copy (cuda:{}): tensor {} is on another device",
                     dev_, t->str());
    on_device();
    const cudaMemcpyKind kind = src.device().is_cpu()
                                    ? (dst.device().is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                    : (dst.device().is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    check_cuda(cudaMemcpy(dst.raw_data(), src.raw_data(), src.nbytes(), kind), "cudaMemcpy");
  }
  Tensor to_host(const Tensor& x) override {
    TANDEM_REQUIRE(x.defined() && x.is_plain(), "to_host (cuda): {} must be a defined plain tensor", x.str());
    if (x.device().is_cpu()) return x;
    Tensor h = Tensor::empty(x.shape(), x.dtype());
    copy(x, h);
    return h;
  }

  // ---- convolution ----
  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override {
    const Shape ys = validate::conv(x, w, bias, p, device());
    require_f32(x, "conv_forward");
    ConvPlan& plan = conv_plan(x.shape(), w.shape(), p);
    Tensor y = empty(ys, DType::kF32);
    Tensor ws = workspace(plan.ws_fwd);
    const float one = 1.0f, zero = 0.0f;
    const Tensor xm = math_input(x, plan.half), wm = math_input(w, plan.half);
    Tensor ym = math_output(y, plan.half);
    dnn_check(L_->cudnnConvolutionForward(dnn_, &one, plan.x, xm.raw_data(), plan.w, wm.raw_data(), plan.conv, plan.fwd,
                                          ws.raw_data(), plan.ws_fwd, &zero, plan.y, ym.raw_data()),
              "cudnnConvolutionForward");
    math_result(ym, y, false, plan.half);
    if (bias.defined()) {
      kernels::bias_add(f(y), f(bias), ys[0], ys[1], ys[2] * ys[3], stream_);
      check_launch("bias_add");
    }
    return y;
  }

  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override {
    validate::tensor(dy, "conv_backward_data", "dy", device(), 4);
    validate::tensor(w, "conv_backward_data", "weights", device(), 4);
    const Shape ys = conv_output_shape(x_shape, w.shape(), p);
    TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_data: dy must be {}, got {}", ys.str(), dy.shape().str());
    ConvPlan& plan = conv_plan(x_shape, w.shape(), p);
    Tensor dx = empty(x_shape, DType::kF32);
    Tensor ws = workspace(plan.ws_data);
    const float one = 1.0f, zero = 0.0f;
    const Tensor wm = math_input(w, plan.half), dym = math_input(dy, plan.half);
    Tensor dxm = math_output(dx, plan.half);
    dnn_check(L_->cudnnConvolutionBackwardData(dnn_, &one, plan.w, wm.raw_data(), plan.y, dym.raw_data(), plan.conv,
                                               plan.bwd_data, ws.raw_data(), plan.ws_data, &zero, plan.x,
                                               dxm.raw_data()),
              "cudnnConvolutionBackwardData");
    math_result(dxm, dx, false, plan.half);
    return dx;
  }

  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override {
    validate::tensor(x, "conv_backward_weights", "input", device(), 4);
    validate::tensor(dy, "conv_backward_weights", "dy", device(), 4);
    validate::plain(dw, "conv_backward_weights", "dw", device(), dw.shape(), DType::kF32);
    const Shape ys = conv_output_shape(x.shape(), dw.shape(), p);
    TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_weights: dy must be {}, got {}", ys.str(), dy.shape().str());
    if (dbias.defined()) validate::plain(dbias, "conv_backward_weights", "dbias", device(), Shape{ys[1]}, DType::kF32);
    ConvPlan& plan = conv_plan(x.shape(), dw.shape(), p);
    Tensor ws = workspace(plan.ws_filter);
    // In 16-bit math the filter gradient comes out in 16 bits and is added to dw in f32 (cuDNN's beta would blend in
    // 16 bits).
    const float one = 1.0f, beta = accumulate && !plan.half ? 1.0f : 0.0f;
    const Tensor xm = math_input(x, plan.half), dym = math_input(dy, plan.half);
    Tensor dwm = math_output(dw, plan.half);
    dnn_check(L_->cudnnConvolutionBackwardFilter(dnn_, &one, plan.x, xm.raw_data(), plan.y, dym.raw_data(), plan.conv,
                                                 plan.bwd_filter, ws.raw_data(), plan.ws_filter, &beta, plan.w,
                                                 dwm.raw_data()),
              "cudnnConvolutionBackwardFilter");
    math_result(dwm, dw, accumulate, plan.half);
    if (dbias.defined()) {
      kernels::bias_grad(f(dy), f(dbias), ys[0], ys[1], ys[2] * ys[3], accumulate, stream_);
      check_launch("bias_grad");
    }
  }

  // ---- batch norm ----
  BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               Tensor& running_mean, Tensor& running_var,
                                               const BatchNormParams& p) override {
    const int64_t C = validate::batch_norm(x, gamma, beta, device());
    require_f32(x, "batch_norm");
    validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, DType::kF32);
    validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, DType::kF32);
    TANDEM_REQUIRE(p.eps > 0 && p.momentum >= 0 && p.momentum <= 1,
                   "batch_norm: eps {} must be > 0, momentum {} in [0, 1]", p.eps, p.momentum);
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    TANDEM_REQUIRE(N * S > 1, "batch_norm: training needs more than one value per channel, input {}", x.shape().str());
    BatchNormForward out{empty(x.shape(), DType::kF32), empty({C}, DType::kF32), empty({C}, DType::kF32)};
    Tensor acc = empty({2 * C}, DType::kF64);
    kernels::bn_stats(f(x), f(out.mean), f(out.var), static_cast<double*>(acc.raw_data()), N, C, S, stream_);
    kernels::bn_apply(f(x), f(out.y), f(gamma), f(beta), f(out.mean), f(out.var), p.eps, N, C, S, stream_);
    const float unbias = static_cast<float>(static_cast<double>(N * S) / static_cast<double>(N * S - 1));
    kernels::bn_running_update(f(running_mean), f(running_var), f(out.mean), f(out.var), C, p.momentum, unbias,
                               stream_);
    check_launch("batch_norm_forward_training");
    return out;
  }

  Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var, float eps) override {
    const int64_t C = validate::batch_norm(x, gamma, beta, device());
    require_f32(x, "batch_norm");
    validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, DType::kF32);
    validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, DType::kF32);
    TANDEM_REQUIRE(eps > 0, "batch_norm: eps {} must be > 0", eps);
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    Tensor y = empty(x.shape(), DType::kF32);
    kernels::bn_apply(f(x), f(y), f(gamma), f(beta), f(running_mean), f(running_var), eps, N, C, S, stream_);
    check_launch("batch_norm_forward_inference");
    return y;
  }

  Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                             const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) override {
    const int64_t C = validate::batch_norm(x, gamma, gamma, device());
    validate::tensor(dy, "batch_norm_backward", "dy", device(), x.rank());
    validate::same_shape(dy, x, "batch_norm_backward", "dy", "input");
    for (const Tensor* t : std::initializer_list<const Tensor*>{&mean, &var, &dgamma, &dbeta})
      validate::plain(*t, "batch_norm_backward", "statistics/gradients", device(), Shape{C}, DType::kF32);
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    Tensor dx = empty(x.shape(), DType::kF32);
    Tensor scratch = empty({2 * C}, DType::kF32);
    Tensor acc = empty({2 * C}, DType::kF64);
    kernels::bn_backward(f(dy), f(x), f(gamma), f(mean), f(var), eps, f(dx), f(dgamma), f(dbeta), accumulate,
                         f(scratch), static_cast<double*>(acc.raw_data()), N, C, S, stream_);
    check_launch("batch_norm_backward");
    return dx;
  }

  // ---- activations ----
  Tensor activation_forward(Activation a, const Tensor& x, bool in_place) override {
    validate::tensor(x, "activation_forward", "input", device(), -1);
    Tensor y = in_place ? x : empty(x.shape(), DType::kF32);
    kernels::clamp_forward(f(x), f(y), x.numel(), clamp_hi(a), stream_);
    check_launch("activation_forward");
    return y;
  }
  Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) override {
    validate::tensor(dy, "activation_backward", "dy", device(), -1);
    validate::tensor(y, "activation_backward", "y", device(), -1);
    validate::same_shape(dy, y, "activation_backward", "dy", "y");
    Tensor dx = empty(y.shape(), DType::kF32);
    kernels::clamp_backward(f(dy), f(y), f(dx), y.numel(), clamp_hi(a), stream_);
    check_launch("activation_backward");
    return dx;
  }

  // ---- pooling ----
  PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) override {
    const Shape ys = validate::pool(x, p, device());
    require_f32(x, "pool_forward");
    const bool max = kind == PoolKind::kMax;
    PoolForward out{empty(ys, DType::kF32), max ? empty(ys, DType::kI32) : Tensor()};
    kernels::pool_forward(max, f(x), f(out.y), max ? static_cast<int32_t*>(out.workspace.raw_data()) : nullptr,
                          x.dim(0) * x.dim(1), x.dim(2), x.dim(3), ys[2], ys[3], p.kernel_h, p.kernel_w, p.stride_h,
                          p.stride_w, p.pad_h, p.pad_w, p.count_include_pad, stream_);
    check_launch("pool_forward");
    return out;
  }
  Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, const Shape& x_shape,
                       const PoolParams& p) override {
    validate::tensor(dy, "pool_backward", "dy", device(), 4);
    const Shape ys = pool_output_shape(x_shape, p);
    TANDEM_REQUIRE(dy.shape() == ys, "pool_backward: dy must be {}, got {}", ys.str(), dy.shape().str());
    const bool max = kind == PoolKind::kMax;
    if (max) validate::plain(workspace, "pool_backward", "workspace", device(), ys, DType::kI32);
    Tensor dx = empty(x_shape, DType::kF32);
    kernels::pool_backward(max, f(dy), max ? static_cast<const int32_t*>(workspace.raw_data()) : nullptr, f(dx),
                           x_shape[0] * x_shape[1], x_shape[2], x_shape[3], ys[2], ys[3], p.kernel_h, p.kernel_w,
                           p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad, stream_);
    check_launch("pool_backward");
    return dx;
  }
  Tensor global_avg_pool_forward(const Tensor& x) override {
    validate::tensor(x, "global_avg_pool_forward", "input", device(), 4);
    Tensor y = empty({x.dim(0), x.dim(1)}, DType::kF32);
    kernels::gap_forward(f(x), f(y), x.dim(0) * x.dim(1), x.dim(2) * x.dim(3), stream_);
    check_launch("global_avg_pool_forward");
    return y;
  }
  Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) override {
    validate::tensor(dy, "global_avg_pool_backward", "dy", device(), 2);
    TANDEM_REQUIRE(x_shape.rank() == 4 && dy.dim(0) == x_shape[0] && dy.dim(1) == x_shape[1],
                   "global_avg_pool_backward: dy {} does not match input shape {}", dy.shape().str(), x_shape.str());
    Tensor dx = empty(x_shape, DType::kF32);
    kernels::gap_backward(f(dy), f(dx), x_shape[0] * x_shape[1], x_shape[2] * x_shape[3], stream_);
    check_launch("global_avg_pool_backward");
    return dx;
  }

  // ---- linear (row-major [N, features] through column-major cuBLAS) ----
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    const auto [N, In] = validate::linear(x, w, bias, device());
    require_f32(x, "linear_forward");
    const int64_t Out = w.dim(0);
    Tensor y = empty({N, Out}, DType::kF32);
    // y^T[Out, N] = W[Out, In] . x^T[In, N]
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, Out, N, In, w, In, x, In, 0.0f, f(y), Out, "linear forward");
    if (bias.defined()) {
      kernels::bias_add(f(y), f(bias), N, Out, 1, stream_);
      check_launch("bias_add");
    }
    return y;
  }
  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) override {
    const auto [N, In, Out] = validate::linear_data(dy, w, x_shape, device(), false);
    Tensor dx = empty(x_shape, DType::kF32);
    // dx^T[In, N] = W^T[In, Out] . dy^T[Out, N]
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, In, N, Out, w, In, dy, Out, 0.0f, f(dx), In, "linear backward data");
    return dx;
  }
  void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, bool accumulate) override {
    const auto [N, In, Out] = validate::linear_weights(x, dy, dw, dbias, device());
    require_f32(x, "linear_backward_weights");
    // dW^T[In, Out] = x^T[In, N] . dy[N, Out]
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, In, Out, N, x, In, dy, Out, accumulate ? 1.0f : 0.0f, f(dw), In,
         "linear backward weights");
    if (dbias.defined()) {
      kernels::bias_grad(f(dy), f(dbias), N, Out, 1, accumulate, stream_);
      check_launch("bias_grad");
    }
  }

  // ---- dropout ----
  DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) override {
    validate::tensor(x, "dropout_forward", "input", device(), -1);
    validate::dropout_p(p);
    DropoutForward out{empty(x.shape(), DType::kF32), empty(x.shape(), DType::kU8)};
    kernels::dropout_forward(f(x), f(out.y), static_cast<uint8_t*>(out.mask.raw_data()), x.numel(), seed,
                             dropout_threshold24(p), 1.0f / (1.0f - p), stream_);
    check_launch("dropout_forward");
    return out;
  }
  Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) override {
    validate::tensor(dy, "dropout_backward", "dy", device(), -1);
    validate::plain(mask, "dropout_backward", "mask", device(), dy.shape(), DType::kU8);
    validate::dropout_p(p);
    Tensor dx = empty(dy.shape(), DType::kF32);
    kernels::dropout_backward(f(dy), static_cast<const uint8_t*>(mask.raw_data()), f(dx), dy.numel(),
                              1.0f / (1.0f - p), stream_);
    check_launch("dropout_backward");
    return dx;
  }

  // ---- loss ----
  LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   int64_t normalizer) override {
    validate::tensor(logits, "softmax_cross_entropy", "logits", device(), 2);
    const auto [N, K] = validate::loss(logits, labels, device());
    TANDEM_REQUIRE(normalizer >= 0, "softmax_cross_entropy: normalizer {} must be >= 0", normalizer);
    const double norm = normalizer > 0 ? static_cast<double>(normalizer) : static_cast<double>(std::max<int64_t>(N, 1));
    LossOutput out;
    if (want_grad) out.dlogits = empty(logits.shape(), DType::kF32);
    Tensor loss = empty({std::max<int64_t>(N, 1)}, DType::kF64);
    Tensor correct = empty({std::max<int64_t>(N, 1)}, DType::kI32);
    Tensor bad = empty({1}, DType::kI64);
    kernels::softmax_cross_entropy(f(logits), labels.raw_data(), labels.dtype() == DType::kI32, N, K, norm,
                                   want_grad ? f(out.dlogits) : nullptr, static_cast<double*>(loss.raw_data()),
                                   static_cast<int32_t*>(correct.raw_data()), static_cast<int64_t*>(bad.raw_data()),
                                   stream_);
    check_launch("softmax_cross_entropy");
    Tensor hb = to_host(bad), hl = to_host(loss), hc = to_host(correct);
    const int64_t bad_row = hb.data<int64_t>()[0];
    if (bad_row >= 0 && bad_row < N) {
      Tensor hlab = to_host(labels);
      const int64_t l = hlab.dtype() == DType::kI32 ? hlab.data<int32_t>()[bad_row] : hlab.data<int64_t>()[bad_row];
      TANDEM_THROW(Status::kInvalidArgument, "softmax_cross_entropy: label {} of row {} is outside [0, {})", l, bad_row,
                   K);
    }
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
      total += hl.data<double>()[n];
      out.correct += hc.data<int32_t>()[n];
    }
    out.loss = total / norm;
    return out;
  }

  // ---- elementwise ----
  Tensor add(const Tensor& a, const Tensor& b) override {
    check_pair(a, b, "add");
    Tensor c = empty(a.shape(), DType::kF32);
    kernels::add(f(c), f(a), f(b), a.numel(), stream_);
    check_launch("add");
    return c;
  }
  void add_inplace(Tensor& a, const Tensor& b) override {
    check_pair(a, b, "add_inplace");
    kernels::add(f(a), f(a), f(b), a.numel(), stream_);
    check_launch("add_inplace");
  }
  void scale(Tensor& x, float alpha) override {
    validate::tensor(x, "scale", "x", device(), -1);
    kernels::scale(f(x), x.numel(), alpha, stream_);
    check_launch("scale");
  }
  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    check_pair(y, x, "axpy");
    kernels::axpy(alpha, f(x), f(y), x.numel(), stream_);
    check_launch("axpy");
  }
  void fill(Tensor& x, float value) override {
    validate::tensor(x, "fill", "x", device(), -1);
    kernels::fill(f(x), x.numel(), value, stream_);
    check_launch("fill");
  }
  double sum_squares(const Tensor& x) override {
    validate::tensor(x, "sum_squares", "x", device(), -1);
    Tensor out = empty({1}, DType::kF64);
    kernels::sum_squares(f(x), x.numel(), static_cast<double*>(out.raw_data()), stream_);
    check_launch("sum_squares");
    return to_host(out).data<double>()[0];
  }

  // ---- optimizers ----
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& p) override {
    validate::sgd(p);
    const bool mom = p.momentum != 0.0f;
    validate::optimizer_buffers(param, grad, mom ? &buf : nullptr, nullptr, "sgd_update", device());
    require_f32(param, "sgd_update");
    kernels::sgd(f(param), f(grad), mom ? f(buf) : nullptr, param.numel(), p.lr, p.weight_decay, p.momentum,
                 1.0f - p.dampening, p.step == 1, p.nesterov, stream_);
    check_launch("sgd_update");
  }
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) override {
    validate::adam(p);
    validate::optimizer_buffers(param, grad, &m, &v, "adam_update", device());
    require_f32(param, "adam_update");
    const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
    kernels::adam(f(param), f(grad), f(m), f(v), param.numel(), static_cast<float>(p.lr / bc1),
                  static_cast<float>(1.0 / std::sqrt(bc2)), p.beta1, p.beta2, p.eps,
                  p.decoupled_weight_decay ? 0.0f : p.weight_decay,
                  p.decoupled_weight_decay ? 1.0f - p.lr * p.weight_decay : 1.0f, stream_);
    check_launch("adam_update");
  }

 private:
  static float* f(const Tensor& t) { return static_cast<float*>(t.raw_data()); }
  static float clamp_hi(Activation a) { return a == Activation::kRelu ? INFINITY : 6.0f; }
  static std::pair<int64_t, int64_t> bn_dims(const Tensor& x) {
    return {x.dim(0), x.rank() == 4 ? x.dim(2) * x.dim(3) : 1};
  }
  void on_device() const { check_cuda(cudaSetDevice(dev_), "cudaSetDevice"); }
  static void require_f32(const Tensor& t, const char* op) {
    TANDEM_REQUIRE(t.dtype() == DType::kF32, "{} (cuda): f32 only, got {}", op, t.str());
  }
  void check_pair(const Tensor& a, const Tensor& b, const char* op) {
    validate::tensor(a, op, "a", device(), -1);
    validate::tensor(b, op, "b", device(), -1);
    validate::same_shape(a, b, op, "a", "b");
  }
  void dnn_check(cudnnStatus_t s, const char* what) {
    if (s != CUDNN_STATUS_SUCCESS) TANDEM_THROW(Status::kBackend, "{} failed: {}", what, L_->cudnnGetErrorString(s));
  }
  Tensor workspace(size_t bytes) { return empty({static_cast<int64_t>(bytes)}, DType::kU8); }

  // 16-bit math: what the tensor cores read (x rounded to bf16 or fp16), the buffer they write, and that buffer back
  // into the f32 result (added to it when accumulate). In f32 math each is the tensor itself and math_result does
  // nothing.
  Tensor math_input(const Tensor& x, bool half = true) {
    if (half_ == Half::kNone || !half) return x;
    Tensor h = empty(x.shape(), half_dtype());
    if (half_ == Half::kBF16) {
      kernels::to_bf16(f(x), static_cast<uint16_t*>(h.raw_data()), x.numel(), stream_);
    } else {
      kernels::to_f16(f(x), static_cast<uint16_t*>(h.raw_data()), x.numel(), stream_);
    }
    return h;
  }
  Tensor math_output(const Tensor& y, bool half = true) {
    return half_ != Half::kNone && half ? empty(y.shape(), half_dtype()) : y;
  }
  void math_result(const Tensor& ym, Tensor& y, bool accumulate, bool half = true) {
    if (half_ == Half::kNone || !half) return;
    if (half_ == Half::kBF16) {
      kernels::from_bf16(static_cast<const uint16_t*>(ym.raw_data()), f(y), y.numel(), accumulate, stream_);
    } else {
      kernels::from_f16(static_cast<const uint16_t*>(ym.raw_data()), f(y), y.numel(), accumulate, stream_);
    }
    check_launch("16-bit to f32");
  }
  DType half_dtype() const noexcept { return half_ == Half::kBF16 ? DType::kBF16 : DType::kF16; }

  // f32 tensors a and b; in 16-bit math they are rounded to bf16 / fp16 for the tensor cores (f32 accumulation
  // into c).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda,
            const Tensor& b, int64_t ldb, float beta, float* c, int64_t ldc, const char* what) {
    on_device();
    const float one = 1.0f;
    cublasStatus_t s;
    if (half_ != Half::kNone) {
      const Tensor am = math_input(a), bm = math_input(b);
      const cudaDataType_t in = half_ == Half::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
      s = L_->cublasGemmEx(blas_, ta, tb, as_int(m, "m"), as_int(n, "n"), as_int(k, "k"), &one, am.raw_data(), in,
                           as_int(lda, "lda"), bm.raw_data(), in, as_int(ldb, "ldb"), &beta, c, CUDA_R_32F,
                           as_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      s = L_->cublasSgemm_v2(blas_, ta, tb, as_int(m, "m"), as_int(n, "n"), as_int(k, "k"), &one, f(a),
                             as_int(lda, "lda"), f(b), as_int(ldb, "ldb"), &beta, c, as_int(ldc, "ldc"));
    }
    TANDEM_CHECK(s == CUBLAS_STATUS_SUCCESS, Status::kBackend, "cublasSgemm ({}) failed with status {}", what,
                 static_cast<int>(s));
  }

  ConvPlan& conv_plan(const Shape& x, const Shape& w, const ConvParams& p) {
    on_device();
    const std::string key = fmt::format("{}{}|{},{},{},{},{},{},{}", x.str(), w.str(), p.stride_h, p.stride_w, p.pad_h,
                                        p.pad_w, p.dilation_h, p.dilation_w, p.groups);
    auto it = conv_plans_.find(key);
    if (it != conv_plans_.end()) return *it->second;
    const Shape y = conv_output_shape(x, w, p);
    auto plan = std::make_unique<ConvPlan>();
    plan->L = L_;
    plan->half = half_ != Half::kNone && half_math_for_conv(p);
    dnn_check(L_->cudnnCreateTensorDescriptor(&plan->x), "cudnnCreateTensorDescriptor");
    dnn_check(L_->cudnnCreateTensorDescriptor(&plan->y), "cudnnCreateTensorDescriptor");
    dnn_check(L_->cudnnCreateFilterDescriptor(&plan->w), "cudnnCreateFilterDescriptor");
    dnn_check(L_->cudnnCreateConvolutionDescriptor(&plan->conv), "cudnnCreateConvolutionDescriptor");
    const cudnnDataType_t dt = !plan->half            ? CUDNN_DATA_FLOAT
                               : half_ == Half::kBF16 ? CUDNN_DATA_BFLOAT16
                                                      : CUDNN_DATA_HALF;
    dnn_check(L_->cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, dt, as_int(x[0], "N"),
                                             as_int(x[1], "C"), as_int(x[2], "H"), as_int(x[3], "W")),
              "cudnnSetTensor4dDescriptor");
    dnn_check(L_->cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, dt, as_int(y[0], "N"),
                                             as_int(y[1], "O"), as_int(y[2], "OH"), as_int(y[3], "OW")),
              "cudnnSetTensor4dDescriptor");
    dnn_check(L_->cudnnSetFilter4dDescriptor(plan->w, dt, CUDNN_TENSOR_NCHW, as_int(w[0], "O"),
                                             as_int(w[1], "C/groups"), as_int(w[2], "KH"), as_int(w[3], "KW")),
              "cudnnSetFilter4dDescriptor");
    dnn_check(L_->cudnnSetConvolution2dDescriptor(plan->conv, as_int(p.pad_h, "pad"), as_int(p.pad_w, "pad"),
                                                  as_int(p.stride_h, "stride"), as_int(p.stride_w, "stride"),
                                                  as_int(p.dilation_h, "dilation"), as_int(p.dilation_w, "dilation"),
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "cudnnSetConvolution2dDescriptor");
    dnn_check(L_->cudnnSetConvolutionGroupCount(plan->conv, as_int(p.groups, "groups")),
              "cudnnSetConvolutionGroupCount");
    dnn_check(L_->cudnnSetConvolutionMathType(plan->conv, plan->half ? CUDNN_TENSOR_OP_MATH
                                                          : allow_tf32_ ? CUDNN_DEFAULT_MATH
                                                                        : CUDNN_FMA_MATH),
              "cudnnSetConvolutionMathType");
    choose_algorithms(*plan, key);
    return *conv_plans_.emplace(key, std::move(plan)).first->second;
  }

  // Heuristic choice (cuDNN's *_v7 queries, best first): the first that succeeds within the
  // workspace limit.
  void choose_algorithms(ConvPlan& pl, const std::string& key) {
    constexpr int kMax = 16;
    int n = 0;
    {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      dnn_check(L_->cudnnGetConvolutionForwardAlgorithm_v7(dnn_, pl.x, pl.w, pl.conv, pl.y, kMax, &n, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
      pl.ws_fwd = pick(perf, n, pl.fwd, key, "forward");
    }
    {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      dnn_check(L_->cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn_, pl.w, pl.y, pl.conv, pl.x, kMax, &n, perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      pl.ws_data = pick(perf, n, pl.bwd_data, key, "backward data");
    }
    {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      dnn_check(L_->cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn_, pl.x, pl.y, pl.conv, pl.w, kMax, &n, perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      pl.ws_filter = pick(perf, n, pl.bwd_filter, key, "backward filter");
    }
  }
  template <typename Perf, typename Algo>
  static size_t pick(const Perf* perf, int n, Algo& algo, const std::string& key, const char* what) {
    for (int i = 0; i < n; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspaceBytes) {
        algo = perf[i].algo;
        return perf[i].memory;
      }
    }
    TANDEM_THROW(Status::kBackend, "cuDNN has no {} algorithm for convolution {}", what, key);
  }

  int dev_;
  const CudaLibs* L_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the legacy default stream (see the file comment)
  bool allow_tf32_ = false;
  enum class Half : uint8_t { kNone, kBF16, kF16 };
  Half half_ = Half::kNone;  // TANDEM_CUDA_MATH=bf16 / fp16
  std::unordered_map<std::string, std::unique_ptr<ConvPlan>> conv_plans_;
};

}  // namespace

const CudaLibs& CudaLibs::get() {
  static const CudaLibs libs = [] {
    CudaLibs l;
    const std::string dnn_name = fmt::format("libcudnn.so.{}", CUDNN_MAJOR);
    const std::string blas_name = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
    void* dnn = open_library(dnn_name);
    void* blas = open_library(blas_name);
#define TANDEM_LOAD_DNN(name) load_symbol(dnn, dnn_name.c_str(), #name, l.name);
#define TANDEM_LOAD_BLAS(name) load_symbol(blas, blas_name.c_str(), #name, l.name);
    TANDEM_CUDNN_FUNCTIONS(TANDEM_LOAD_DNN)
    TANDEM_CUBLAS_FUNCTIONS(TANDEM_LOAD_BLAS)
    load_symbol(blas, blas_name.c_str(), "cublasGemmEx", l.cublasGemmEx);
#undef TANDEM_LOAD_DNN
#undef TANDEM_LOAD_BLAS
    return l;
  }();
  return libs;
}

}  // namespace tandem::engine::compute::cuda

namespace tandem::engine::compute {
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}
}  // namespace tandem::engine::compute
