#pragma once
// The structs behind the opaque C handles. Each carries a magic word so a destroyed or foreign
// pointer is caught (as far as memory still allows) instead of being used.
#include <cstdint>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::api {
const std::string& last_error() noexcept;

constexpr uint32_t kContextMagic = 0x54434f4e;  // "TCON"

template <typename H>
H& checked(H* h, const char* what) {
  TANDEM_REQUIRE(h != nullptr, "{} handle is null", what);
  TANDEM_REQUIRE(h->magic == H::kMagic, "{} handle is invalid or already destroyed", what);
  return *h;
}
}  // namespace tandem::api

struct tandem_context {
  static constexpr uint32_t kMagic = tandem::api::kContextMagic;
  uint32_t magic = kMagic;
  int32_t num_threads = 0;  // 0 = default
  ~tandem_context() { magic = 0; }
};
