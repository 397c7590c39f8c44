#pragma once
// Memory for tensors. A CachingAllocator keeps freed blocks in per-size free lists so that a
// training loop, which frees and requests the same sizes every step, stops calling the system
// allocator after its first step. Host blocks are 64-byte aligned (one cache line, one AVX-512
// vector), which oneDNN and the vectorised loops rely on.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

constexpr size_t kTensorAlignment = 64;

struct Device {
  enum class Kind : int32_t { kCpu = 0, kCuda = 1 };
  Kind kind = Kind::kCpu;
  int32_t index = 0;

  static constexpr Device cpu() noexcept { return {}; }
  static constexpr Device cuda(int32_t i = 0) noexcept { return {Kind::kCuda, i}; }
  bool is_cpu() const noexcept { return kind == Kind::kCpu; }
  bool is_cuda() const noexcept { return kind == Kind::kCuda; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const;  // "cpu", "cuda:0"
};
// Parses "cpu", "cuda", "cuda:N"; throws kInvalidArgument naming the text.
Device parse_device(std::string_view s);

// Raw block provider for one device. Interface: pure virtuals only.
struct RawAllocator {
  virtual ~RawAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;          // throws kOutOfMemory naming the size
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};

struct AllocatorStats {
  size_t bytes_in_use = 0;      // handed out and not yet returned
  size_t bytes_cached = 0;      // held in free lists
  size_t peak_bytes_in_use = 0;
  uint64_t allocations = 0;     // allocate() calls
  uint64_t cache_hits = 0;      // allocate() calls served from a free list
};

// Thread-safe size-class cache over a RawAllocator. Requests are rounded up to a size class
// (multiples of 64 B up to 4 KiB, then 8 classes per power of two, so at most 12.5% waste) and
// freed blocks go back to their class's list. A request whose class has no free block takes the
// smallest free block of a class less than twice its own before asking the raw allocator: a batch
// of fewer samples (an epoch's partial last batch, a smaller evaluation batch) then reuses the full
// batch's blocks instead of holding a second set beside them (issue #16: mlp at batch 128, 0.8 MiB).
// Such a block still belongs to its own class: it goes back to that class's list when freed. When
// the cache exceeds its limit the oldest entries are released; empty_cache() releases everything.
class CachingAllocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<RawAllocator> raw, size_t max_cached_bytes = SIZE_MAX);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);  // zero bytes gives a valid unique block of one class
  void deallocate(void* p, size_t bytes) noexcept;  // bytes: the size passed to allocate()
  void empty_cache() noexcept;
  AllocatorStats stats() const;
  Device device() const noexcept { return device_; }
  static size_t size_class(size_t bytes) noexcept;

 private:
  Device device_;
  std::unique_ptr<RawAllocator> raw_;
  size_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> larger_;  // blocks in use that a smaller request took: their own class
  AllocatorStats stats_;
};

// The process-wide caching allocator for host memory (64-byte aligned).
CachingAllocator& host_allocator();

// Device allocators are provided by the backend that owns the device (e.g. the CUDA backend
// registers its allocator when it is created); returns nullptr when none is registered.
using DeviceAllocatorHook = CachingAllocator* (*)(int32_t index);
void register_device_allocator(Device::Kind kind, DeviceAllocatorHook hook);
CachingAllocator& allocator_for(Device d);  // throws kUnsupported naming the device when none exists

// Device memory this process holds on a device as the device's driver counts it (nvidia-smi's per-process figure:
// the context, the libraries' handles and workspaces, and every block the caching allocator holds, in use or cached),
// from a probe the backend owning the device registers. 0 when unknown: a host device, no backend registered, or a
// driver that does not tell (the probe never guesses from the device's total use, which other processes share).
using DeviceMemoryProbe = double (*)(int32_t index);
void register_device_memory_probe(Device::Kind kind, DeviceMemoryProbe probe);
double process_device_memory_bytes(Device d) noexcept;

}  // namespace tandem
