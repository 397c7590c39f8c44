#include "transports/tcp/tcp_transport.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "transports/completion.hpp"
#include "transports/core_transport.hpp"
#include "transports/socket_setup.hpp"
#include "transports/match_queues.hpp"
#include "transports/spin.hpp"
#include "transports/parts.hpp"
#include "transports/tcp/shm_ring.hpp"
#include "transports/tcp/wire.hpp"

namespace tandem::transports::tcp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kStageBytes = 256 * 1024;      // per-peer staging buffer
constexpr size_t kLookahead = 16 * 1024;        // read past a small payload for the next headers
constexpr size_t kReadBudget = size_t{8} << 20;  // per peer and progress() call: fairness
constexpr uint64_t kFrameLimit = uint64_t{1} << 40;
constexpr uint64_t kDefaultMaxUnexpected = uint64_t{4} << 30;
constexpr auto kHelloTimeout = std::chrono::milliseconds(2000);

std::string errno_text(int e) { return std::strerror(e); }


struct SendOp {
  int peer = 0;
  uint64_t tag = 0;
  size_t bytes = 0;
  FrameHeader header;
  std::vector<iovec> iov;  // the header, then the non-empty parts; the front is consumed as written
  size_t iov_at = 0;
  bool started = false;  // bytes of it are on the wire: it must be finished (a frame cannot be recalled)
  // Set when it was cancelled after it started: the unwritten rest, which `iov` then covers alone,
  // so that the caller's parts are no longer read (transport.hpp).
  std::unique_ptr<unsigned char[]> rest;
  Completion done;
};

// A message being received, or received but not yet matched.
struct Incoming {
  uint64_t tag = 0;
  uint64_t total = 0;
  uint64_t received = 0;
  std::unique_ptr<unsigned char[]> data;  // unmatched: the message as it arrives
  std::shared_ptr<RecvOp> matched;
  bool discard = false;  // its receive was cancelled mid-message, or the transport is closing
  bool complete() const { return received == total; }
};

enum class PeerState { kAlive, kClosed, kLost };

struct Peer {
  int fd = -1;
  PeerState state = PeerState::kAlive;
  std::string why;
  std::deque<std::shared_ptr<SendOp>> sendq;
  std::unique_ptr<unsigned char[]> stage;
  size_t stage_begin = 0, stage_end = 0;
  std::shared_ptr<Incoming> current;  // the message whose payload is being read
  bool more = false;                  // the last read stopped on its budget: data may be waiting
  bool local = false;                 // a local (AF_UNIX) socket: the peer shares this host
  // Shared memory with a peer of this host: frames go through its rings, the socket carries only
  // wake-ups and the end of stream.
  std::unique_ptr<ShmChannel> shm;
  bool gave_up = false;  // this rank gave the connection up for want of memory (keep_rest): its fault (at_fault)
  // The peer's end is known gone -- its goodbye, end of stream, a reset or a broken pipe -- not merely a stream this
  // rank gave up on (a malformed frame, its own memory): Transport::dead_peers lists it.
  bool ended = false;
};

// How ranks of one host reach each other (TANDEM_TCP_LOCAL).
enum class LocalPath { kShm, kUnix, kTcp };

LocalPath local_path_from_env() {
  const auto v = settings::current()->text("TANDEM_TCP_LOCAL");  // checked: shm, unix or tcp
  return !v || *v == "shm" ? LocalPath::kShm : *v == "unix" ? LocalPath::kUnix : LocalPath::kTcp;
}

uint64_t max_unexpected_from_env() {
  static_assert(kFrameLimit == uint64_t{1} << 40, "the registry bounds TANDEM_TCP_MAX_UNEXPECTED to [0, 2^40]");
  const auto v = settings::current()->integer("TANDEM_TCP_MAX_UNEXPECTED");
  return v ? static_cast<uint64_t>(*v) : kDefaultMaxUnexpected;
}

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

std::string listen_host(const TransportOptions& o) {
  return settings::current()->text("TANDEM_IFACE_ADDR").value_or(o.bind_host);
}

// Resolves host:port (numeric or a name) to a socket address.
sockaddr_storage resolve(const std::string& host, uint16_t port, socklen_t& len, int rank) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string h = host == "*" ? "0.0.0.0" : host;
  const int rc = ::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res);
  TANDEM_CHECK(rc == 0 && res, Status::kTransport, "tcp: rank {} cannot resolve '{}': {}", rank, host,
               rc ? gai_strerror(rc) : "no address");
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Writes all of `bytes` to a non-blocking socket before `deadline`; false when it could not.
bool write_all(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pf{fd, POLLOUT, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 100)));
  }
  return true;
}

// Writes `bytes` of `data` like write_all, passing `fd` (SCM_RIGHTS) with its first bytes.
bool write_all_with_fd(int sock, const void* data, size_t bytes, int fd, Clock::time_point deadline) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec v{const_cast<void*>(data), bytes};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n > 0)
      return write_all(sock, static_cast<const unsigned char*>(data) + n, bytes - static_cast<size_t>(n), deadline);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pf{sock, POLLOUT, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 100)));
  }
}

