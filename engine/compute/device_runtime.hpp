#pragma once
// Device memory for the collectives (issue #14): what a communicator needs from the GPU runtime to
// reduce buffers that live on a device -- checking the device, ordering against the caller's stream,
// copying through the host -- and NCCL, loaded at run time (dlopen "libnccl.so.2"), so one build runs
// on CPU-only and GPU nodes alike and a CPU-only machine never needs a driver.
//
// device_runtime() is nullptr in a build without CUDA. Every call throws a tandem::Error naming what
// failed: kUnsupported when the thing is absent here (no driver or device, no libnccl), kInvalidArgument
// for a device index the host does not have, kBackend for a failing CUDA or NCCL call.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/core/dtype.hpp"

namespace tandem::engine::compute {

// One rank's NCCL communicator. Calls are stream-ordered: they are queued on `stream` (nullptr: the
// device's default stream) and return before the data moved, as NCCL's own calls do.
class NcclComm {
 public:
  virtual ~NcclComm() = default;
  virtual void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, void* stream) = 0;
  // Aborts the communicator's queued work (after a peer failure); the destructor then does not block.
  virtual void abort() noexcept = 0;
};

using NcclUniqueId = std::array<unsigned char, 128>;  // NCCL_UNIQUE_ID_BYTES
using DeviceUuid = std::array<unsigned char, 16>;     // cudaDeviceProp::uuid: one physical GPU, host-wide

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Number of CUDA devices; throws kUnsupported naming the runtime's reason when there is no usable
  // driver or device.
  virtual int device_count() const = 0;
  // device_count() plus kInvalidArgument when `device` is not one of them.
  virtual void require_device(int device) const = 0;
  // Waits for the work queued on `stream` (nullptr: the default stream) of `device`.
  virtual void stream_synchronize(int device, void* stream) const = 0;
  // Synchronous copies between device and host memory (the host side may be pageable).
  virtual void copy_to_host(int device, void* host_dst, const void* device_src, size_t bytes) const = 0;
  virtual void copy_to_device(int device, void* device_dst, const void* host_src, size_t bytes) const = 0;
  // 1 when `p` is device (or managed) memory of some device, 0 for host memory.
  virtual bool is_device_pointer(const void* p) const = 0;
  // The physical GPU behind cuda:`device` (ranks that share one cannot form an NCCL communicator).
  virtual DeviceUuid device_uuid(int device) const = 0;
  // Page-locked host memory (cudaHostAlloc): copies to and from a device run at the bus's rate from it.
  virtual void* pinned_alloc(size_t bytes) const = 0;
  virtual void pinned_free(void* p) const noexcept = 0;

  // NCCL's version code (e.g. 22809 for 2.28.9); throws kUnsupported naming the loader's reason when
  // libnccl.so.2 cannot be loaded or lacks a symbol Tandem calls.
  virtual int nccl_version() const = 0;
  virtual NcclUniqueId nccl_unique_id() const = 0;
  // Collective over the `nranks` ranks that pass the same id (rank 0's nccl_unique_id()).
  virtual std::unique_ptr<NcclComm> nccl_init(int device, int nranks, int rank, const NcclUniqueId& id) const = 0;
};

// This build's runtime; nullptr when built without CUDA.
const DeviceRuntime* device_runtime() noexcept;

}  // namespace tandem::engine::compute
