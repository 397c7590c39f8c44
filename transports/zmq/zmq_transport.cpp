#include "transports/zmq/zmq_transport.hpp"

#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "transports/completion.hpp"
#include "transports/match_queues.hpp"
#include "transports/spin.hpp"
#include "transports/core_transport.hpp"
#include "transports/socket_setup.hpp"
#include "transports/parts.hpp"
#include "transports/zmq/wire.hpp"

namespace tandem::transports::zmq {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kIdentityBytes = 13;           // 'T', rank (4), nonce (8)
constexpr size_t kMaxSlicesPerSegment = 64;     // more slices than this are gathered into one copy
constexpr size_t kMaxFramesPerSegment = kMaxSlicesPerSegment + 1;
constexpr int kMaxSegmentsPerPoll = 16;         // per peer and progress() call
constexpr auto kMonitorInterval = std::chrono::milliseconds(2);
constexpr auto kSweepInterval = std::chrono::milliseconds(1);
// How long a cancelled or failed send waits for ZeroMQ to let go of its frames (zmq_transport.hpp).
constexpr auto kReleaseWindow = std::chrono::milliseconds(kReleaseWindowMs);
// A waiter polls before it blocks while messages flow (transports/spin.hpp): a blocked thread pays a
// wake-up per message hop on top of ZeroMQ's own two I/O-thread hops.


// Wakes a thread blocked in wait_for_progress when an IO thread completes a send. The eventfd is
// written only while someone waits: no syscall per send otherwise.
struct Waker {
  int fd = -1;
  std::atomic<int> waiters{0};
  std::atomic<uint64_t> events{0};
  void signal() noexcept {
    events.fetch_add(1);
    if (waiters.load() > 0) {
      const uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
    }
  }
};

struct SendOp {
  int peer = 0;
  uint64_t tag = 0;
  size_t bytes = 0;
  // Zero-copy frames ZeroMQ still holds, plus the sender's guard until send() has handed them all over (every path
  // out of send() drops the guard: await_release waits for this to reach 0).
  std::atomic<size_t> frames_left{1};
  Waker* waker = nullptr;               // the core's: outlives every frame (see Core::shutdown)
  Completion done;