// A rank's published "<host> <port> <nonce hex16>", followed by " <host id> <local socket name>"
// when it also listens on a local socket, and then " shm" when it takes shared memory over it;
// false when malformed.
struct Address {
  std::string host;
  uint16_t port = 0;
  uint64_t nonce = 0;
  std::string host_id;     // empty: no local socket
  std::string local_name;  // abstract AF_UNIX name
  bool shm = false;
};
bool parse_address(const std::string& value, Address& out) {
  const std::vector<std::string> f = address_fields(value);
  if ((f.size() != 3 && f.size() != 5 && f.size() != 6) || f[0].empty()) return false;
  if (f.size() == 6 && f[5] != "shm") return false;
  for (const auto& x : f)
    if (x.empty()) return false;
  char* end = nullptr;
  const unsigned long port = std::strtoul(f[1].c_str(), &end, 10);
  if (*end != '\0' || f[1][0] == '-' || port == 0 || port > 65535) return false;
  if (f[2].size() != 16) return false;
  const unsigned long long nonce = std::strtoull(f[2].c_str(), &end, 16);
  if (*end != '\0') return false;
  out = {f[0], static_cast<uint16_t>(port), nonce, "", "", false};
  if (f.size() >= 5) {
    if (f[4].size() > sizeof(sockaddr_un::sun_path) - 1) return false;
    out.host_id = f[3];
    out.local_name = f[4];
    out.shm = f.size() == 6;
  }
  return true;
}

// Connects a socket to `addr` before `deadline` (non-blocking: an address that drops SYNs cannot
// hold the caller past it); -1 with `why` set otherwise.
int connect_before(const sockaddr* addr, socklen_t len, Clock::time_point deadline, std::string& why) {
  for (;;) {
    const int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      why = errno_text(errno);
      return -1;
    }
    int err = ::connect(fd, addr, len) == 0 ? 0 : errno;
    if (err == EAGAIN && Clock::now() < deadline) {
      // A local socket whose listen backlog is full: nothing is in progress, so try afresh.
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (err == EINPROGRESS) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd pf{fd, POLLOUT, 0};
      if (left > 0 && ::poll(&pf, 1, static_cast<int>(left)) == 1) {
        socklen_t elen = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) return fd;
    why = errno_text(err);
    ::close(fd);
    return -1;
  }
}

// The iovecs covering bytes [offset, offset + max) of the concatenated parts (fewer at their end).
size_t iov_at(std::span<const MutPart> parts, size_t offset, size_t max, std::vector<iovec>& out) {
  out.clear();
  size_t covered = 0;
  for (const auto& p : parts) {
    if (covered == max || out.size() == IOV_MAX) break;
    if (offset >= p.bytes) {
      offset -= p.bytes;
      continue;
    }
    const size_t n = std::min(p.bytes - offset, max - covered);
    out.push_back({static_cast<char*>(p.data) + offset, n});
    covered += n;
    offset = 0;
  }
  return covered;
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
  void wait_for_progress(std::chrono::microseconds timeout);
  void cancel(const std::shared_ptr<RecvOp>& op);
  void cancel(const std::shared_ptr<SendOp>& op);
  void shutdown() noexcept;
  int at_fault(int peer);  // Transport::at_fault
  std::vector<int> dead_peers();  // Transport::dead_peers

 private:
  void connect(const TransportOptions& o);
  void accept_peers(const TransportOptions& o, Clock::time_point deadline,
                    const std::function<Address(int)>& peer_address);
  void add_peer(int peer, int fd, bool local, std::unique_ptr<ShmChannel> shm = nullptr);
  // Greets lower rank p over a new connection (local socket when p shares this host, else TCP).
  void connect_to(int p, const Address& peer, const TransportOptions& o, Clock::time_point deadline);
  void deliver_self(uint64_t tag, std::span<const ConstPart> parts, size_t total);
  // Writes what the socket takes of the peer's queue.
  void write_peer(int peer);
  // Reads what the socket (or ring) has (up to the budget) and handles it.
  void read_peer(int peer);
  // One read of a peer's stream, socket or ring, with read(2)'s results (-1/EAGAIN: nothing waiting).
  ssize_t read_stream(Peer& p, const iovec* iov, size_t count);
  // A shared-memory peer's socket is readable: takes its wake-ups, reads its ring and, at the end
  // of stream, fails it (after what its ring still held).
  void read_wakeups(int peer);
  // Tells a shared-memory peer that blocked on its ring to look again.
  void send_wakeup(Peer& p);
  // Why a stream read failed (errno or the ring's corruption).
  std::string read_failure(int peer, ssize_t n) const;
  // Whether that failed read (errno still its own) means the peer's end is gone: end of stream or a reset.
  bool read_ended(int peer, ssize_t n) const;
  // Handles the staged bytes; false when the peer went.
  bool consume_stage(int peer);
  bool start_incoming(int peer, const FrameHeader& h);
  void deliver(Incoming& in, const unsigned char* data, size_t n);
  void finish_incoming(int peer);
  // `ended`: the peer's end is known gone (Peer::ended; a goodbye, kClosed, always is).
  void peer_gone(int peer, PeerState state, const std::string& why, bool ended = false);
  // A started send was cancelled: copies its unwritten rest into the op (or, failing that, gives the peer up).
  void keep_rest(SendOp& op);
  void note_arrival();
  bool spin(std::chrono::microseconds timeout);
  void wake() noexcept;

  std::mutex mu_;
  const int rank_, size_;
  bool closed_ = false;
  bool draining_ = false;  // shutting down: payloads read are dropped
  int listen_fd_ = -1;
  int local_listen_fd_ = -1;  // abstract AF_UNIX listener for ranks of this host
  std::string host_id_;       // set when local sockets are on
  const LocalPath local_path_ = local_path_from_env();
  const uint64_t own_nonce_ = random_nonce();
  int event_fd_ = -1;
  std::vector<Peer> peers_;
  MatchQueues<RecvOp, Incoming> match_;
  std::vector<pollfd> poll_fds_;
  std::vector<int> poll_peers_;
  bool poll_dirty_ = true;
  bool backlog_ = false;  // the last progress() stopped a read on its budget
  std::vector<iovec> iov_scratch_;
  std::atomic<int> waiters_{0};
  // Frames completed, sends finished and peers lost: what a spinning waiter watches.
  std::atomic<uint64_t> news_{0};
  Spinner spinner_{spin_from_env("TANDEM_TCP_SPIN_US")};
  const uint64_t max_unexpected_ = max_unexpected_from_env();
};

