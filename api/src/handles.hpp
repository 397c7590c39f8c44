#pragma once
// The context handle and what every handle keeps of its context. Every struct behind an opaque C handle derives
// from Handle<kMagic> and is checked with checked() (boundary.hpp).
#include <cstdint>
#include <memory>
#include <string>

#include "api/src/boundary.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
const std::string& last_error() noexcept;

constexpr uint32_t kContextMagic = 0x54434f4e;  // "TCON"

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

struct tandem_context : tandem::api::Handle<tandem::api::kContextMagic> {
  int32_t num_threads = 0;  // 0 = default
  tandem::api::ContextEnv env;
};
