#pragma once
// The transport interface: tagged, non-blocking, two-sided messages between the ranks of one job.
// Implementations: inproc (threads of one process), tcp (plain sockets), zmq (TCP through ZeroMQ),
// ucx (UCP tag API).
//
// Semantics every implementation guarantees (the conformance suite in tests/transports checks them):
//  - A message is the concatenation of the parts given to isend; irecv scatters it into its parts in
//    order. Messages from one peer with one tag are delivered in the order they were sent
//    (non-overtaking); different tags or peers may complete in any order.
//  - A receive whose parts are smaller than the message completes with truncated() == true,
//    bytes() == the full message size, and as much data delivered as fits; it is not an error at
//    this level (the communicator turns it into a mismatch error naming both sides).
//  - The parts given to isend may not be modified (nor irecv's read) until test() has returned true.
//  - Tags are below 2^40 (UCX packs the source rank into the upper bits of its 64-bit tag).
//  - Sending to oneself (peer == rank) works like sending to any other peer.
//  - Nothing blocks: progress() drives completions; test() also drives progress. Progress is only
//    made inside these calls: a rank whose own requests are all complete may still owe a peer an
//    acknowledgement (UCX rendezvous), so keep driving progress while peers may wait on you
//    (any waiting loop does); destroying a transport flushes what it still owes, within a deadline.
//  - A failed request throws tandem::Error (Status::kTransport or kPeerFailure) from test(),
//    naming the peer.
//  - A send may not complete before the peer posts the matching receive (large messages use a
//    rendezvous on inproc and ucx), so post receives before waiting on sends, as with MPI_Send.
//  - Peer failure: when a peer's transport is destroyed (or, for zmq/ucx, its process dies), every
//    receive pending from it fails with kPeerFailure naming that rank, and so do later receives
//    from it and sends to it; messages it finished sending before are still delivered (for a
//    process that dies: those that had left it -- a completed small zmq send may still have been
//    queued inside the dead process).
//  - Lifetimes: requests may outlive their transport. Destroying an incomplete request cancels it;
//    a cancelled receive no longer writes into its parts once the destructor (or cancel()) returns.
//    On ucx a cancelled send also no longer reads its parts once cancel() returns, and no cancel waits for UCX:
//    ucx moves every message through its own pack/unpack callbacks rather than letting UCX -- this rank's, or a
//    peer's by zero-copy rendezvous -- address the parts. What UCX still holds of a cancelled operation stays with
//    it, away from the caller's memory: a receive matched to a message under way drops whatever still arrives for
//    it; a send goes on from a copy of its whole data taken by cancel(), so a live peer may still take it (whole) or
//    drop it (drop_unexpected), and the transport's teardown waits for neither. A receive or send failed while UCX
//    still holds it (its peer died) counts as cancelled. When no memory is left for a send's copy, the rank sends
//    nothing more to that peer rather than anything it no longer has: it tells the peer and cuts it off, and both
//    fail every operation between them as kPeerFailure naming the rank that cut, until Transport::reconnect (as a
//    tcp rank gives the connection up). The rank that cut is the one at fault on both ends: at_fault(peer) returns
//    it -- on the cutter, itself; on the peer cut off, the cutter -- so the communicator blames that rank alone, not
//    the healthy peer of the failed operation. The price is UCX's zero-copy rendezvous: large messages are copied through
//    its fragments (bench/transports/p2p_bench on one host, 4-64 MiB, on a loaded 2-core machine: the median
//    exchange rate unchanged, 0.93-1.04x; the best run 0.45-0.87x of zero-copy's). (Before that, a cancel waited up
//    to a 2 s window per peer for UCX to let go of the parts: a rank that had cancelled towards a stalled peer was
//    held that long.)
//    ucx: a same-host rank killed while writing into a peer's shared-memory receive queue can leave that peer
//    hearing no same-host rank again (a "deaf" worker); the peer notices within ~0.1 s of the death, and it and
//    every same-host rank fail all operations between them as kPeerFailure naming the dead rank.
//    They stay cut from each other until Transport::reconnect (Communicator::shrink) moves it to a fresh worker.
//    Destroying a transport cancels its own incomplete receives (their test() throws kTransport) and
//    flushes its incomplete sends to live peers: inproc copies them into the fabric, tcp and zmq hand
//    them to the socket, so a peer that posts its receive after the sender is gone still gets them;
//    ucx (whose rendezvous needs the sender's worker to pack the data) waits within its shutdown deadline (2 s) for the
//    peer to receive, and cancels what is left then.
//    On zmq a cancelled or failed send no longer reads its parts once cancel() or the request's
//    destruction returns: it waits until ZeroMQ wrote its frames out to a live peer (a message
//    handed to the wire cannot be recalled: the peer gets it whole) or dropped them with a dead
//    one's connection, at most one window (2 s) per peer. A peer that takes no data is given up on
//    (logged): those parts may still be read until the transport is destroyed, which then drops
//    the frames instead of lingering on them.
//    On tcp a cancelled send no longer reads its parts once cancel() (or the request's destruction)
//    returns, without waiting: one not yet started is dropped from its peer's queue; one partly
//    written (a frame cannot be recalled: the peer gets it whole) has its unwritten rest copied into
//    the transport, which finishes writing it from there. With no memory for that copy the rank gives the
//    connection up instead: both ends fail what is between them as kPeerFailure, and at_fault names the rank that
//    gave up, on both ends (as ucx's cut above); the connection stays lost.
//  - Threads: one transport may be used from several threads at once (isend, irecv, progress and
//    the requests' test/cancel are thread-safe); the ranks of one job each own their transport.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace tandem::transports {

