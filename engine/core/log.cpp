#include "engine/core/log.hpp"

#include <cstdio>

#include "engine/core/settings.hpp"

namespace tandem::log {
namespace {

thread_local Logger* t_logger = nullptr;

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

Level process_level() noexcept {
  try {
    const char* v = settings::process()->get("TANDEM_LOG_LEVEL");
    if (v == nullptr) return Level::kWarn;
    if (const auto l = parse_level(v)) return *l;
    std::fprintf(stderr, "[tandem warn] TANDEM_LOG_LEVEL='%s' is not trace, debug, info, warn, error or off; using warn\n",
                 v);
  } catch (...) {
  }
  return Level::kWarn;
}

}  // namespace

std::optional<Level> parse_level(std::string_view text) noexcept {
  for (int l = 0; l <= static_cast<int>(Level::kOff); ++l)
    if (text == (l == static_cast<int>(Level::kOff) ? "off" : tag(static_cast<Level>(l)))) return static_cast<Level>(l);
  return std::nullopt;
}

void Logger::set_sink(Sink sink, void* user) noexcept {
  std::lock_guard lock(mu_);
  sink_ = sink;
  user_ = user;
}

void Logger::write(Level l, std::string_view message) {
  std::lock_guard lock(mu_);
  if (sink_ != nullptr) {
    std::string s(message);
    sink_(static_cast<int>(l), s.c_str(), user_);
    return;
  }
  std::fprintf(stderr, "[tandem %s] %.*s\n", tag(l), static_cast<int>(message.size()), message.data());
}

Logger& process_logger() noexcept {
  static Logger logger(process_level());
  return logger;
}

Logger& current() noexcept { return t_logger != nullptr ? *t_logger : process_logger(); }

Scope::Scope(Logger* logger) noexcept : prev_(t_logger) {
  if (logger != nullptr) t_logger = logger;
}
Scope::~Scope() { t_logger = prev_; }

}  // namespace tandem::log
