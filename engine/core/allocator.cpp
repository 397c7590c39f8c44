#include "engine/core/allocator.hpp"

#include <array>
#include <bit>
#include <cstdlib>
#include <new>

#include "engine/core/error.hpp"

namespace tandem {

std::string Device::str() const {
  if (kind == Kind::kCpu) return "cpu";
  return fmt::format("cuda:{}", index);
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.starts_with("cuda:") && s.size() > 5) {
    int32_t idx = 0;
    for (char c : s.substr(5)) {
      if (c < '0' || c > '9' || idx > 100000) TANDEM_THROW(Status::kInvalidArgument, "bad device '{}' (expected cpu, cuda or cuda:N)", std::string(s));
      idx = idx * 10 + (c - '0');
    }
    return Device::cuda(idx);
  }
  TANDEM_THROW(Status::kInvalidArgument, "bad device '{}' (expected cpu, cuda or cuda:N)", std::string(s));
}

namespace {

class AlignedHostAllocator final : public RawAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(kTensorAlignment, bytes);
    TANDEM_CHECK(p != nullptr, Status::kOutOfMemory, "host allocation of {} bytes failed", bytes);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
};

std::mutex g_hooks_mu;
std::array<DeviceAllocatorHook, 2> g_hooks{};
std::array<DeviceMemoryProbe, 2> g_probes{};

}  // namespace

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawAllocator> raw, size_t max_cached_bytes)
    : device_(device), raw_(std::move(raw)), max_cached_bytes_(max_cached_bytes) {}

CachingAllocator::~CachingAllocator() { empty_cache(); }

size_t CachingAllocator::size_class(size_t bytes) noexcept {
  if (bytes <= 4096) return bytes == 0 ? 64 : (bytes + 63) & ~size_t{63};
  // 8 classes per power of two: step = 2^(floor(log2(bytes)) - 3)
  const int top = std::bit_width(bytes) - 1;
  const size_t step = size_t{1} << (top - 3);
  return (bytes + step - 1) & ~(step - 1);
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) {
      // No block of this class: the smallest free one below twice the class (see the header).
      it = free_.end();
      for (auto c = free_.begin(); c != free_.end(); ++c)
        if (!c->second.empty() && c->first > cls && c->first < 2 * cls && (it == free_.end() || c->first < it->first))
          it = c;
    }
    if (it != free_.end() && it->first != cls) {
      try {
        larger_.emplace(it->second.back(), it->first);
      } catch (...) {  // no room to remember its class: a new block instead
        it = free_.end();
      }
    }
    if (it != free_.end()) {
      const size_t got = it->first;
      void* p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
      stats_.bytes_cached -= got;
      stats_.bytes_in_use += got;
      if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
      return p;
    }
  }
  void* p = nullptr;
  try {
    p = raw_->allocate(cls);
  } catch (const Error&) {
    // Out of memory with a full cache: give the cached blocks back and try once more.
    empty_cache();
    p = raw_->allocate(cls);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use += cls;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return p;
}

void CachingAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  size_t cls = size_class(bytes);
  std::unique_lock<std::mutex> lock(mu_);
  if (!larger_.empty()) {
    if (auto it = larger_.find(p); it != larger_.end()) {
      cls = it->second;
      larger_.erase(it);
    }
  }
  stats_.bytes_in_use -= cls;
  if (stats_.bytes_cached + cls > max_cached_bytes_) {
    lock.unlock();
    raw_->deallocate(p, cls);
    return;
  }
  try {
    free_[cls].push_back(p);
    stats_.bytes_cached += cls;
  } catch (...) {  // the free list could not grow: release the block instead
    lock.unlock();
    raw_->deallocate(p, cls);
  }
}

void CachingAllocator::empty_cache() noexcept {
  std::unordered_map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    stats_.bytes_cached = 0;
  }
  for (auto& [cls, list] : blocks)
    for (void* p : list) raw_->deallocate(p, cls);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

CachingAllocator& host_allocator() {
  // Never destroyed: tensors held by other statics may be freed after main returns.
  static CachingAllocator* a = new CachingAllocator(Device::cpu(), std::make_unique<AlignedHostAllocator>());
  return *a;
}

void register_device_allocator(Device::Kind kind, DeviceAllocatorHook hook) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_hooks.at(static_cast<size_t>(kind)) = hook;
}

CachingAllocator& allocator_for(Device d) {
  if (d.is_cpu()) return host_allocator();
  DeviceAllocatorHook hook = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_hooks_mu);
    hook = g_hooks.at(static_cast<size_t>(d.kind));
  }
  CachingAllocator* a = hook ? hook(d.index) : nullptr;
  TANDEM_CHECK(a != nullptr, Status::kUnsupported,
               "no allocator for device {} (create that device's backend first, e.g. make_backend(\"cuda\"))", d.str());
  return *a;
}

void register_device_memory_probe(Device::Kind kind, DeviceMemoryProbe probe) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_probes.at(static_cast<size_t>(kind)) = probe;
}

double process_device_memory_bytes(Device d) noexcept {
  if (d.is_cpu() || static_cast<size_t>(d.kind) >= g_probes.size()) return 0;
  DeviceMemoryProbe probe = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_hooks_mu);
    probe = g_probes[static_cast<size_t>(d.kind)];
  }
  return probe ? probe(d.index) : 0;
}

}  // namespace tandem