  void release_one(bool notify) noexcept {
    if (frames_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    done.complete(bytes, false);
    if (notify && waker) waker->signal();
  }
};

// Frames reach ZeroMQ's IO threads through its lock-free queues, which sanitizers cannot see
// into: senders bump this (release) after building a segment's frames and the free callback
// reads it (acquire) first, so the hand-off is ordered in the C++ model too.
std::atomic<uint64_t> g_frame_handoff{0};

// ZeroMQ's free callback for a zero-copy frame: runs on an IO thread once the frame is written
// to the kernel (or dropped with its connection).
void release_frame(void* /*data*/, void* hint) noexcept {
  (void)g_frame_handoff.load(std::memory_order_acquire);
  std::unique_ptr<std::shared_ptr<SendOp>> ref(static_cast<std::shared_ptr<SendOp>*>(hint));
  (*ref)->release_one(true);
}

// A message being received (or fully received but not yet matched).
struct Incoming {
  int src = 0;
  uint64_t tag = 0;
  uint64_t total = 0;
  uint64_t received = 0;
  std::vector<std::pair<uint64_t, ::zmq::message_t>> stored;  // (offset, frame) while unmatched
  std::shared_ptr<RecvOp> matched;
  bool discard = false;  // its receive was cancelled mid-message: drop the rest
  bool complete() const { return received == total; }
};

enum class PeerState { kAlive, kClosed, kLost };

struct Peer {
  std::string identity;                      // its DEALER's routing id, as our ROUTER addresses it
  std::unique_ptr<::zmq::socket_t> rx;       // our DEALER, connected to its ROUTER: data from it
  std::unique_ptr<::zmq::socket_t> monitor;  // PAIR receiving rx's connection events
  int rx_fd = -1, monitor_fd = -1;           // their ZMQ_FDs, for wait_for_progress
  bool hello = false;
  PeerState state = PeerState::kAlive;
  std::string why;  // why it is no longer alive
  // Its end is known gone -- its goodbye, or the monitor saw the connection from it end -- not merely a stream this
  // rank gave up on (a malformed segment): Transport::dead_peers lists it.
  bool ended = false;
  std::shared_ptr<Incoming> current;
  std::vector<std::weak_ptr<SendOp>> in_flight;
  // Failed or cancelled sends whose frames ZeroMQ still held when their release window ran out (the peer stopped
  // taking data): later releases towards this peer do not wait again while one of them is still held.
  std::vector<std::shared_ptr<SendOp>> given_up;
};

std::string make_identity(int rank, uint64_t nonce) {
  std::string id(kIdentityBytes, '\0');
  id[0] = 'T';
  const uint32_t r = static_cast<uint32_t>(rank);
  std::memcpy(id.data() + 1, &r, 4);
  std::memcpy(id.data() + 5, &nonce, 8);
  return id;
}

// A rank's published "<endpoint> <nonce hex16>", followed by " <host id> <ipc endpoint>" when it
// also listens on a local socket; false when malformed.
struct PeerAddress {
  std::string endpoint;
  uint64_t nonce = 0;
  std::string host_id, local_endpoint;
};
bool parse_peer_address(const std::string& value, PeerAddress& out) {
  const std::vector<std::string> f = address_fields(value);
  if (f.size() != 2 && f.size() != 4) return false;
  for (const auto& x : f)
    if (x.empty()) return false;
  if (f[0].rfind("tcp://", 0) != 0 || f[1].size() != 16) return false;
  char* end = nullptr;
  out.nonce = std::strtoull(f[1].c_str(), &end, 16);
  if (*end != '\0') return false;
  out.endpoint = f[0];
  if (f.size() == 4) {
    if (f[3].rfind("ipc://@", 0) != 0) return false;
    out.host_id = f[2];
    out.local_endpoint = f[3];
  }
  return true;
}

std::string bind_address(const TransportOptions& o, bool& ipv6) {
  std::string host = o.bind_host;
  host = settings::current()->text("TANDEM_IFACE_ADDR").value_or(host);
  ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? fmt::format("tcp://[{}]:*", host) : fmt::format("tcp://{}:*", host);
}

// ZeroMQ allocates every large incoming frame (on its I/O thread) and the receiver frees it after
// copying it out. glibc then trims the arena's top (MADV_DONTNEED) and the next frame faults the
// same pages in again, zeroed: measured 173,000 page faults and 700 ms of CPU for 40 4-MiB
// exchanges, against 8,200 faults and 380 ms with an 8 MiB top pad. M_TOP_PAD is process-wide, so
// it is set only when the user asks (TANDEM_ZMQ_HEAP_PAD, bytes; unset or 0: malloc is left alone),
// and only once: the first transport that asks decides.
void retain_heap_for_frames() {
  const auto pad = static_cast<size_t>(settings::current()->integer("TANDEM_ZMQ_HEAP_PAD").value_or(0));
  if (pad == 0) return;
  static std::once_flag once;
  std::call_once(once, [pad] {
    if (::mallopt(M_TOP_PAD, static_cast<int>(pad)) != 1)
      log::debug("zmq: malloc refused a top pad of {} bytes (a sanitizer's allocator?)", pad);
  });
}

int io_threads_from_env() {
  return static_cast<int>(settings::current()->integer("TANDEM_ZMQ_IO_THREADS").value_or(1));  // [1, 64]
}

::zmq::message_t header_frame(Kind kind, int src, uint64_t tag, uint64_t total, uint64_t offset, uint64_t seg) {
  WireHeader h;
  h.kind = static_cast<uint16_t>(kind);
  h.src = src;
  h.tag = tag;
  h.total = total;
  h.offset = offset;
  h.seg_bytes = seg;
  return ::zmq::message_t(&h, sizeof h);
}

// Receives the remaining frames of a multipart message (all of it is already queued locally).
// Keeps at most `keep` frames; returns false when there were more (they are read and dropped).
bool recv_rest(::zmq::socket_t& s, const ::zmq::message_t& first, std::vector<::zmq::message_t>& out, size_t keep) {
  bool more = first.more(), fits = true;
  while (more) {
    ::zmq::message_t m;
    if (!s.recv(m, ::zmq::recv_flags::dontwait)) break;
    more = m.more();
    if (out.size() < keep) out.push_back(std::move(m));
    else fits = false;
  }
  return fits;
}

class Core {
 public:
  explicit Core(const TransportOptions& o);
  ~Core() { shutdown(); }

  int rank() const { return rank_; }
  int size() const { return size_; }

  std::shared_ptr<SendOp> send(int peer, uint64_t tag, std::span<const ConstPart> parts);
  std::shared_ptr<RecvOp> recv(int peer, uint64_t tag, std::span<const MutPart> parts);
  void progress();
  std::vector<int> dead_peers();  // Transport::dead_peers
  void wait_for_progress(std::chrono::microseconds timeout);
  void cancel(const std::shared_ptr<RecvOp>& op);
  void cancel(const std::shared_ptr<SendOp>& op);
  // A finished send's request is released: a failed one returns only once ZeroMQ let go of its frames.
  void release(const std::shared_ptr<SendOp>& op) noexcept { await_release(op); }
  void shutdown() noexcept;

 private:
  void connect(const TransportOptions& o);
  // Returns once ZeroMQ holds no frame of `op` (every free callback ran), driving progress meanwhile: at most
  // kReleaseWindow, and at once towards a peer on which an earlier wait gave up while that send is still held.
  void await_release(const std::shared_ptr<SendOp>& op) noexcept;
  void send_segments(Peer& p, SendOp& op, const std::shared_ptr<SendOp>& ref, std::span<const ConstPart> parts);
  void send_frames(const std::string& identity, std::vector<::zmq::message_t>& frames);
  void deliver_self(uint64_t tag, std::span<const ConstPart> parts, size_t total);
  // Returns false when it stopped at max_segments with more possibly queued.
  bool drain_peer(int peer, int max_segments);
  void handle_segment(int peer, std::vector<::zmq::message_t>& frames);
  void start_incoming(int peer, const WireHeader& h);
  // `ended`: the peer's end is known gone (Peer::ended; a goodbye, kClosed, always is).
  void peer_gone(int peer, PeerState state, const std::string& why, bool ended = false);
  void check_monitors();
  // Reads what arrived on our ROUTER: hellos during connection, only strays afterwards.
  void drain_router();
  void log_stray(const std::string& what);
  // Drives progress; while messages flow, keeps polling (yielding) for up to the spin time.
  // Returns whether something arrived or a send completed meanwhile.
  bool spin(std::chrono::microseconds timeout);