Core::Core(const TransportOptions& o) : rank_(o.rank), size_(o.size), peers_(o.size) {
  TANDEM_REQUIRE(o.store != nullptr, "tcp: rank {} needs a KvStore to exchange addresses", o.rank);
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TANDEM_CHECK(event_fd_ >= 0, Status::kTransport, "tcp: rank {} cannot create an eventfd: {}", rank_,
               errno_text(errno));
  try {
    connect(o);
  } catch (...) {
    shutdown();
    throw;
  }
}

void Core::add_peer(int peer, int fd, bool local, std::unique_ptr<ShmChannel> shm) {
  set_nonblocking(fd);
  if (!local) set_nodelay(fd);
  Peer& p = peers_[peer];
  p.fd = fd;
  p.local = local;
  p.shm = std::move(shm);
  p.stage.reset(new unsigned char[kStageBytes]);
  poll_dirty_ = true;
}

void Core::connect(const TransportOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  const std::string host = listen_host(o);
  socklen_t len = 0;
  sockaddr_storage addr = resolve(host, 0, len, rank_);
  listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TANDEM_CHECK(listen_fd_ >= 0, Status::kTransport, "tcp: rank {} cannot create a socket: {}", rank_, errno_text(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  TANDEM_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                   ::listen(listen_fd_, std::max(size_, 64)) == 0,
               Status::kTransport, "tcp: rank {} cannot listen on {}: {}", rank_, host, errno_text(errno));
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &blen);
  const uint16_t port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  set_nonblocking(listen_fd_);
  std::string published = fmt::format("{} {} {:016x}", host, port, own_nonce_);
  if (local_path_ != LocalPath::kTcp && !(host_id_ = local_host_id()).empty()) {
    const std::string name = fmt::format("tandem-tcp-{}-{:016x}", ::getpid(), own_nonce_);
    socklen_t ulen = 0;
    const sockaddr_un uaddr = abstract_address(name, ulen);
    local_listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (local_listen_fd_ >= 0 && ::bind(local_listen_fd_, reinterpret_cast<const sockaddr*>(&uaddr), ulen) == 0 &&
        ::listen(local_listen_fd_, std::max(size_, 64)) == 0) {
      published += fmt::format(" {} {}{}", host_id_, name, local_path_ == LocalPath::kShm ? " shm" : "");
    } else {  // TCP still reaches everyone
      log::warn("tcp: rank {} cannot listen on a local socket ({}); ranks of this host connect over TCP", rank_,
                errno_text(errno));
      if (local_listen_fd_ >= 0) ::close(local_listen_fd_);
      local_listen_fd_ = -1;
      host_id_.clear();
    }
  }
  const std::string key_base = o.key_prefix + "/tcp/";
  o.store->set(key_base + std::to_string(rank_), published);

  auto peer_address = [&](int p) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const std::string value = o.store->get(key_base + std::to_string(p), std::max(left, std::chrono::milliseconds(1)));
    Address out;
    TANDEM_CHECK(parse_address(value, out), Status::kTransport,
                 "tcp: rank {} read a malformed address for rank {} from the store: '{}'", rank_, p, value);
    return out;
  };

  // Connect to every lower rank: its listener is up (it published after listening), so the
  // kernel completes the connection even before that rank reaches its accept loop.
  for (int p = 0; p < rank_; ++p) connect_to(p, peer_address(p), o, deadline);
  accept_peers(o, deadline, peer_address);
  for (int* fd : {&listen_fd_, &local_listen_fd_})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  int local = 0, shm = 0;
  for (const Peer& p : peers_) {
    local += p.local;
    shm += p.shm != nullptr;
  }
  log::debug("tcp: rank {} of {} connected, listened on {}:{}; {} of {} peers over local sockets, {} of them through "
             "shared memory", rank_, size_, host, port, local, size_ - 1, shm);
}

