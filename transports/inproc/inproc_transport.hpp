#pragma once
// inproc: ranks are threads of one process. All transports created with one key_prefix share a
// process-global fabric (released when its last transport is destroyed). Matching happens under the
// receiving rank's mailbox lock:
//  - a receive posted before the send is filled by the sender straight from its buffers;
//  - a message up to kEagerBytes sent before its receive is copied into the fabric and the send
//    completes at once; a larger one stays in the sender's buffers (rendezvous) and the send
//    completes when the receiver copies it out.
#include <memory>

#include "transports/transport.hpp"

namespace tandem::transports::inproc {

inline constexpr size_t kEagerBytes = 64 * 1024;

std::unique_ptr<Transport> create(const TransportOptions& options);

}  // namespace tandem::transports::inproc