  std::mutex mu_;
  const int rank_, size_;
  bool closed_ = false;
  ::zmq::context_t ctx_;
  std::unique_ptr<::zmq::socket_t> tx_;  // ROUTER: every send leaves through it
  std::vector<Peer> peers_;
  MatchQueues<RecvOp, Incoming> match_;
  Clock::time_point next_monitor_check_{};
  Clock::time_point next_sweep_{};
  Waker waker_;                      // eventfd written when a zero-copy send completes on an IO thread
  std::atomic<uint64_t> waker_seen_{0};  // waker_.events at the end of the last wait_for_progress
  bool backlog_ = false;             // the last progress() left segments queued
  std::vector<char> more_;           // per peer: its drain stopped early, more may be queued
  std::vector<pollfd> poll_fds_;     // the live peers' rx ZMQ_FDs (rebuilt when one goes)
  std::vector<int> poll_peers_;
  bool poll_dirty_ = true;
  size_t strays_ = 0;
  int rr_ = 0;
  // Segments handled and peers lost (with waker_.events: what a spinning waiter watches), and when
  // the last segment arrived (steady clock, ns).
  std::atomic<uint64_t> arrivals_{0};
  Spinner spinner_{spin_from_env("TANDEM_ZMQ_SPIN_US")};
};

Core::Core(const TransportOptions& o) : rank_(o.rank), size_(o.size), ctx_(io_threads_from_env()), peers_(o.size) {
  TANDEM_REQUIRE(o.store != nullptr, "zmq: rank {} needs a KvStore to exchange addresses", o.rank);
  retain_heap_for_frames();
  more_.assign(size_, 0);
  waker_.fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TANDEM_CHECK(waker_.fd >= 0, Status::kTransport, "zmq: rank {} cannot create an eventfd: {}", rank_,
               std::strerror(errno));
  try {
    connect(o);
  } catch (const ::zmq::error_t& e) {
    shutdown();
    TANDEM_THROW(Status::kTransport, "zmq: rank {} could not connect (key prefix '{}'): {}", rank_, o.key_prefix,
                 e.what());
  } catch (...) {
    shutdown();
    throw;
  }
}

void Core::connect(const TransportOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  bool ipv6 = false;
  const std::string bind = bind_address(o, ipv6);
  tx_ = std::make_unique<::zmq::socket_t>(ctx_, ::zmq::socket_type::router);
  tx_->set(::zmq::sockopt::router_mandatory, 1);
  tx_->set(::zmq::sockopt::sndhwm, 0);
  tx_->set(::zmq::sockopt::maxmsgsize, int64_t{1024});  // only hellos arrive here
  tx_->set(::zmq::sockopt::linger, kLingerMs);
  if (ipv6) tx_->set(::zmq::sockopt::ipv6, 1);
  try {
    tx_->bind(bind);
  } catch (const ::zmq::error_t& e) {
    TANDEM_THROW(Status::kTransport, "zmq: rank {} cannot bind {}: {}", rank_, bind, e.what());
  }
  const std::string endpoint = tx_->get(::zmq::sockopt::last_endpoint);
  const uint64_t nonce = random_nonce();
  std::string published = fmt::format("{} {:016x}", endpoint, nonce);
  // Ranks of this host also find us on a local socket (ZeroMQ's ipc transport, abstract name).
  const std::string host_id = local_sockets_setting("TANDEM_ZMQ_LOCAL", "ipc") ? local_host_id() : "";
  if (!host_id.empty()) {
    const std::string local = fmt::format("ipc://@tandem-zmq-{}-{:016x}", ::getpid(), nonce);
    try {
      tx_->bind(local);
      published += fmt::format(" {} {}", host_id, local);
    } catch (const ::zmq::error_t& e) {
      log::warn("zmq: rank {} cannot bind {} ({}); ranks of this host connect over TCP", rank_, local, e.what());
    }
  }
  const std::string key_base = o.key_prefix + "/zmq/";
  o.store->set(key_base + std::to_string(rank_), published);
  const std::string my_identity = make_identity(rank_, nonce);

  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const std::string value = o.store->get(key_base + std::to_string(p), std::max(left, std::chrono::milliseconds(1)));
    PeerAddress addr;
    TANDEM_CHECK(parse_peer_address(value, addr), Status::kTransport,
                 "zmq: rank {} read a malformed address for rank {} from the store: '{}'", rank_, p, value);
    const uint64_t peer_nonce = addr.nonce;
    Peer& peer = peers_[p];
    peer.identity = make_identity(p, peer_nonce);
    peer.rx = std::make_unique<::zmq::socket_t>(ctx_, ::zmq::socket_type::dealer);
    peer.rx->set(::zmq::sockopt::routing_id, my_identity);
    peer.rx->set(::zmq::sockopt::rcvhwm, 0);
    peer.rx->set(::zmq::sockopt::maxmsgsize, static_cast<int64_t>(std::max(kSegmentBytes, sizeof(WireHeader))));
    // Reconnection stays on: with it off, ZeroMQ terminates the endpoint on disconnect and drops
    // the frames not yet read. The socket is closed instead once the peer is known to be gone.
    peer.rx->set(::zmq::sockopt::reconnect_ivl, 200);
    peer.rx->set(::zmq::sockopt::linger, 0);
    if (ipv6) peer.rx->set(::zmq::sockopt::ipv6, 1);
    const std::string mon = fmt::format("inproc://tandem-zmq-monitor-{}", p);
    TANDEM_CHECK(zmq_socket_monitor(peer.rx->handle(), mon.c_str(), ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED) == 0,
                 Status::kTransport, "zmq: rank {} cannot monitor its connection to rank {}: {}", rank_, p,
                 zmq_strerror(zmq_errno()));
    peer.monitor = std::make_unique<::zmq::socket_t>(ctx_, ::zmq::socket_type::pair);
    peer.monitor->connect(mon);
    const bool local = !host_id.empty() && addr.host_id == host_id;
    peer.rx->connect(local ? addr.local_endpoint : addr.endpoint);
    peer.rx_fd = peer.rx->get(::zmq::sockopt::fd);
    peer.monitor_fd = peer.monitor->get(::zmq::sockopt::fd);
    ::zmq::message_t hello = header_frame(Kind::kHello, rank_, 0, 0, 0, 0);
    peer.rx->send(hello, ::zmq::send_flags::dontwait);
  }

