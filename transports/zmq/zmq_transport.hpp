#pragma once
// zmq: TCP (ipc between ranks of one host) through ZeroMQ. Each rank binds one ROUTER (its sending
// socket) and connects one DEALER to every peer's ROUTER (its receiving socket for that peer), so
// the data from a peer and the disconnect event of that peer travel on the same connection: when a
// peer dies, everything it sent before is drained first and only then do receives from it fail
// (kPeerFailure).
//  - Endpoints and per-rank nonces are exchanged through the KvStore under
//    "<key_prefix>/zmq/<rank>"; a DEALER's routing id carries its rank and its secret nonce, and a
//    ROUTER routes only to the ids it learned from the store, so a stray connection can neither
//    receive data nor inject any (what it sends is dropped and logged).
//  - Ranks of one host (equal local_host_id(): one kernel boot, one network namespace) connect
//    over ZeroMQ's ipc transport instead: the ROUTER also binds ipc://@tandem-zmq-<pid>-<nonce>
//    (an abstract local socket) and publishes "<host id> <ipc endpoint>" after its nonce. Same
//    sockets and checks (a 16 MiB allreduce ran 1.2-1.6x faster than over loopback TCP here).
//    TANDEM_ZMQ_LOCAL=tcp turns it off.
//  - Messages above kCopyBytes are sent zero-copy (frames point into the caller's parts; the send
//    completes when ZeroMQ releases the last frame) in segments of kSegmentBytes, so the receiver
//    copies segment k while k+1 is on the wire; every frame is bounded (ZMQ_MAXMSGSIZE).
//  - A send that failed or was cancelled no longer reads its parts once cancel() (or the destruction of its
//    request) returns: that waits, driving progress, until ZeroMQ released every frame of it -- written out to a
//    live peer (a frame cannot be recalled: the peer gets the message whole), or dropped with a dead peer's
//    connection (at once: measured 0-2 ms after the death was seen). A peer that takes no data (stopped,
//    partitioned) holds them: the wait gives up after kReleaseWindowMs and logs an error, later waits towards that
//    peer do not wait again while that send is still held, and destroying the transport then drops everything
//    queued instead of lingering (a given-up send's buffer may already be gone).
//  - On destruction a goodbye segment tells every peer that this rank closed; sockets linger at
//    most kLingerMs for queued data.
//  - wait_for_progress polls (yielding the CPU) for up to TANDEM_ZMQ_SPIN_US (default 100 us) before
//    it blocks, while messages flow (one arrived within the last millisecond): a blocked waiter pays
//    a thread wake-up per message on top of ZeroMQ's I/O-thread hops.
//  - The first zmq transport of a process sets malloc's top pad (M_TOP_PAD, process-wide) to 8 MiB
//    unless MALLOC_TOP_PAD_ or GLIBC_TUNABLES set it: otherwise every large frame ZeroMQ allocates
//    faults its pages in afresh (glibc trims the freed memory at once).
// Environment: TANDEM_IFACE_ADDR (address to bind), TANDEM_ZMQ_IO_THREADS (default 1),
// TANDEM_ZMQ_SPIN_US (0 never spins), TANDEM_ZMQ_HEAP_PAD (bytes; 0 leaves malloc alone),
// TANDEM_ZMQ_LOCAL (ipc | tcp, default ipc).
#include <memory>

#include "transports/transport.hpp"

namespace tandem::transports::zmq {

inline constexpr size_t kCopyBytes = 32 * 1024;
inline constexpr size_t kSegmentBytes = 1024 * 1024;
inline constexpr int kLingerMs = 2000;
inline constexpr int kReleaseWindowMs = 2000;

std::unique_ptr<Transport> create(const TransportOptions& options);

}  // namespace tandem::transports::zmq
