#include "transports/memory_store.hpp"

#include <string>

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

int64_t KvStore::add(const std::string& key, int64_t delta) {
  (void)delta;
  TANDEM_THROW(Status::kUnsupported, "this store cannot add to counters (key '{}')", key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      size_t used = 0;
      try {
        value = std::stoll(it->second, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TANDEM_CHECK(used != 0 && used == it->second.size(), Status::kInvalidArgument,
                   "store add: key '{}' holds '{}', not a counter", key, it->second);
    }
    value += delta;
    map_[key] = std::to_string(value);
  }
  cv_.notify_all();
  return value;
}

}  // namespace tandem::transports