  // Every peer's DEALER announces itself; only then can our ROUTER address it.
  for (;;) {
    drain_router();
    std::string missing;
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !peers_[p].hello) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", p);
    if (missing.empty()) break;
    TANDEM_CHECK(Clock::now() < deadline, Status::kTimeout,
                 "zmq: rank {} did not hear from rank(s) {} within {} ms (key prefix '{}')", rank_, missing,
                 o.connect_timeout.count(), o.key_prefix);
    ::zmq::pollitem_t item{tx_->handle(), 0, ZMQ_POLLIN, 0};
    try {
      ::zmq::poll(&item, 1, std::chrono::milliseconds(10));
    } catch (const ::zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // a signal delivered to this thread: look again
    }
  }
  // Read every DEALER dry once: its pipe's reader is then asleep, so the next message signals
  // the socket's ZMQ_FD (progress() polls those).
  for (int p = 0; p < size_; ++p)
    if (p != rank_) drain_peer(p, std::numeric_limits<int>::max());
  log::debug("zmq: rank {} of {} connected, sending from {}", rank_, size_, endpoint);
}

void Core::log_stray(const std::string& what) {
  ++strays_;
  if (strays_ <= 10 || strays_ % 1000 == 0)
    log::warn("zmq: rank {} dropped a message from an unknown connection ({} so far): {}", rank_, strays_, what);
}

void Core::drain_router() {
  for (int n = 0; n < 1024; ++n) {
    ::zmq::message_t id;
    if (!tx_->recv(id, ::zmq::recv_flags::dontwait)) return;
    std::vector<::zmq::message_t> frames;
    const bool fits = recv_rest(*tx_, id, frames, 2);
    WireHeader h;
    std::string why = !fits || frames.size() != 1 ? "not a single header frame"
                      : check_header(frames[0].data(), frames[0].size(), size_, h);
    if (why.empty() && h.kind != static_cast<uint16_t>(Kind::kHello)) why = "not a hello";
    if (why.empty() && (h.src == rank_ || id.to_string() != peers_[h.src].identity))
      why = fmt::format("routing id does not match rank {}'s", h.src);
    if (!why.empty()) {
      log_stray(why);
      continue;
    }
    peers_[h.src].hello = true;
  }
}

void Core::send_frames(const std::string& identity, std::vector<::zmq::message_t>& frames) {
  // The high-water mark is off, so would-block (a null result) cannot happen short of a bug.
  if (!tx_->send(::zmq::buffer(identity), ::zmq::send_flags::sndmore | ::zmq::send_flags::dontwait))
    throw ::zmq::error_t();
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto more = i + 1 < frames.size() ? ::zmq::send_flags::sndmore : ::zmq::send_flags::none;
    if (!tx_->send(frames[i], more | ::zmq::send_flags::dontwait)) throw ::zmq::error_t();
  }
}

