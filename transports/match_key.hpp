#pragma once
// The (peer, tag) key transports match receives and messages on.
#include <cstdint>
#include <functional>

namespace tandem::transports {

struct MatchKey {
  int peer;
  uint64_t tag;
  bool operator==(const MatchKey&) const = default;
};

struct MatchKeyHash {
  size_t operator()(const MatchKey& k) const noexcept {
    return std::hash<uint64_t>()(k.tag * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(k.peer));
  }
};

}  // namespace tandem::transports
