#pragma once
// The structs behind the opaque C handles. Each carries a magic word so a destroyed or foreign
// pointer is caught (as far as memory still allows) instead of being used.
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
const std::string& last_error() noexcept;

constexpr uint32_t kContextMagic = 0x54434f4e;  // "TCON"

template <typename H>
H& checked(H* h, const char* what) {
  TANDEM_REQUIRE(h != nullptr, "{} handle is null", what);
  TANDEM_REQUIRE(h->magic == H::kMagic, "{} handle is invalid or already destroyed", what);
  return *h;
}

// What a context gives the work done through it: its settings snapshot and its logger. Handles
// keep a copy, so a call on them runs under their context's (ContextScope).
struct ContextEnv {
  std::shared_ptr<const settings::Settings> settings;
  std::shared_ptr<log::Logger> logger;
};

// Installs a context's settings and logger on the calling thread for the scope's lifetime.
class ContextScope {
 public:
  explicit ContextScope(const ContextEnv& env) : settings_(env.settings), log_(env.logger.get()) {}

 private:
  settings::Scope settings_;
  log::Scope log_;
};
}  // namespace tandem::api

struct tandem_context {
  static constexpr uint32_t kMagic = tandem::api::kContextMagic;
  uint32_t magic = kMagic;
  int32_t num_threads = 0;  // 0 = default
  tandem::api::ContextEnv env;
  ~tandem_context() { magic = 0; }
};