void Core::send_segments(Peer& p, SendOp& op, const std::shared_ptr<SendOp>& ref, std::span<const ConstPart> parts) {
  const size_t total = op.bytes;
  if (total <= kCopyBytes) {  // one segment, copied: the send is complete once queued
    std::vector<::zmq::message_t> frames;
    frames.push_back(header_frame(Kind::kData, rank_, op.tag, total, 0, total));
    if (total > 0) {
      frames.emplace_back(total);
      scatter_copy(parts, std::span<const MutPart>(std::array{MutPart{frames.back().data(), total}}));
    }
    send_frames(p.identity, frames);
    return;
  }
  size_t pi = 0, poff = 0;  // position in parts
  for (size_t off = 0; off < total; off += kSegmentBytes) {
    const size_t seg = std::min(kSegmentBytes, total - off);
    // The slices of the parts that cover [off, off + seg).
    std::vector<ConstPart> slices;
    for (size_t left = seg; left > 0;) {
      while (poff == parts[pi].bytes) {
        ++pi;
        poff = 0;
      }
      const size_t n = std::min(left, parts[pi].bytes - poff);
      slices.push_back({static_cast<const char*>(parts[pi].data) + poff, n});
      poff += n;
      left -= n;
    }
    std::vector<::zmq::message_t> frames;
    frames.push_back(header_frame(Kind::kData, rank_, op.tag, total, off, seg));
    if (slices.size() > kMaxSlicesPerSegment) {
      frames.emplace_back(seg);
      scatter_copy(slices, std::span<const MutPart>(std::array{MutPart{frames.back().data(), seg}}));
    } else {
      for (const auto& s : slices) {
        auto hint = std::make_unique<std::shared_ptr<SendOp>>(ref);
        op.frames_left.fetch_add(1, std::memory_order_relaxed);
        frames.emplace_back(const_cast<void*>(s.data), s.bytes, &release_frame, hint.release());
      }
      g_frame_handoff.fetch_add(1, std::memory_order_release);
    }
    send_frames(p.identity, frames);
  }
}

void Core::deliver_self(uint64_t tag, std::span<const ConstPart> parts, size_t total) {
  if (std::shared_ptr<RecvOp> r = match_.take_posted({rank_, tag})) {
    scatter_copy(parts, r->parts);
    r->done.complete(total, total > r->capacity);
    return;
  }
  auto inc = std::make_shared<Incoming>();
  inc->src = rank_;
  inc->tag = tag;
  inc->total = inc->received = total;
  if (total > 0) {
    ::zmq::message_t copy(total);
    scatter_copy(parts, std::span<const MutPart>(std::array{MutPart{copy.data(), total}}));
    inc->stored.emplace_back(0, std::move(copy));
  }
  match_.stash({rank_, tag}, std::move(inc));
}

std::shared_ptr<SendOp> Core::send(int peer, uint64_t tag, std::span<const ConstPart> parts) {
  auto op = std::make_shared<SendOp>();
  op->peer = peer;
  op->tag = tag;
  op->bytes = total_bytes(parts);
  op->waker = &waker_;
  std::lock_guard lock(mu_);
  if (closed_) {
    op->done.fail(Status::kTransport, fmt::format("zmq: rank {} sends to rank {} on a destroyed transport", rank_, peer));
    op->frames_left.store(0, std::memory_order_release);
    return op;
  }
  if (peer == rank_) {
    deliver_self(tag, parts, op->bytes);
    op->release_one(false);  // the guard: nothing was handed to ZeroMQ, the send completes now
    return op;
  }
  Peer& p = peers_[peer];
  if (p.state != PeerState::kAlive) {
    op->done.fail(Status::kPeerFailure, fmt::format("zmq: send to rank {} tag {}: {}", peer, tag, p.why));
    op->frames_left.store(0, std::memory_order_release);
    return op;
  }
  try {
    send_segments(p, *op, op, parts);
  } catch (const ::zmq::error_t& e) {
    const bool gone = e.num() == EHOSTUNREACH;
    op->done.fail(gone ? Status::kPeerFailure : Status::kTransport,
                  fmt::format("zmq: send to rank {} tag {} failed: {}", peer, tag,
                              gone ? fmt::format("rank {} is no longer connected", peer) : std::string(e.what())));
  }
  op->release_one(false);  // the sender's guard: completes now unless frames are still in flight
  if (op->done.pending()) {
    std::erase_if(p.in_flight, [](const std::weak_ptr<SendOp>& w) { return w.expired(); });
    p.in_flight.push_back(op);
  }
  return op;
}

std::shared_ptr<RecvOp> Core::recv(int peer, uint64_t tag, std::span<const MutPart> parts) {
  auto op = make_recv_op(peer, tag, parts);
  std::lock_guard lock(mu_);
  if (closed_) {
    op->done.fail(Status::kTransport,
                  fmt::format("zmq: rank {} receives from rank {} on a destroyed transport", rank_, peer));
    return op;
  }
  const bool gone = peer != rank_ && peers_[peer].state != PeerState::kAlive;
  match_receive(match_, op, gone ? &peers_[peer].why : nullptr, "zmq", [&](Incoming& inc) {
    for (auto& [off, frame] : inc.stored) copy_into_at(op->parts, off, frame.data(), frame.size());
    inc.stored.clear();  // the rest is copied straight into our parts as it arrives
  });
  return op;
}

