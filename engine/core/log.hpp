#pragma once
// Minimal leveled logging to stderr or a sink. Each tandem_context owns a Logger (its sink and
// level); the C API installs it on the calling thread for calls through that context's handles
// (Scope), and messages written elsewhere -- threads the library started, code without a context
// -- go to the process logger (stderr, level from TANDEM_LOG_LEVEL; default warn).
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tandem::log {

enum class Level : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

using Sink = void (*)(int level, const char* message, void* user);

// "trace", "debug", "info", "warn", "error", "off"; nullopt for anything else.
std::optional<Level> parse_level(std::string_view text) noexcept;

// A sink and a level. Thread-safe: the level is atomic, the sink is swapped and called under a
// mutex (so calls to one sink are serialized).
class Logger {
 public:
  explicit Logger(Level l = Level::kWarn) noexcept : level_(static_cast<int>(l)) {}
  Level level() const noexcept { return static_cast<Level>(level_.load(std::memory_order_relaxed)); }
  void set_level(Level l) noexcept { level_.store(static_cast<int>(l), std::memory_order_relaxed); }
  // nullptr restores stderr.
  void set_sink(Sink sink, void* user) noexcept;
  void write(Level l, std::string_view message);

 private:
  std::atomic<int> level_;
  std::mutex mu_;
  Sink sink_ = nullptr;
  void* user_ = nullptr;
};

// The fallback logger (stderr; TANDEM_LOG_LEVEL of the process settings).
Logger& process_logger() noexcept;
// This thread's installed logger, else process_logger().
Logger& current() noexcept;

// Installs `logger` on this thread for the scope's lifetime (nests; nullptr keeps the current one).
class Scope {
 public:
  explicit Scope(Logger* logger) noexcept;
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Logger* prev_;
};

// Sets the process logger's level and sink (used by code without a context).
inline void set_level(Level l) noexcept { process_logger().set_level(l); }
inline void set_sink(Sink sink, void* user) noexcept { process_logger().set_sink(sink, user); }
// The current logger's level, and writing to it.
inline Level level() noexcept { return current().level(); }
inline void write(Level l, std::string_view message) { current().write(l, message); }

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