struct ConstPart {
  const void* data;
  size_t bytes;
};
struct MutPart {
  void* data;
  size_t bytes;
};

class Request {
 public:
  virtual ~Request() = default;
  // True once the operation is complete. Throws tandem::Error when it failed.
  virtual bool test() = 0;
  // For receives: the size of the message as sent (valid once complete).
  virtual size_t bytes() const = 0;
  // For receives: the message was larger than the posted parts.
  virtual bool truncated() const = 0;
  // Best-effort cancellation of an incomplete request (used on abort and on destruction paths).
  virtual void cancel() {}
};

struct Capabilities {
  bool device_memory = false;  // can send from / receive into GPU memory
  bool one_sided = false;      // supports RMA
  bool shared_memory = false;  // uses shared memory between ranks on one host
};

// The out-of-band channel transports use to exchange addresses while connecting (the rendezvous
// store in a real job, an in-memory map in tests).
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // set, but returns or throws (kTimeout naming the key) within `timeout` even when the store's server is gone or
  // silent: for writes a rank makes on its way out, which must never hold its exit (Communicator::leave). The default
  // is set, for stores whose set never waits (in memory, files).
  virtual void set_within(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
    (void)timeout;
    set(key, value);
  }
  // Blocks until the key exists; throws tandem::Error(Status::kTimeout) naming the key after timeout.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the counter at `key` (absent = 0; stored as decimal text) and returns the new
  // value: the one primitive that lets ranks elect a single coordinator (Communicator::shrink). Stores that
  // cannot (the default) throw tandem::Error(kUnsupported).
  virtual int64_t add(const std::string& key, int64_t delta);
};

