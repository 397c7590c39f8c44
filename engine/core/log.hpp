#pragma once
// Minimal leveled logging to stderr (or a sink installed by the C API). Level from TANDEM_LOG_LEVEL
// (error, warn, info, debug, trace); default warn.
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tandem::log {

enum class Level : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

using Sink = void (*)(int level, const char* message, void* user);

Level level() noexcept;
void set_level(Level l) noexcept;
// Installs a process-wide sink; nullptr restores stderr. Thread-safe.
void set_sink(Sink sink, void* user) noexcept;
void write(Level l, std::string_view message);

template <typename... Args>
void at(Level l, fmt::format_string<Args...> f, Args&&... args) {
  if (l < level()) return;
  write(l, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args> void debug(fmt::format_string<Args...> f, Args&&... a) { at(Level::kDebug, f, std::forward<Args>(a)...); }
template <typename... Args> void info(fmt::format_string<Args...> f, Args&&... a) { at(Level::kInfo, f, std::forward<Args>(a)...); }
template <typename... Args> void warn(fmt::format_string<Args...> f, Args&&... a) { at(Level::kWarn, f, std::forward<Args>(a)...); }
template <typename... Args> void error(fmt::format_string<Args...> f, Args&&... a) { at(Level::kError, f, std::forward<Args>(a)...); }

}  // namespace tandem::log