void Core::start_incoming(int peer, const WireHeader& h) {
  auto inc = std::make_shared<Incoming>();
  inc->src = peer;
  inc->tag = h.tag;
  inc->total = h.total;
  inc->matched = match_.take_posted({peer, h.tag});
  if (!inc->matched) match_.stash({peer, h.tag}, inc);
  peers_[peer].current = std::move(inc);
}

void Core::handle_segment(int peer, std::vector<::zmq::message_t>& frames) {
  Peer& p = peers_[peer];
  arrivals_.fetch_add(1, std::memory_order_relaxed);
  spinner_.note_arrival();
  WireHeader h;
  std::string why = check_header(frames[0].data(), frames[0].size(), size_, h);
  if (why.empty() && h.src != peer) why = fmt::format("claims to come from rank {}", h.src);
  if (why.empty() && h.kind == static_cast<uint16_t>(Kind::kGoodbye)) {
    peer_gone(peer, PeerState::kClosed, fmt::format("rank {} closed its transport", peer));
    return;
  }
  if (why.empty() && h.kind != static_cast<uint16_t>(Kind::kData)) why = "unexpected segment kind";
  if (why.empty()) {
    uint64_t sum = 0;
    for (size_t i = 1; i < frames.size(); ++i) sum += frames[i].size();
    if (sum != h.seg_bytes) why = fmt::format("segment declares {} bytes but carries {}", h.seg_bytes, sum);
  }
  if (why.empty()) {
    if (h.offset == 0 && !p.current) start_incoming(peer, h);
    else if (!p.current || p.current->tag != h.tag || p.current->total != h.total || p.current->received != h.offset)
      why = fmt::format("segment at offset {} of tag {} does not continue the message in progress", h.offset, h.tag);
  }
  if (!why.empty()) {
    // Our connections reach only the ranks named in the store; a malformed stream from one of
    // them cannot be resynchronised, so the peer is failed rather than trusted further.
    log::error("zmq: rank {} got a malformed segment from rank {}: {}", rank_, peer, why);
    peer_gone(peer, PeerState::kLost, fmt::format("rank {} sent a malformed segment ({})", peer, why));
    return;
  }
  Incoming& inc = *p.current;
  uint64_t off = h.offset;
  for (size_t i = 1; i < frames.size(); ++i) {
    const size_t n = frames[i].size();
    if (inc.matched) copy_into_at(inc.matched->parts, off, frames[i].data(), n);
    else if (!inc.discard) inc.stored.emplace_back(off, std::move(frames[i]));
    off += n;
  }
  inc.received += h.seg_bytes;
  if (inc.complete()) {
    if (inc.matched) inc.matched->done.complete(inc.total, inc.total > inc.matched->capacity);
    inc.matched.reset();
    p.current.reset();
  }
}

bool Core::drain_peer(int peer, int max_segments) {
  Peer& p = peers_[peer];
  for (int n = 0; n < max_segments; ++n) {
    if (!p.rx || p.state != PeerState::kAlive) return true;
    ::zmq::message_t head;
    if (!p.rx->recv(head, ::zmq::recv_flags::dontwait)) return true;
    std::vector<::zmq::message_t> frames;
    frames.push_back(std::move(head));
    if (!recv_rest(*p.rx, frames[0], frames, kMaxFramesPerSegment)) {
      log::error("zmq: rank {} got a segment with more than {} frames from rank {}", rank_, kMaxFramesPerSegment, peer);
      peer_gone(peer, PeerState::kLost, fmt::format("rank {} sent a segment with too many frames", peer));
      return true;
    }
    handle_segment(peer, frames);
  }
  return false;
}

void Core::peer_gone(int peer, PeerState state, const std::string& why, bool ended) {
  Peer& p = peers_[peer];
  if (p.state != PeerState::kAlive) return;
  p.state = state;
  p.why = why;
  p.ended = ended || state == PeerState::kClosed;
  if (p.current) {
    if (p.current->matched)
      p.current->matched->done.fail(Status::kPeerFailure,
                                    fmt::format("zmq: receive from rank {} tag {}: {} mid-message", peer,
                                                p.current->tag, why));
    match_.forget_stashed({peer, p.current->tag}, p.current);
    p.current.reset();
  }
  match_.drain_posted(peer, [&](const MatchKey&, const std::shared_ptr<RecvOp>& r) {
    r->done.fail(Status::kPeerFailure, fmt::format("zmq: receive from rank {} tag {}: {}", peer, r->tag, why));
  });
  for (auto& w : p.in_flight)
    if (auto s = w.lock()) s->done.fail(Status::kPeerFailure, fmt::format("zmq: send to rank {} tag {}: {}", peer, s->tag, why));
  p.in_flight.clear();
  if (p.rx) zmq_socket_monitor(p.rx->handle(), nullptr, 0);
  p.monitor.reset();
  p.rx.reset();
  p.rx_fd = p.monitor_fd = -1;
  poll_dirty_ = true;
  arrivals_.fetch_add(1, std::memory_order_relaxed);
  if (state == PeerState::kLost) log::warn("zmq: rank {}: {}", rank_, why);
}

