#pragma once
// tcp: messages over plain stream sockets (TCP; local sockets between ranks of one host), one
// connection per pair of ranks, driven by the caller's own progress() calls -- no I/O threads,
// no intermediate message objects:
//  - A send is written with sendmsg straight from the caller's parts (header + parts in one
//    gather); a send that the socket takes at once completes inside isend. What the socket does
//    not take waits in the peer's send queue and is written by progress(); the send completes
//    when its last byte is in the kernel.
//  - A receive posted before its message arrives gets the payload read straight into its parts
//    (readv, scatter) once at least kDirectBytes are left; smaller payloads and frame headers go
//    through a per-peer staging buffer, so several small messages cost one read. A message that
//    arrives before its receive is kept in one allocation of its size (bounded by
//    TANDEM_TCP_MAX_UNEXPECTED before anything is allocated) and copied out when matched -- from
//    its first byte if it is still arriving, the rest then read straight into the receive's parts.
//  - Connection setup: each rank listens on a TCP socket and publishes "<host> <port> <nonce>" under
//    "<key_prefix>/tcp/<rank>" in the KvStore; the higher rank of a pair connects and sends a
//    Hello naming both ranks' nonces, which the acceptor checks against the store. Anything else
//    that connects is logged and closed; the listeners are closed once every peer is connected.
//  - Ranks of one host: each rank also listens on an abstract local (AF_UNIX) socket and adds
//    "<host id> <socket name>" to what it publishes. The host id is the kernel's boot id and the
//    network namespace, the scope of abstract socket names, so ranks in separate namespaces (the
//    emulated hosts of bench/emu) keep to TCP. A pair with the same host id connects over the
//    local socket -- the same frames and hello, without the TCP/IP stack (a 16 MiB allreduce ran
//    1.4-1.9x faster than over loopback TCP here). If that connect fails the pair falls back to
//    TCP with a warning.
//    TANDEM_TCP_LOCAL=tcp turns local sockets off.
//  - Shared memory (TANDEM_TCP_LOCAL=shm, the default): a local pair whose ranks both publish "shm"
//    moves its frames through two single-producer/single-consumer rings in a sealed memfd that the
//    connector passes with its hello (shm_ring.hpp) -- the same byte stream, so framing, matching and
//    the frame checks are those of a socket, with no system call per message and nothing left in
//    /dev/shm. The socket stays for the hello, wake-ups (a byte, only to a side that said it blocks)
//    and the end of stream that tells a dead peer (its ring is read to the end first). Ring indices
//    read from the segment are bounds-checked: a peer that corrupts them is failed by name.
//  - Peer failure: end of stream or a socket error fails the peer's pending receives and sends
//    with kPeerFailure naming it; messages it completed before are still delivered. A malformed
//    frame (bad magic, wrong source, oversized) fails the peer the same way: a byte stream cannot
//    be resynchronised.
//  - Cancelling a send (or destroying its incomplete request) drops it from the queue when none of it
//    is written yet; a send partly written must still be finished (the peer's stream cannot skip the
//    rest of a frame), so cancel() copies its unwritten rest into the op and it is written from there:
//    the caller's parts are free once cancel() returns. The copy is the cancel path's only cost.
//  - Destruction writes what is queued for live peers (at most kLingerMs), then a goodbye frame.
//  - wait_for_progress polls (yielding) for up to TANDEM_TCP_SPIN_US (default 100 us) while
//    messages flow, then blocks in ppoll on the sockets.
// Environment: TANDEM_IFACE_ADDR (address to listen on and publish), TANDEM_TCP_SPIN_US,
// TANDEM_TCP_MAX_UNEXPECTED (bytes, default 4 GiB), TANDEM_TCP_LOCAL (shm | unix | tcp, default shm).
#include <memory>

#include "transports/transport.hpp"

namespace tandem::transports::tcp {

inline constexpr size_t kDirectBytes = 16 * 1024;
inline constexpr int kLingerMs = 2000;

std::unique_ptr<Transport> create(const TransportOptions& options);

}  // namespace tandem::transports::tcp
