// The CUDA DeviceRuntime: the CUDA runtime (linked statically, costs nothing until called) for device
// checks and copies, and NCCL through dlopen("libnccl.so.2") on first use, so libtandem loads and runs on
// hosts without NCCL or a driver.
#include "engine/compute/device_runtime.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::engine::compute {
const DeviceRuntime* cuda_device_runtime() noexcept;
}

namespace tandem::engine::compute::cuda {
namespace {

// Every NCCL call Tandem makes; resolved all at once, so a partial library is refused up front.
#define TANDEM_NCCL_FUNCTIONS(X)                                                                    \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort)      \
  X(ncclAllReduce) X(ncclBroadcast) X(ncclGetErrorString)

struct NcclLib {
#define TANDEM_DECLARE_FN(name) decltype(&::name) name = nullptr;
  TANDEM_NCCL_FUNCTIONS(TANDEM_DECLARE_FN)
#undef TANDEM_DECLARE_FN
  decltype(&::ncclGetLastError) last_error = nullptr;  // optional (NCCL >= 2.13)
  std::string unavailable;                             // non-empty: why NCCL cannot be used
};

const NcclLib& nccl() {
  static const NcclLib lib = [] {
    NcclLib l;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* err = dlerror();
      l.unavailable = std::string("cannot load libnccl.so.2: ") + (err ? err : "unknown error");
      return l;
    }
#define TANDEM_LOAD_FN(name)                                                     \
  if (l.unavailable.empty()) {                                                   \
    l.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name));               \
    if (l.name == nullptr) l.unavailable = "libnccl.so.2 lacks " #name;          \
  }
    TANDEM_NCCL_FUNCTIONS(TANDEM_LOAD_FN)
#undef TANDEM_LOAD_FN
    l.last_error = reinterpret_cast<decltype(&::ncclGetLastError)>(dlsym(h, "ncclGetLastError"));
    return l;  // the handle stays open for the process's life
  }();
  return lib;
}

const NcclLib& loaded_nccl() {
  const NcclLib& l = nccl();
  TANDEM_CHECK(l.unavailable.empty(), Status::kUnsupported, "NCCL: {}", l.unavailable);
  return l;
}

void check_nccl(const NcclLib& l, ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  const char* detail = l.last_error != nullptr ? l.last_error(comm) : nullptr;
  TANDEM_THROW(Status::kBackend, "NCCL {} failed: {}{}{}", what, l.ncclGetErrorString(r),
               detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : "");
}

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky-free error so the next call starts clean
  TANDEM_THROW(Status::kBackend, "CUDA {} failed: {}", what, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  TANDEM_THROW(Status::kInvalidArgument, "NCCL: unknown dtype {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProd: return ncclProd;
  }
  TANDEM_THROW(Status::kInvalidArgument, "NCCL: unknown reduction {}", static_cast<int>(op));
}

class Nccl final : public NcclComm {
 public:
  Nccl(int device, ncclComm_t comm) : device_(device), comm_(comm) {}
  ~Nccl() override {
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    nccl().ncclCommDestroy(comm_);
  }
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override {
    const NcclLib& l = nccl();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_nccl(l, l.ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_,
                                  static_cast<cudaStream_t>(stream)), "ncclAllReduce", comm_);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream) override {
    const NcclLib& l = nccl();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_nccl(l, l.ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, static_cast<cudaStream_t>(stream)),
               "ncclBroadcast", comm_);
  }
  void abort() noexcept override {
    if (comm_ == nullptr) return;
    nccl().ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  int device_;
  ncclComm_t comm_;
};

class Runtime final : public DeviceRuntime {
 public:
  int device_count() const override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      TANDEM_THROW(Status::kUnsupported, "device memory: no usable CUDA device here (cudaGetDeviceCount: {})",
                   cudaGetErrorString(e));
    }
    TANDEM_CHECK(n > 0, Status::kUnsupported, "device memory: this host has no CUDA device");
    return n;
  }
  void require_device(int device) const override {
    const int n = device_count();
    TANDEM_CHECK(device >= 0 && device < n, Status::kInvalidArgument,
                 "device memory: cuda:{} does not exist (this host has {} CUDA device{})", device, n,
                 n == 1 ? "" : "s");
  }
  void stream_synchronize(int device, void* stream) const override {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
  void copy_to_host(int device, void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }
  void copy_to_device(int device, void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
  }
  bool is_device_pointer(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  DeviceUuid device_uuid(int device) const override {
    require_device(device);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    DeviceUuid out{};
    static_assert(sizeof(prop.uuid.bytes) == std::tuple_size_v<DeviceUuid>);
    std::memcpy(out.data(), prop.uuid.bytes, out.size());
    return out;
  }
  void* pinned_alloc(size_t bytes) const override {
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void pinned_free(void* p) const noexcept override {
    if (p != nullptr) cudaFreeHost(p);
  }
  int nccl_version() const override {
    const NcclLib& l = loaded_nccl();
    int v = 0;
    check_nccl(l, l.ncclGetVersion(&v), "ncclGetVersion");
    return v;
  }
  NcclUniqueId nccl_unique_id() const override {
    const NcclLib& l = loaded_nccl();
    ncclUniqueId id{};
    check_nccl(l, l.ncclGetUniqueId(&id), "ncclGetUniqueId");
    NcclUniqueId out{};
    static_assert(sizeof(id.internal) == std::tuple_size_v<NcclUniqueId>);
    std::copy(std::begin(id.internal), std::end(id.internal), out.begin());
    return out;
  }
  std::unique_ptr<NcclComm> nccl_init(int device, int nranks, int rank, const NcclUniqueId& id) const override {
    const NcclLib& l = loaded_nccl();
    require_device(device);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId nid{};
    std::copy(id.begin(), id.end(), std::begin(nid.internal));
    ncclComm_t comm = nullptr;
    check_nccl(l, l.ncclCommInitRank(&comm, nranks, nid, rank), "ncclCommInitRank");
    return std::make_unique<Nccl>(device, comm);
  }
};

}  // namespace
}  // namespace tandem::engine::compute::cuda

namespace tandem::engine::compute {
const DeviceRuntime* cuda_device_runtime() noexcept {
  static const cuda::Runtime runtime;
  return &runtime;
}
}  // namespace tandem::engine::compute