void Core::check_monitors() {
  for (int peer = 0; peer < size_; ++peer) {
    Peer& p = peers_[peer];
    while (p.monitor) {  // peer_gone closes it
      ::zmq::message_t event;
      if (!p.monitor->recv(event, ::zmq::recv_flags::dontwait)) break;
      std::vector<::zmq::message_t> rest;
      recv_rest(*p.monitor, event, rest, 1);
      uint16_t id = 0;
      if (event.size() >= 2) std::memcpy(&id, event.data(), 2);
      if ((id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_CLOSED) && p.state == PeerState::kAlive) {
        drain_peer(peer, std::numeric_limits<int>::max());  // what it sent before it went
        // No heartbeats are set: ZeroMQ reports a disconnect only when the connection itself ended.
        peer_gone(peer, PeerState::kLost,
                  fmt::format("rank {} disconnected (its process died or its connection failed)", peer), true);
      }
    }
  }
}

void Core::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || closed_) return;  // another thread is already driving it
  try {
    // One poll() over the peers' ZMQ_FDs instead of an empty recv (a syscall each) per peer. A
    // ZMQ_FD turns readable when its socket gets a command (a message after the pipe ran dry);
    // a peer whose drain stopped early is read again without waiting for one.
    if (poll_dirty_) {
      poll_fds_.clear();
      poll_peers_.clear();
      for (int peer = 0; peer < size_; ++peer)
        if (peers_[peer].rx_fd >= 0) {
          poll_fds_.push_back({peers_[peer].rx_fd, POLLIN, 0});
          poll_peers_.push_back(peer);
        }
      poll_dirty_ = false;
    }
    // A ZMQ_FD only signals a message that finds its pipe's reader asleep (it ran dry before):
    // a sweep of every peer each kSweepInterval covers whatever that misses.
    const auto now = Clock::now();
    const bool sweep = now >= next_sweep_;
    if (sweep) next_sweep_ = now + kSweepInterval;
    const int ready = sweep ? -1 : ::poll(poll_fds_.data(), poll_fds_.size(), 0);  // < 0: read them all
    backlog_ = false;
    const size_t n = poll_fds_.size();
    for (size_t i = 0; i < n; ++i) {
      const size_t k = (rr_ + i) % n;
      const int peer = poll_peers_[k];
      if (!more_[peer] && ready >= 0 && !(poll_fds_[k].revents & (POLLIN | POLLERR | POLLHUP))) continue;
      more_[peer] = !drain_peer(peer, kMaxSegmentsPerPoll);
      backlog_ = backlog_ || more_[peer];
      if (poll_dirty_) break;  // a peer went: the table changed under us
    }
    if (n > 0) rr_ = (rr_ + 1) % static_cast<int>(n);
    if (now >= next_monitor_check_) {
      next_monitor_check_ = now + kMonitorInterval;
      check_monitors();
      drain_router();
    }
  } catch (const ::zmq::error_t& e) {
    TANDEM_THROW(Status::kTransport, "zmq: rank {} progress failed: {}", rank_, e.what());
  }
}

std::vector<int> Core::dead_peers() {
  progress();  // reads the goodbyes and the monitors' events already there
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && peers_[p].ended) out.push_back(p);
  return out;
}

bool Core::spin(std::chrono::microseconds timeout) {
  return spinner_.spin([&] { progress(); },
                       [&] { return arrivals_.load(std::memory_order_relaxed) + waker_.events.load(std::memory_order_relaxed); },
                       timeout);
}