struct TransportOptions {
  std::string name = "auto";     // inproc | tcp | zmq | ucx | auto
  int rank = 0;
  int size = 1;
  KvStore* store = nullptr;      // borrowed; must outlive connection setup (create_transport)
  std::string key_prefix;        // namespaces this transport's keys in the store (unique per communicator)
  std::string bind_host = "127.0.0.1";  // address to listen on (TANDEM_IFACE_ADDR overrides)
  std::chrono::milliseconds connect_timeout{30000};
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual std::unique_ptr<Request> isend(int peer, uint64_t tag, std::span<const ConstPart> parts) = 0;
  virtual std::unique_ptr<Request> irecv(int peer, uint64_t tag, std::span<const MutPart> parts) = 0;
  // Drives completions; never blocks.
  virtual void progress() = 0;
  // Retires the tags t with (t & mask) == (tag & mask) -- those of a failed communicator, which nobody
  // will receive: the messages on them that match no posted receive are dropped, now and whenever
  // they arrive later, so that their senders' transports let go of what they keep for them (ucx: the
  // copy a cancelled send goes on from, and the request). Retired tags are never received
  // again (communicator ids are not reused on a transport). Transports whose sends never wait for
  // the receiver do nothing (the default).
  virtual void drop_unexpected(uint64_t tag, uint64_t mask) {
    (void)tag;
    (void)mask;
  }
  // After a failure, collective over `peers` (transport ranks, this one among them; Communicator::shrink's survivors):
  // each publishes under `key_prefix` + rank where it is now heard and reads the others', waiting up to `timeout`,
  // so that what a failure cut between two ranks that are both alive works again. ucx: a worker left deaf by a
  // same-host death (see the lifetimes paragraph) moves to a fresh one, and its peers and it make new endpoints to
  // each other (a deaf rank's ranks not in `peers` stay cut from it). Throws kTimeout naming the rank whose address
  // did not come (one seen dead meanwhile is skipped). The other transports have nothing to mend (the default).
  virtual void reconnect(KvStore& store, const std::string& key_prefix, std::span<const int> peers,
                         std::chrono::milliseconds timeout) {
    (void)store;
    (void)key_prefix;
    (void)peers;
    (void)timeout;
  }
  // The rank to blame for what failed between this rank and `peer` (transport ranks): `peer`, unless this rank
  // itself gave the link up for want of a resource of its own -- no memory to keep a cancelled send whole (ucx
  // cuts the peer off, tcp gives the connection up; see the lifetimes paragraph above) -- then this rank. The peer
  // sees the link go and names this rank too, so both ends blame the one whose resource failed and a shrink drops
  // only that one. Holds until reconnect mends the link. The default: `peer`.
  virtual int at_fault(int peer) const { return peer; }
  // The peers (transport ranks, ascending) this rank knows are gone for good, on definitive evidence only: the peer
  // closed its transport (its goodbye), or the connection to it ended or was reset under it (end of stream, a reset,
  // a broken pipe; ucx: its process on this host exited). A deadline, a silent peer, a malformed message or a link
  // this rank gave up itself (at_fault) is no such evidence: that peer is never listed, it may be alive and slow.
  // Communicator::shrink counts the listed ranks out without waiting for them (engine/comm/membership.hpp, rule 2).
  // Drives progress first, so what the connections already say is counted; never blocks.
  //   inproc: a peer whose transport was destroyed.  tcp: its goodbye, end of stream, ECONNRESET or EPIPE.
  //   zmq: its goodbye, or ZeroMQ's monitor seeing the connection from it end (no heartbeats are set, so that is the
  //   TCP connection closing, never a timeout).  ucx: its goodbye, its pid on this host exited, or UCX failing its
  //   endpoint with UCS_ERR_CONNECTION_RESET (not UCS_ERR_ENDPOINT_TIMEOUT: keepalive's verdict is a timeout, nor a
  //   cut link: kCut, both alive). A peer that dies without any of these (another host's power lost, a network cut)
  //   is not listed: the agreement's window decides it. The default lists nobody.
  virtual std::vector<int> dead_peers() { return {}; }
  // Blocks the calling thread for at most `timeout` until this transport may have something new
  // (a message arrived, a send completed, a peer failed), then drives progress. Returning early or
  // spuriously is allowed. Use it in waiting loops instead of spinning on test(): on a machine
  // with few cores a spinning waiter starves the transport's own I/O threads (zmq). The default
  // drives progress and yields.
  virtual void wait_for_progress(std::chrono::microseconds timeout) {
    (void)timeout;
    progress();
    std::this_thread::yield();
  }
};

// Creates and connects a transport for one rank. Collective over the `size` ranks sharing the key
// prefix: every rank must call it. "auto" picks ucx when built, else tcp (inproc is never automatic
// across processes). Throws kUnsupported for an unknown name (see require_known_transport).
std::unique_ptr<Transport> create_transport(const TransportOptions& options);
// Throws kUnsupported naming `name` and the transports this library has, unless it is one of them or "auto".
void require_known_transport(const std::string& name);

// Names of the transports built into this library.
std::vector<std::string> available_transports();

}  // namespace tandem::transports
