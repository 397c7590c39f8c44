#pragma once
// Errors inside the engine: every failure is a tandem::Error carrying a Status that maps one to
// one onto tandem_status_t at the C boundary.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace tandem {

// Mirrors tandem_status_t value for value (append only; never reuse a number).
enum class Status : int32_t {
  kOk = 0,
  kInProgress = 1,
  kInvalidArgument = 2,
  kUnsupported = 3,
  kOutOfMemory = 4,
  kTransport = 5,
  kBackend = 6,
  kTimeout = 7,
  kInternal = 8,
  kMismatch = 9,     // ranks called different collectives, or peers disagree on a configuration
  kPeerFailure = 10, // a peer died, closed or aborted the job
  kIo = 11,          // a file could not be read or written, or its content is malformed
  kAuth = 12,        // a peer failed the rendezvous challenge
};

const char* status_name(Status s) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Status status, std::string message) : std::runtime_error(std::move(message)), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

[[noreturn]] void throw_error(Status status, std::string message);

}  // namespace tandem

// TANDEM_THROW(Status::kX, "fmt {}", args...)
#define TANDEM_THROW(status, ...) ::tandem::throw_error((status), ::fmt::format(__VA_ARGS__))
// TANDEM_CHECK(cond, Status::kX, "fmt {}", args...): throws when cond is false.
#define TANDEM_CHECK(cond, status, ...)            \
  do {                                             \
    if (!(cond)) TANDEM_THROW((status), __VA_ARGS__); \
  } while (0)
// TANDEM_REQUIRE(cond, "fmt", args...): argument validation (kInvalidArgument).
#define TANDEM_REQUIRE(cond, ...) TANDEM_CHECK(cond, ::tandem::Status::kInvalidArgument, __VA_ARGS__)
