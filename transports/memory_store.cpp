#include "transports/memory_store.hpp"

#include "engine/core/error.hpp"

namespace tandem::transports {

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mu_);
    map_[key] = value;
  }
  cv_.notify_all();
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const bool found = cv_.wait_for(lock, timeout, [&] { return map_.count(key) != 0; });
  TANDEM_CHECK(found, Status::kTimeout, "key '{}' did not appear in the store within {} ms", key, timeout.count());
  return map_.at(key);
}

}  // namespace tandem::transports