void Core::wait_for_progress(std::chrono::microseconds timeout) {
  if (spin(timeout)) return;
  std::vector<pollfd> fds;
  {
    std::lock_guard lock(mu_);
    if (closed_ || backlog_) return;
    fds.push_back({waker_.fd, POLLIN, 0});
    // A ZMQ_FD is readable while its socket has unprocessed commands (a new message, a
    // connection event); progress() above consumed them, so anything new wakes the poll.
    for (const auto& p : peers_) {
      if (p.rx_fd >= 0) fds.push_back({p.rx_fd, POLLIN, 0});
      if (p.monitor_fd >= 0) fds.push_back({p.monitor_fd, POLLIN, 0});
    }
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Announce the wait, then look for sends completed since the last one: either the IO thread
  // sees the waiter and writes the eventfd, or we see its event count (both sequentially consistent).
  waker_.waiters.fetch_add(1);
  const uint64_t events = waker_.events.load();
  if (waker_seen_.exchange(events) == events && ::ppoll(fds.data(), fds.size(), &ts, nullptr) > 0 &&
      (fds[0].revents & POLLIN)) {
    uint64_t count;
    [[maybe_unused]] auto n = ::read(waker_.fd, &count, sizeof count);
  }
  waker_.waiters.fetch_sub(1);
  progress();
}

void Core::cancel(const std::shared_ptr<RecvOp>& op) {
  std::lock_guard lock(mu_);
  cancel_receive(match_, op, op->peer != rank_ ? &peers_[op->peer].current : nullptr, "zmq");
}

void Core::cancel(const std::shared_ptr<SendOp>& op) {
  {
    std::lock_guard lock(mu_);
    op->done.fail(Status::kTransport, fmt::format("zmq: send to rank {} tag {} was cancelled", op->peer, op->tag));
  }
  await_release(op);
}

void Core::await_release(const std::shared_ptr<SendOp>& op) noexcept {
  if (op->frames_left.load(std::memory_order_acquire) == 0) return;
  const auto held = [&] {
    // Its frames still sit in ZeroMQ (the peer takes no data): they may be written to the peer later on, until the
    // transport is destroyed (which then drops them, see shutdown()).
    log::error("zmq: rank {}: a cancelled or failed send to rank {} (tag {}, {} bytes) is still queued in ZeroMQ "
               "after {} ms; rank {} takes no data. Its buffer must stay valid until this transport is destroyed",
               rank_, op->peer, op->tag, op->bytes, kReleaseWindow.count(), op->peer);
  };
  {
    std::lock_guard lock(mu_);
    if (closed_) return;  // shutdown() closed the context: every frame was released
    auto& given_up = peers_[op->peer].given_up;
    std::erase_if(given_up, [](const std::shared_ptr<SendOp>& s) { return s->frames_left.load() == 0; });
    if (!given_up.empty()) {
      given_up.push_back(op);
      held();
      return;
    }
  }
  const auto until = Clock::now() + kReleaseWindow;
  try {
    // Keep the transport progressing: a live peer's data is written by ZeroMQ's I/O thread on its own, but the
    // frames queued for a dead peer are dropped only once our socket has seen its connection go (progress() reads
    // the ROUTER, which processes ZeroMQ's commands).
    while (op->frames_left.load(std::memory_order_acquire) > 0) {
      if (Clock::now() >= until) {
        std::lock_guard lock(mu_);
        if (closed_) return;
        peers_[op->peer].given_up.push_back(op);
        held();
        return;
      }
      wait_for_progress(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    log::error("zmq: rank {}: progress failed while a cancelled send to rank {} was waited for: {}", rank_, op->peer,
               e.what());
  }
}

void Core::shutdown() noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  try {
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[peer];
      if (peer == rank_ || !p.hello || p.state != PeerState::kAlive) continue;
      std::vector<::zmq::message_t> bye;
      bye.push_back(header_frame(Kind::kGoodbye, rank_, 0, 0, 0, 0));
      try {
        send_frames(p.identity, bye);
      } catch (const ::zmq::error_t&) {
        // already disconnected: nothing to tell
      }
    }
    const std::string gone = fmt::format("zmq: rank {} destroyed its transport", rank_);
    match_.drain_posted(-1, [&](const MatchKey& key, const std::shared_ptr<RecvOp>& r) {
      r->done.fail(Status::kTransport, fmt::format("{}; receive from rank {} tag {} cancelled", gone, key.peer, key.tag));
    });
    for (auto& p : peers_) {
      for (auto& w : p.in_flight)
        if (auto s = w.lock()) s->done.fail(Status::kTransport, fmt::format("{}; send to rank {} tag {} cancelled", gone, s->peer, s->tag));
      if (p.current && p.current->matched) p.current->matched->done.fail(Status::kTransport, gone);
      p.current.reset();
      if (p.rx) {
        zmq_socket_monitor(p.rx->handle(), nullptr, 0);
        // Our hello may still be queued on the DEALER (its connection comes up on its own, after
        // the peer's hello reached us): a live peer must still get it, or that peer -- still in its
        // own connection setup -- would wait for us until its deadline and fail naming us
        // instead of seeing our goodbye.
        if (p.hello && p.state == PeerState::kAlive) p.rx->set(::zmq::sockopt::linger, kLingerMs);
      }
      p.monitor.reset();
      p.rx.reset();
    }
  } catch (const std::exception& e) {
    log::error("zmq: rank {} shutdown: {}", rank_, e.what());
  }
  // Lingers at most kLingerMs for queued segments (the goodbyes included) -- unless no live peer is
  // left to take them: segments queued for a closed or lost rank can never leave (destroying the
  // transport then waited the whole linger).
  // A send given up on (a peer that took no data, see await_release) was reported failed to its caller, who may have
  // freed its buffer since: its frames must never be written, so nothing lingers then.
  const bool someone_listens = std::any_of(peers_.begin(), peers_.end(), [&](const Peer& p) {
    return &p != &peers_[rank_] && p.hello && p.state == PeerState::kAlive;
  });
  const bool abandoned = std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) {
    return std::any_of(p.given_up.begin(), p.given_up.end(),
                       [](const std::shared_ptr<SendOp>& s) { return s->frames_left.load() > 0; });
  });
  try {
    if (tx_) tx_->set(::zmq::sockopt::linger, someone_listens && !abandoned ? kLingerMs : 0);
  } catch (const ::zmq::error_t&) {
  }
  tx_.reset();
  ctx_.close();  // returns once every socket is closed and ZeroMQ has released every frame
  if (waker_.fd >= 0) ::close(waker_.fd);  // no frame is left to signal it
  waker_.fd = -1;
}

}  // namespace

std::unique_ptr<Transport> create(const TransportOptions& options) {
  return std::make_unique<CoreTransport<Core, SendOp, RecvOp>>("zmq", Capabilities{}, options);
}

}  // namespace tandem::transports::zmq