void Core::connect_to(int p, const Address& peer, const TransportOptions& o, Clock::time_point deadline) {
  int fd = -1;
  bool local = false;
  std::string last_error;
  if (!host_id_.empty() && peer.host_id == host_id_) {
    socklen_t ulen = 0;
    const sockaddr_un uaddr = abstract_address(peer.local_name, ulen);
    fd = connect_before(reinterpret_cast<const sockaddr*>(&uaddr), ulen, deadline, last_error);
    local = fd >= 0;
    if (!local)
      log::warn("tcp: rank {} cannot reach rank {} on its local socket ({}); trying TCP", rank_, p, last_error);
  }
  if (fd < 0) {
    socklen_t plen = 0;
    const sockaddr_storage paddr = resolve(peer.host, peer.port, plen, rank_);
    while ((fd = connect_before(reinterpret_cast<const sockaddr*>(&paddr), plen, deadline, last_error)) < 0) {
      TANDEM_CHECK(Clock::now() < deadline, Status::kTimeout,
                   "tcp: rank {} could not connect to rank {} at {}:{} within {} ms: {}", rank_, p, peer.host,
                   peer.port, o.connect_timeout.count(), last_error);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Shared memory when both sides take it: our segment travels with the hello. Without one (memfd
  // refused), the pair keeps to the local socket, which the acceptor accepts as well.
  int segment = -1;
  std::unique_ptr<ShmChannel> shm;
  if (local && peer.shm && local_path_ == LocalPath::kShm) {
    std::string why;
    if ((segment = shm_create_segment(kShmRingBytes, why)) >= 0 && !(shm = ShmChannel::map(segment, true, why))) {
      ::close(segment);
      segment = -1;
    }
    if (segment < 0)
      log::warn("tcp: rank {} cannot share memory with rank {} ({}); using the local socket", rank_, p, why);
  }
  Hello hello;
  hello.rank = rank_;
  hello.world = static_cast<uint32_t>(size_);
  hello.acceptor_nonce = peer.nonce;
  hello.connector_nonce = own_nonce_;
  const bool greeted = segment >= 0 ? write_all_with_fd(fd, &hello, sizeof hello, segment, deadline)
                                    : write_all(fd, &hello, sizeof hello, deadline);
  const int greet_errno = errno;
  if (segment >= 0) ::close(segment);  // the peer holds its own descriptor now; our mapping stays
  if (!greeted) {
    ::close(fd);
    TANDEM_THROW(Status::kTransport, "tcp: rank {} could not greet rank {} at {}: {}", rank_, p,
                 local ? "its local socket" : fmt::format("{}:{}", peer.host, peer.port), errno_text(greet_errno));
  }
  add_peer(p, fd, local, std::move(shm));
}

void Core::accept_peers(const TransportOptions& o, Clock::time_point deadline,
                        const std::function<Address(int)>& peer_address) {
  struct Pending {
    int fd;
    bool local;
    Hello hello;
    size_t got = 0;
    Clock::time_point since;
    int segment = -1;         // a shared-memory segment that came with the hello
    bool extra_fds = false;   // more descriptors than that one came
  };
  std::vector<Pending> pending;
  std::vector<Address> known(size_);  // the store's addresses of the ranks that greeted us
  int missing = size_ - 1 - rank_;
  auto reject = [&](Pending& c, const std::string& why) {
    log::warn("tcp: rank {} refused a connection: {}", rank_, why);
    ::close(c.fd);
    c.fd = -1;
    if (c.segment >= 0) ::close(c.segment);
    c.segment = -1;
  };
  while (missing > 0) {
    if (Clock::now() >= deadline) {
      std::string who;
      for (int p = rank_ + 1; p < size_; ++p)
        if (peers_[p].fd < 0) who += fmt::format("{}{}", who.empty() ? "" : ", ", p);
      for (auto& c : pending) {
        ::close(c.fd);
        if (c.segment >= 0) ::close(c.segment);
      }
      TANDEM_THROW(Status::kTimeout, "tcp: rank {} did not hear from rank(s) {} within {} ms (key prefix '{}')", rank_,
                   who, o.connect_timeout.count(), o.key_prefix);
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    if (local_listen_fd_ >= 0) fds.push_back({local_listen_fd_, POLLIN, 0});
    for (auto& c : pending) fds.push_back({c.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 10);
    for (const int lfd : {listen_fd_, local_listen_fd_})
      for (int fd; lfd >= 0 && (fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;)
        pending.push_back({fd, lfd == local_listen_fd_, Hello{}, 0, Clock::now()});
    for (auto& c : pending) {
      if (c.got == sizeof(Hello)) continue;
      // recvmsg: a local connector's shared-memory segment comes with its hello (SCM_RIGHTS).
      alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
      iovec v{reinterpret_cast<unsigned char*>(&c.hello) + c.got, sizeof(Hello) - c.got};
      msghdr m{};
      m.msg_iov = &v;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(c.fd, &m, MSG_CMSG_CLOEXEC);
      if (n > 0) {
        c.got += static_cast<size_t>(n);
        c.extra_fds |= (m.msg_flags & MSG_CTRUNC) != 0;
        for (cmsghdr* h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
          if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
          const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t k = 0; k < count; ++k) {
            int passed;
            std::memcpy(&passed, CMSG_DATA(h) + k * sizeof(int), sizeof passed);
            if (c.segment < 0) {
              c.segment = passed;
            } else {
              ::close(passed);
              c.extra_fds = true;
            }
          }
        }
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        reject(c, "closed before its hello");
      else if (c.got < sizeof(Hello) && Clock::now() - c.since > kHelloTimeout)
        reject(c, "no hello within 2 s");
    }
    // Check complete hellos (the connector's nonce comes from the store).
    for (auto& c : pending) {
      if (c.fd < 0 || c.got < sizeof(Hello)) continue;
      std::string why = check_hello(c.hello, rank_, size_, own_nonce_);
      const int p = c.hello.rank;
      if (why.empty() && peers_[p].fd >= 0) why = fmt::format("a second connection claiming rank {}", p);
      if (why.empty()) {
        if (known[p].port == 0) known[p] = peer_address(p);
        if (c.hello.connector_nonce != known[p].nonce) why = fmt::format("hello claiming rank {} with the wrong nonce", p);
      }
      std::unique_ptr<ShmChannel> shm;
      if (why.empty() && c.extra_fds) why = fmt::format("rank {} passed more than one descriptor with its hello", p);
      if (why.empty() && c.segment >= 0) {
        if (!c.local || local_path_ != LocalPath::kShm || !known[p].shm) {
          why = fmt::format("rank {} passed a shared-memory segment that was not asked for", p);
        } else {
          std::string bad;
          if (!(shm = ShmChannel::map(c.segment, false, bad)))
            why = fmt::format("rank {} passed a shared-memory segment that cannot be used: {}", p, bad);
        }
      }
      if (!why.empty()) {
        reject(c, why);
        continue;
      }
      if (c.segment >= 0) ::close(c.segment);  // the mapping stays
      c.segment = -1;
      add_peer(p, c.fd, c.local, std::move(shm));
      c.fd = -1;
      --missing;
    }
    std::erase_if(pending, [](const Pending& c) { return c.fd < 0; });
  }
  for (auto& c : pending) reject(c, "connected after every peer had");
}

void Core::note_arrival() {
  news_.fetch_add(1, std::memory_order_relaxed);
  spinner_.note_arrival();
}

void Core::wake() noexcept {
  if (waiters_.load() > 0 && event_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(event_fd_, &one, sizeof one);
  }
}

void Core::deliver_self(uint64_t tag, std::span<const ConstPart> parts, size_t total) {
  if (std::shared_ptr<RecvOp> r = match_.take_posted({rank_, tag})) {
    scatter_copy(parts, r->parts);
    r->done.complete(total, total > r->capacity);
    return;
  }
  auto inc = std::make_shared<Incoming>();
  inc->tag = tag;
  inc->total = inc->received = total;
  if (total > 0) {
    inc->data.reset(new unsigned char[total]);
    scatter_copy(parts, std::span<const MutPart>(std::array{MutPart{inc->data.get(), total}}));
  }
  match_.stash({rank_, tag}, std::move(inc));
}

std::shared_ptr<SendOp> Core::send(int peer, uint64_t tag, std::span<const ConstPart> parts) {
  auto op = std::make_shared<SendOp>();
  op->peer = peer;
  op->tag = tag;
  op->bytes = total_bytes(parts);
  std::lock_guard lock(mu_);
  if (closed_) {
    op->done.fail(Status::kTransport, fmt::format("tcp: rank {} sends to rank {} on a destroyed transport", rank_, peer));
    return op;
  }
  if (peer == rank_) {
    deliver_self(tag, parts, op->bytes);
    op->done.complete(op->bytes, false);
    return op;
  }
  Peer& p = peers_[peer];
  if (p.state != PeerState::kAlive) {
    op->done.fail(Status::kPeerFailure, fmt::format("tcp: send to rank {} tag {}: {}", peer, tag, p.why));
    return op;
  }
  op->header.kind = static_cast<uint16_t>(Kind::kData);
  op->header.src = rank_;
  op->header.tag = tag;
  op->header.bytes = op->bytes;
  op->iov.reserve(parts.size() + 1);
  op->iov.push_back({&op->header, sizeof(FrameHeader)});
  for (const auto& part : parts)
    if (part.bytes > 0) op->iov.push_back({const_cast<void*>(part.data), part.bytes});
  p.sendq.push_back(op);
  if (p.sendq.size() == 1) write_peer(peer);  // nothing ahead of it: straight to the socket
  if (op->done.pending()) wake();             // a blocked waiter should now watch for POLLOUT
  return op;
}

std::shared_ptr<RecvOp> Core::recv(int peer, uint64_t tag, std::span<const MutPart> parts) {
  auto op = make_recv_op(peer, tag, parts);
  std::lock_guard lock(mu_);
  if (closed_) {
    op->done.fail(Status::kTransport,
                  fmt::format("tcp: rank {} receives from rank {} on a destroyed transport", rank_, peer));
    return op;
  }
  const bool gone = peer != rank_ && peers_[peer].state != PeerState::kAlive;
  match_receive(match_, op, gone ? &peers_[peer].why : nullptr, "tcp", [&](Incoming& inc) {
    if (inc.received > 0) copy_into_at(op->parts, 0, inc.data.get(), inc.received);
    inc.data.reset();  // the rest is read straight into our parts
  });
  return op;
}

void Core::write_peer(int peer) {
  Peer& p = peers_[peer];
  while (!p.sendq.empty() && p.state == PeerState::kAlive) {
    SendOp& op = *p.sendq.front();
    msghdr m{};
    m.msg_iov = op.iov.data() + op.iov_at;
    m.msg_iovlen = std::min<size_t>(op.iov.size() - op.iov_at, IOV_MAX);
    ssize_t n = 0;
    if (p.shm) {
      n = p.shm->write(m.msg_iov, m.msg_iovlen);
      if (n < 0) {
        peer_gone(peer, PeerState::kLost,
                  fmt::format("rank {} corrupted the shared memory of its connection: {}", peer, p.shm->error()));
        return;
      }
      if (p.shm->take_reader_wake()) send_wakeup(p);
      if (n == 0) return;  // the ring is full
    } else {
      n = ::sendmsg(p.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (draining_ && (errno == EPIPE || errno == ECONNRESET)) {
        // We are closing and so did the peer, first: its goodbye is still unread in our socket. What was left to
        // write is only our own goodbye, and nothing is lost -- no warning for a clean shutdown.
        log::debug("tcp: rank {}: rank {} closed before our goodbye ({})", rank_, peer, errno_text(errno));
        peer_gone(peer, PeerState::kClosed, fmt::format("rank {} closed its transport", peer));
        return;
      }
      const int err = errno;
      peer_gone(peer, PeerState::kLost, fmt::format("writing to rank {} failed: {}", peer, errno_text(err)),
                err == EPIPE || err == ECONNRESET);
      return;
    }
    op.started = true;
    size_t left = static_cast<size_t>(n);
    while (left > 0 && op.iov_at < op.iov.size()) {
      iovec& v = op.iov[op.iov_at];
      const size_t k = std::min(left, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + k;
      v.iov_len -= k;
      left -= k;
      if (v.iov_len == 0) ++op.iov_at;
    }
    if (op.iov_at == op.iov.size()) {
      op.done.complete(op.bytes, false);
      p.sendq.pop_front();
      news_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

bool Core::start_incoming(int peer, const FrameHeader& h) {
  auto inc = std::make_shared<Incoming>();
  inc->tag = h.tag;
  inc->total = h.bytes;
  if (draining_) {
    inc->discard = true;
  } else if ((inc->matched = match_.take_posted({peer, h.tag}))) {
  } else {
    if (h.bytes > max_unexpected_) {
      peer_gone(peer, PeerState::kLost,
                fmt::format("rank {} sent an unexpected message of {} bytes, above TANDEM_TCP_MAX_UNEXPECTED ({} bytes)",
                            peer, h.bytes, max_unexpected_));
      return false;
    }
    if (h.bytes > 0) {
      inc->data.reset(new (std::nothrow) unsigned char[h.bytes]);
      if (!inc->data) {
        peer_gone(peer, PeerState::kLost,
                  fmt::format("rank {} sent a message of {} bytes that cannot be stored", peer, h.bytes));
        return false;
      }
    }
    match_.stash({peer, h.tag}, inc);
  }
  peers_[peer].current = std::move(inc);
  return true;
}

void Core::deliver(Incoming& in, const unsigned char* data, size_t n) {
  if (in.matched) copy_into_at(in.matched->parts, in.received, data, n);
  else if (!in.discard) std::memcpy(in.data.get() + in.received, data, n);
  in.received += n;
}

void Core::finish_incoming(int peer) {
  Peer& p = peers_[peer];
  Incoming& in = *p.current;
  if (in.matched) in.matched->done.complete(in.total, in.total > in.matched->capacity);
  in.matched.reset();
  p.current.reset();
  note_arrival();
}

bool Core::consume_stage(int peer) {
  Peer& p = peers_[peer];
  while (p.stage_begin < p.stage_end) {
    if (!p.current) {
      if (p.stage_end - p.stage_begin < sizeof(FrameHeader)) break;
      FrameHeader h;
      std::memcpy(&h, p.stage.get() + p.stage_begin, sizeof h);
      p.stage_begin += sizeof h;
      const std::string why = check_frame(h, peer, kFrameLimit);
      if (!why.empty()) {
        log::error("tcp: rank {} got a malformed frame from rank {}: {}", rank_, peer, why);
        peer_gone(peer, PeerState::kLost, fmt::format("rank {} sent a malformed frame ({})", peer, why));
        return false;
      }
      if (h.kind == static_cast<uint16_t>(Kind::kGoodbye)) {
        peer_gone(peer, PeerState::kClosed, fmt::format("rank {} closed its transport", peer));
        return false;
      }
      if (!start_incoming(peer, h)) return false;
      if (h.bytes == 0) finish_incoming(peer);
      continue;
    }
    Incoming& in = *p.current;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(p.stage_end - p.stage_begin, in.total - in.received));
    deliver(in, p.stage.get() + p.stage_begin, n);
    p.stage_begin += n;
    if (in.complete()) finish_incoming(peer);
  }
  if (p.stage_begin == p.stage_end) p.stage_begin = p.stage_end = 0;
  return true;
}

void Core::read_peer(int peer) {
  Peer& p = peers_[peer];
  size_t budget = kReadBudget;
  p.more = false;
  while (p.state == PeerState::kAlive) {
    if (!consume_stage(peer)) return;
    if (budget == 0) {
      p.more = true;
      backlog_ = true;
      return;
    }
    ssize_t n = -1;
    bool direct = false;
    Incoming* in = p.current.get();
    const uint64_t left = in ? in->total - in->received : 0;
    if (in && p.stage_end == 0 && left >= kDirectBytes && !in->discard) {
      // Straight into the destination: the matched receive's parts, or the unexpected message's storage.
      if (in->matched && in->received < in->matched->capacity) {
        iov_at(in->matched->parts, in->received, std::min<uint64_t>(left, budget), iov_scratch_);
        n = read_stream(p, iov_scratch_.data(), iov_scratch_.size());
        direct = true;
      } else if (!in->matched) {
        const iovec v{in->data.get() + in->received, static_cast<size_t>(std::min<uint64_t>(left, budget))};
        n = read_stream(p, &v, 1);
        direct = true;
      }
    }
    if (!direct) {
      if (p.stage_begin > 0) {  // keep a partial header at the front
        std::memmove(p.stage.get(), p.stage.get() + p.stage_begin, p.stage_end - p.stage_begin);
        p.stage_end -= p.stage_begin;
        p.stage_begin = 0;
      }
      const size_t want = std::min<uint64_t>(kStageBytes - p.stage_end, left + kLookahead);
      const iovec v{p.stage.get() + p.stage_end, want};
      n = read_stream(p, &v, 1);
    }
    if (n > 0) {
      budget -= std::min(budget, static_cast<size_t>(n));
      if (direct) {
        in->received += static_cast<uint64_t>(n);
        if (in->complete()) finish_incoming(peer);
      } else {
        p.stage_end += static_cast<size_t>(n);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    const bool ended = read_ended(peer, n);
    peer_gone(peer, PeerState::kLost, read_failure(peer, n), ended);
    return;
  }
}

std::string Core::read_failure(int peer, ssize_t n) const {
  const Peer& p = peers_[peer];
  if (p.shm && !p.shm->error().empty())
    return fmt::format("rank {} corrupted the shared memory of its connection: {}", peer, p.shm->error());
  return n == 0 ? fmt::format("rank {} disconnected (its process died or its connection failed)", peer)
                : fmt::format("reading from rank {} failed: {}", peer, errno_text(errno));
}

bool Core::read_ended(int peer, ssize_t n) const {
  const Peer& p = peers_[peer];
  if (p.shm && !p.shm->error().empty()) return false;  // a corrupted ring says nothing of the peer's end
  return n == 0 || errno == ECONNRESET;
}

ssize_t Core::read_stream(Peer& p, const iovec* iov, size_t count) {
  if (!p.shm) return ::readv(p.fd, iov, static_cast<int>(std::min<size_t>(count, IOV_MAX)));
  const ptrdiff_t n = p.shm->read(iov, count);
  if (n > 0 && p.shm->take_writer_wake()) send_wakeup(p);
  if (n > 0) return n;
  errno = n == 0 ? EAGAIN : EPROTO;
  return -1;
}

void Core::send_wakeup(Peer& p) {
  const unsigned char byte = 1;
  // A full socket already holds wake-ups the peer has not taken: nothing is lost.
  [[maybe_unused]] auto n = ::send(p.fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Core::read_wakeups(int peer) {
  Peer& p = peers_[peer];
  unsigned char sink[256];
  ssize_t n;
  while ((n = ::recv(p.fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) {
  }
  const int err = errno;
  read_peer(peer);  // the ring first: what the peer wrote before it went is delivered
  if (p.state != PeerState::kAlive || (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))) return;
  errno = err;
  const bool ended = read_ended(peer, n);
  peer_gone(peer, PeerState::kLost, read_failure(peer, n), ended);
}

void Core::peer_gone(int peer, PeerState state, const std::string& why, bool ended) {
  Peer& p = peers_[peer];
  if (p.state != PeerState::kAlive) return;
  p.state = state;
  p.why = why;
  p.ended = ended || state == PeerState::kClosed;
  if (p.current) {
    if (p.current->matched)
      p.current->matched->done.fail(
          Status::kPeerFailure, fmt::format("tcp: receive from rank {} tag {}: {} mid-message", peer, p.current->tag, why));
    match_.forget_stashed({peer, p.current->tag}, p.current);
    p.current.reset();
  }
  match_.drain_posted(peer, [&](const MatchKey&, const std::shared_ptr<RecvOp>& r) {
    r->done.fail(Status::kPeerFailure, fmt::format("tcp: receive from rank {} tag {}: {}", peer, r->tag, why));
  });
  for (auto& s : p.sendq)
    s->done.fail(Status::kPeerFailure, fmt::format("tcp: send to rank {} tag {}: {}", peer, s->tag, why));
  p.sendq.clear();
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
  p.shm.reset();
  p.stage_begin = p.stage_end = 0;
  poll_dirty_ = true;
  news_.fetch_add(1, std::memory_order_relaxed);
  if (state == PeerState::kLost) log::warn("tcp: rank {}: {}", rank_, why);
}

void Core::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || closed_) return;  // another thread is already driving it
  if (poll_dirty_) {
    poll_fds_.clear();
    poll_peers_.clear();
    for (int peer = 0; peer < size_; ++peer)
      if (peers_[peer].fd >= 0) {
        poll_fds_.push_back({peers_[peer].fd, POLLIN, 0});
        poll_peers_.push_back(peer);
      }
    poll_dirty_ = false;
  }
  for (size_t k = 0; k < poll_fds_.size(); ++k) {
    const Peer& p = peers_[poll_peers_[k]];
    poll_fds_[k].events = static_cast<short>(POLLIN | (p.sendq.empty() || p.shm ? 0 : POLLOUT));
  }
  if (::poll(poll_fds_.data(), poll_fds_.size(), 0) < 0 && errno != EINTR)
    TANDEM_THROW(Status::kTransport, "tcp: rank {} cannot poll its sockets: {}", rank_, errno_text(errno));
  backlog_ = false;
  // The table may change under the loop (a peer that goes): iterate over a copy of its peers.
  const size_t n = poll_fds_.size();
  for (size_t k = 0; k < n && k < poll_fds_.size(); ++k) {
    const int peer = poll_peers_[k];
    const short ev = poll_fds_[k].revents;
    Peer& p = peers_[peer];
    if (p.state != PeerState::kAlive) continue;
    if (p.shm) {  // the rings are looked at on every call; the socket only wakes and ends
      if (!p.sendq.empty()) write_peer(peer);
      if (p.state == PeerState::kAlive) {
        if (ev & (POLLIN | POLLERR | POLLHUP)) read_wakeups(peer);
        else read_peer(peer);
      }
      if (poll_dirty_) break;
      continue;
    }
    if (!p.sendq.empty() && (ev & (POLLOUT | POLLERR | POLLHUP))) write_peer(peer);
    if (p.state == PeerState::kAlive && (p.more || (ev & (POLLIN | POLLERR | POLLHUP)))) read_peer(peer);
    if (poll_dirty_) break;  // a peer went: the table changed under us
  }
}

bool Core::spin(std::chrono::microseconds timeout) {
  return spinner_.spin([&] { progress(); }, [&] { return news_.load(std::memory_order_relaxed); }, timeout);
}

void Core::wait_for_progress(std::chrono::microseconds timeout) {
  if (spin(timeout)) return;
  std::vector<pollfd> fds;
  {
    std::lock_guard lock(mu_);
    if (closed_ || backlog_) return;
    fds.push_back({event_fd_, POLLIN, 0});
    bool ready = false;
    for (auto& p : peers_) {
      if (p.fd < 0) continue;
      // A shared-memory peer wakes us over the socket once we have said that we sleep.
      if (p.shm) ready |= p.shm->arm(!p.sendq.empty());
      fds.push_back({p.fd, static_cast<short>(POLLIN | (p.sendq.empty() || p.shm ? 0 : POLLOUT)), 0});
    }
    if (ready) fds.clear();
  }
  if (fds.empty()) {
    progress();
    return;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  waiters_.fetch_add(1);
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) > 0 && (fds[0].revents & POLLIN)) {
    uint64_t count;
    [[maybe_unused]] auto n = ::read(event_fd_, &count, sizeof count);
  }
  waiters_.fetch_sub(1);
  progress();
}

void Core::cancel(const std::shared_ptr<RecvOp>& op) {
  std::lock_guard lock(mu_);
  cancel_receive(match_, op, op->peer != rank_ ? &peers_[op->peer].current : nullptr, "tcp");
}

void Core::cancel(const std::shared_ptr<SendOp>& op) {
  std::lock_guard lock(mu_);
  if (!op->done.pending()) return;
  if (!op->started && op->peer != rank_) std::erase(peers_[op->peer].sendq, op);
  else if (op->peer != rank_) keep_rest(*op);
  op->done.fail(Status::kTransport, fmt::format("tcp: send to rank {} tag {} was cancelled", op->peer, op->tag));
}

int Core::at_fault(int peer) {
  std::lock_guard lock(mu_);
  return peer >= 0 && peer < size_ && peers_[peer].gave_up ? rank_ : peer;
}

std::vector<int> Core::dead_peers() {
  progress();  // what the sockets already say: an end of stream waiting to be read
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && peers_[p].ended && !peers_[p].gave_up) out.push_back(p);
  return out;
}

void Core::keep_rest(SendOp& op) {
  // A send already partly written stays queued and is finished, the peer's stream must stay whole;
  // but from a copy of what is left, so that the caller may free its parts once cancel() returns.
  size_t left = 0;
  for (size_t k = op.iov_at; k < op.iov.size(); ++k) left += op.iov[k].iov_len;
  if (left == 0 || op.rest) return;
  op.rest.reset(new (std::nothrow) unsigned char[left]);
  if (settings::current()->flag("TANDEM_TEST_TCP_NO_COPY").value_or(false)) op.rest.reset();  // test hook: no memory
  if (!op.rest) {
    // Without the copy the stream cannot be finished without reading the caller's parts: give the
    // connection up instead (the peer sees its end, and blames this rank: so does this rank, at_fault).
    peers_[op.peer].gave_up = peers_[op.peer].state == PeerState::kAlive;
    peer_gone(op.peer, PeerState::kLost,
              fmt::format("rank {} cannot keep the {} unwritten bytes of a cancelled send to rank {} tag {}", rank_, left,
                          op.peer, op.tag));
    return;
  }
  size_t at = 0;
  for (size_t k = op.iov_at; k < op.iov.size(); ++k) {
    std::memcpy(op.rest.get() + at, op.iov[k].iov_base, op.iov[k].iov_len);
    at += op.iov[k].iov_len;
  }
  op.iov.assign(1, iovec{op.rest.get(), left});
  op.iov_at = 0;
}

void Core::shutdown() noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  draining_ = true;
  try {
    const std::string gone = fmt::format("tcp: rank {} destroyed its transport", rank_);
    match_.drain_posted(-1, [&](const MatchKey& key, const std::shared_ptr<RecvOp>& r) {
      r->done.fail(Status::kTransport, fmt::format("{}; receive from rank {} tag {} cancelled", gone, key.peer, key.tag));
    });
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[peer];
      if (p.current && p.current->matched) p.current->matched->done.fail(Status::kTransport, gone);
      if (p.current) {
        p.current->matched.reset();
        p.current->discard = true;
      }
      if (p.fd < 0 || p.state != PeerState::kAlive) continue;
      auto bye = std::make_shared<SendOp>();
      bye->peer = peer;
      bye->header.kind = static_cast<uint16_t>(Kind::kGoodbye);
      bye->header.src = rank_;
      bye->iov.push_back({&bye->header, sizeof(FrameHeader)});
      p.sendq.push_back(std::move(bye));
    }
    // Write what is queued for live peers (the goodbyes last), reading meanwhile so that a peer
    // flushing towards us at the same time is not stuck; at most kLingerMs.
    const auto deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<int> who;
      for (int peer = 0; peer < size_; ++peer) {
        Peer& p = peers_[peer];
        if (p.fd < 0 || p.state != PeerState::kAlive) continue;
        write_peer(peer);
        if (p.state != PeerState::kAlive || p.sendq.empty()) continue;
        if (p.shm) p.shm->arm(true);  // woken when the peer frees ring space
        fds.push_back({p.fd, static_cast<short>(p.shm ? POLLIN : POLLIN | POLLOUT), 0});
        who.push_back(peer);
      }
      if (fds.empty() || Clock::now() >= deadline) break;
      ::poll(fds.data(), fds.size(), 10);
      for (size_t k = 0; k < fds.size(); ++k) {
        Peer& p = peers_[who[k]];
        if (p.shm && p.state == PeerState::kAlive) read_wakeups(who[k]);
        else if (fds[k].revents & (POLLIN | POLLERR | POLLHUP)) read_peer(who[k]);
      }
    }
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[peer];
      for (auto& s : p.sendq)
        s->done.fail(Status::kTransport, fmt::format("{}; send to rank {} tag {} cancelled", gone, s->peer, s->tag));
      p.sendq.clear();
      if (p.fd >= 0) {
        // Read what is already here (closing with unread data would reset the connection and could
        // cost the peer the goodbye), then close our direction and the socket.
        unsigned char sink[4096];
        while (::recv(p.fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
        ::shutdown(p.fd, SHUT_WR);
        ::close(p.fd);
        p.fd = -1;
      }
      p.current.reset();
    }
    match_.clear_stashed();
  } catch (const std::exception& e) {
    log::error("tcp: rank {} shutdown: {}", rank_, e.what());
  }
  for (int* fd : {&listen_fd_, &local_listen_fd_})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  if (event_fd_ >= 0) ::close(event_fd_);
  event_fd_ = -1;
}

}  // namespace

std::unique_ptr<Transport> create(const TransportOptions& options) {
  return std::make_unique<CoreTransport<Core, SendOp, RecvOp>>("tcp", Capabilities{}, options);
}

}  // namespace tandem::transports::tcp
