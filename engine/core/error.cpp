#include "engine/core/error.hpp"

namespace tandem {

const char* status_name(Status s) noexcept {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInProgress: return "in progress";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnsupported: return "unsupported";
    case Status::kOutOfMemory: return "out of memory";
    case Status::kTransport: return "transport error";
    case Status::kBackend: return "backend error";
    case Status::kTimeout: return "timeout";
    case Status::kInternal: return "internal error";
    case Status::kMismatch: return "mismatch between ranks";
    case Status::kPeerFailure: return "peer failure";
    case Status::kIo: return "i/o or format error";
    case Status::kAuth: return "authentication failed";
  }
  return "unknown status";
}

void throw_error(Status status, std::string message) { throw Error(status, std::move(message)); }

}  // namespace tandem
