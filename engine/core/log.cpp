#include "engine/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace tandem::log {
namespace {

Level level_from_env() {
  const char* v = std::getenv("TANDEM_LOG_LEVEL");
  if (v == nullptr) return Level::kWarn;
  if (!std::strcmp(v, "trace")) return Level::kTrace;
  if (!std::strcmp(v, "debug")) return Level::kDebug;
  if (!std::strcmp(v, "info")) return Level::kInfo;
  if (!std::strcmp(v, "error")) return Level::kError;
  if (!std::strcmp(v, "off")) return Level::kOff;
  return Level::kWarn;
}

std::atomic<int> g_level{static_cast<int>(level_from_env())};
std::mutex g_mu;
Sink g_sink = nullptr;
void* g_user = nullptr;

const char* tag(Level l) {
  switch (l) {
    case Level::kTrace: return "trace";
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
    default: return "";
  }
}

}  // namespace

Level level() noexcept { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void set_level(Level l) noexcept { g_level.store(static_cast<int>(l)); }

void set_sink(Sink sink, void* user) noexcept {
  std::lock_guard lock(g_mu);
  g_sink = sink;
  g_user = user;
}

void write(Level l, std::string_view message) {
  std::lock_guard lock(g_mu);
  if (g_sink != nullptr) {
    std::string s(message);
    g_sink(static_cast<int>(l), s.c_str(), g_user);
    return;
  }
  std::fprintf(stderr, "[tandem %s] %.*s\n", tag(l), static_cast<int>(message.size()), message.data());
}

}  // namespace tandem::log
