#include "engine/comm/shared_transport.hpp"

#include <algorithm>

namespace tandem::engine::comm {

void SharedTransport::bury(std::shared_ptr<void> p) {
  std::lock_guard lock(mu_);
  graveyard_.push_back(std::move(p));
}

size_t SharedTransport::buried() const {
  std::lock_guard lock(mu_);
  return graveyard_.size();
}

uint32_t SharedTransport::next_id() const {
  std::lock_guard lock(mu_);
  return next_id_;
}

void SharedTransport::reserve_ids(uint32_t next) {
  std::lock_guard lock(mu_);
  next_id_ = std::max(next_id_, next);
}

}  // namespace tandem::engine::comm
