// `tandem calibrate --network` (calibrate_network.hpp): RTT and TCP goodput between two hosts.
#include "cli/calibrate_network.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/src/comm_cpu_fit.hpp"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHelloPrefix[] = "TANDEM-NET v";
constexpr char kHello[16] = "TANDEM-NET v3\n";  // 14 characters, then two bytes of 0
constexpr int kVersion = 3;
constexpr size_t kPingBytes = 64;
constexpr uint32_t kFrameBytes = 1u << 20;
// The paced phase: small writes at a fixed interval, as `tandem calibrate`'s loopback one (api/src/calibrate_handles.hpp
// kTcpWakeup*: two segments a write) but twice the interval, so that it stays under a 65 Mbit/s link's rate
// (2,896 bytes / 400 us = 58 Mbit/s, less with the sleep's overshoot) and each write is a wake-up of both sides.
constexpr uint64_t kPacedChunkBytes = 2896, kPacedIntervalUs = 400;
// The two-way phase's bounds (what a listener accepts).
constexpr uint64_t kMaxTwoWayBytes = 1ull << 30, kMaxTwoWayReps = 1000, kMaxTwoWayGapUs = 60'000'000;
// Per payload byte on an Ethernet link with MTU 1500 and TCP timestamps (simulator/network/topology.hpp).
constexpr double kMssBytes = 1448, kFrameWireBytes = 1514;

struct NetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until fd is ready for `events` or the deadline passes (then throws naming `what`).
void wait_ready(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw NetError(fmt::format("{}: timed out", what));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) throw NetError(fmt::format("{}: poll: {}", what, std::strerror(errno)));
    if (n > 0) return;
  }
}

void write_all(int fd, const void* data, size_t len, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      wait_ready(fd, POLLOUT, deadline, what);
    } else {
      throw NetError(fmt::format("{}: the other side is gone ({})", what, n < 0 ? std::strerror(errno) : "closed"));
    }
  }
}

void read_all(int fd, void* data, size_t len, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw NetError(fmt::format("{}: the other side closed the connection", what));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, deadline, what);
    } else {
      throw NetError(fmt::format("{}: {}", what, std::strerror(errno)));
    }
  }
}

// Sends `out` and receives `in` at once (a simultaneous exchange on one connection); each side's end time is set
// when its last byte has gone into the socket (sent) or arrived (received).
void exchange_all(int fd, const char* out, size_t out_len, char* in, size_t in_len, Clock::time_point deadline,
                  const std::string& what, Clock::time_point* sent_at, Clock::time_point* received_at) {
  size_t sent = 0, got = 0;
  if (out_len == 0) *sent_at = Clock::now();
  if (in_len == 0) *received_at = Clock::now();
  while (sent < out_len || got < in_len) {
    bool progress = false;
    if (sent < out_len) {
      const ssize_t n = ::send(fd, out + sent, out_len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progress = true;
        if (sent == out_len) *sent_at = Clock::now();
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetError(fmt::format("{}: the other side is gone ({})", what, std::strerror(errno)));
      }
    }
    if (got < in_len) {
      const ssize_t n = ::recv(fd, in + got, in_len - got, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<size_t>(n);
        progress = true;
        if (got == in_len) *received_at = Clock::now();
      } else if (n == 0) {
        throw NetError(fmt::format("{}: the other side closed the connection", what));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetError(fmt::format("{}: {}", what, std::strerror(errno)));
      }
    }
    if (progress) continue;
    const short events = static_cast<short>((sent < out_len ? POLLOUT : 0) | (got < in_len ? POLLIN : 0));
    wait_ready(fd, events, deadline, what);
  }
}

void put_u64(unsigned char* b, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) b[i] = static_cast<unsigned char>(v & 0xff);
}
uint64_t get_u64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return v;
}

double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
uint64_t to_ns(double s) { return static_cast<uint64_t>(std::max(0.0, s) * 1e9 + 0.5); }

Clock::time_point after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The hello both sides send first; anything else is named in the error.
void exchange_hello(int fd, double timeout_s, const std::string& who) {
  write_all(fd, kHello, sizeof kHello, after(timeout_s), fmt::format("sending the hello to {}", who));
  char got[sizeof kHello];
  read_all(fd, got, sizeof got, after(timeout_s), fmt::format("waiting for {}'s hello", who));
  if (std::memcmp(got, kHello, sizeof kHello) != 0) {
    std::string shown;
    for (char c : got) shown += (c >= 32 && c < 127) ? std::string(1, c) : fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    if (std::memcmp(got, kHelloPrefix, sizeof kHelloPrefix - 1) == 0) {  // a tandem of another protocol version
      const char* nl = static_cast<const char*>(std::memchr(got, '\n', sizeof got));
      const char* from = got + sizeof kHelloPrefix - 1;
      std::string theirs;
      for (const char* c = from; c < (nl ? nl : got + sizeof got); ++c) theirs += (*c >= 32 && *c < 127) ? *c : '?';
      throw NetError(fmt::format("{} speaks `tandem calibrate --network` protocol v{} and this tandem speaks v{} (v2 "
                                 "added the CPU a transfer costs on each side, v3 the two-way exchange): run the same "
                                 "tandem version on both hosts", who, theirs, kVersion));
    }
    throw NetError(fmt::format("{} did not answer as `tandem calibrate --network` does (expected \"TANDEM-NET v{}\", "
                               "got \"{}\")", who, kVersion, shown));
  }
}

std::pair<std::string, int> split_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw NetError(fmt::format("--peer: expected HOST:PORT, got \"{}\"", s));
  std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || p < 1 || p > 65535) throw NetError(fmt::format("--peer: port must be 1..65535, got \"{}\"", port));
  return {host, static_cast<int>(p)};
}

Socket connect_to(const std::string& host, int port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) throw NetError(fmt::format("--peer {}:{}: cannot resolve the host: {}", host, port, ::gai_strerror(rc)));
  std::string last = "no address";
  const auto deadline = after(timeout_s);
  for (addrinfo* a = res; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd() < 0) {
      last = std::strerror(errno);
      continue;
    }
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = std::strerror(errno);
        continue;
      }
      try {
        wait_ready(s.fd(), POLLOUT, deadline, "connecting");
      } catch (const NetError&) {
        last = "timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = std::strerror(err);
        continue;
      }
    }
    ::freeaddrinfo(res);
    set_nodelay(s.fd());
    return s;
  }
  ::freeaddrinfo(res);
  throw NetError(fmt::format("cannot connect to {}:{}: {} (is `tandem calibrate --network --listen {}` running there?)",
                             host, port, last, port));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Listener: one peer, then exit.
int listen_side(const NetworkCalibrateOptions& o) {
  Socket ls(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  bool v6 = ls.fd() >= 0;
  if (v6) {
    int zero = 0;
    ::setsockopt(ls.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 peers too
  } else {
    ls = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  }
  if (ls.fd() < 0) throw NetError(fmt::format("--listen: socket: {}", std::strerror(errno)));
  int one = 1;
  ::setsockopt(ls.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<uint16_t>(o.listen_port));
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<uint16_t>(o.listen_port));
    len = sizeof *a;
  }
  if (::bind(ls.fd(), reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(ls.fd(), 1) != 0)
    throw NetError(fmt::format("--listen {}: {}", o.listen_port, std::strerror(errno)));
  len = sizeof ss;
  ::getsockname(ls.fd(), reinterpret_cast<sockaddr*>(&ss), &len);
  const int port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  std::printf("listening on port %d\n", port);
  std::fflush(stdout);
  wait_ready(ls.fd(), POLLIN, after(o.timeout_s), fmt::format("--listen {}: waiting for a peer", port));
  Socket s(::accept4(ls.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (s.fd() < 0) throw NetError(fmt::format("--listen {}: accept: {}", port, std::strerror(errno)));
  set_nodelay(s.fd());
  const int fd = s.fd();
  exchange_hello(fd, o.timeout_s, "the peer");
  // ping-pongs: a round count, then that many 64-byte echoes
  unsigned char hdr[8];
  read_all(fd, hdr, 8, after(o.timeout_s), "RTT phase: waiting for the round count");
  const uint64_t rounds = get_u64(hdr);
  if (rounds < 1 || rounds > 100000)
    throw NetError(fmt::format("RTT phase: the peer asked for {} rounds (1..100000): not a tandem peer?", rounds));
  char ping[kPingBytes];
  for (uint64_t i = 0; i < rounds; ++i) {
    read_all(fd, ping, sizeof ping, after(o.timeout_s), "RTT phase: waiting for a ping");
    write_all(fd, ping, sizeof ping, after(o.timeout_s), "RTT phase: answering a ping");
  }
  // bulk: frames until one of length 0
  std::vector<char> buf(kFrameBytes);
  uint64_t bytes = 0;
  Clock::time_point first{}, last{};
  const double bulk_cpu0 = thread_cpu_s();
  for (;;) {
    unsigned char lenb[4];
    read_all(fd, lenb, 4, after(o.timeout_s), "bulk phase: waiting for data");
    const uint32_t n = (uint32_t{lenb[0]} << 24) | (uint32_t{lenb[1]} << 16) | (uint32_t{lenb[2]} << 8) | lenb[3];
    if (n == 0) break;
    if (n > kFrameBytes) throw NetError(fmt::format("bulk phase: a frame of {} bytes (at most {}): not a tandem peer?", n, kFrameBytes));
    if (bytes == 0) first = Clock::now();
    read_all(fd, buf.data(), n, after(o.timeout_s), "bulk phase: reading data");
    bytes += n;
    last = Clock::now();
  }
  const double bulk_cpu = thread_cpu_s() - bulk_cpu0;
  const uint64_t ns = bytes ? static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(last - first).count()) : 0;
  unsigned char reply[24];
  put_u64(reply, bytes);
  put_u64(reply + 8, ns);
  put_u64(reply + 16, to_ns(bulk_cpu));
  write_all(fd, reply, sizeof reply, after(o.timeout_s), "bulk phase: sending the result");
  // paced: {chunk bytes, writes, interval us}, then chunk x writes bytes read as they arrive, each read one wake-up
  unsigned char paced[24];
  read_all(fd, paced, sizeof paced, after(o.timeout_s), "paced phase: waiting for its size");
  const uint64_t chunk = get_u64(paced), writes = get_u64(paced + 8);
  if (chunk < 1 || chunk > kFrameBytes || writes < 1 || writes > 1000000)
    throw NetError(fmt::format("paced phase: the peer asked for {} writes of {} bytes (1..1000000 of 1..{}): not a "
                               "tandem peer?", writes, chunk, kFrameBytes));
  const uint64_t want = chunk * writes;
  uint64_t got = 0, reads = 0;
  const double paced_cpu0 = thread_cpu_s();
  while (got < want) {
    const ssize_t n = ::recv(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(want - got, buf.size())), MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<uint64_t>(n);
      ++reads;
    } else if (n == 0) {
      throw NetError("paced phase: the other side closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, after(o.timeout_s), "paced phase: waiting for data");
    } else {
      throw NetError(fmt::format("paced phase: {}", std::strerror(errno)));
    }
  }
  const double paced_cpu = thread_cpu_s() - paced_cpu0;
  put_u64(reply, got);
  put_u64(reply + 8, reads);
  put_u64(reply + 16, to_ns(paced_cpu));
  write_all(fd, reply, sizeof reply, after(o.timeout_s), "paced phase: sending the result");
  // two-way (calibrate_network.hpp): {bytes, repetitions, gap us}, then per repetition the peer's one-way transfer
  // (answered by 8 bytes once in), a go (8 bytes) for this side's one-way transfer, and a go for the exchange
  // (answered by this side's receive time from the go, ns, once both directions are done here)
  unsigned char tw[24];
  read_all(fd, tw, sizeof tw, after(o.timeout_s), "two-way phase: waiting for its size");
  const uint64_t tw_bytes = get_u64(tw), tw_reps = get_u64(tw + 8), tw_gap_us = get_u64(tw + 16);
  if (tw_reps > kMaxTwoWayReps || tw_gap_us > kMaxTwoWayGapUs || (tw_reps > 0 && (tw_bytes < 1 || tw_bytes > kMaxTwoWayBytes)))
    throw NetError(fmt::format("two-way phase: the peer asked for {} repetitions of {} bytes {} us apart (0..{} of 1..{}, "
                               "at most {} us): not a tandem peer?", tw_reps, tw_bytes, tw_gap_us, kMaxTwoWayReps,
                               kMaxTwoWayBytes, kMaxTwoWayGapUs));
  std::vector<char> mine(tw_reps > 0 ? tw_bytes : 0, 'y'), theirs(mine.size());
  for (uint64_t r = 0; r < tw_reps; ++r) {
    read_all(fd, theirs.data(), theirs.size(), after(o.timeout_s), "two-way phase: receiving the one-way transfer");
    put_u64(reply, r);
    write_all(fd, reply, 8, after(o.timeout_s), "two-way phase: answering the one-way transfer");
    read_all(fd, reply, 8, after(o.timeout_s), "two-way phase: waiting for the go of this side's one-way transfer");
    write_all(fd, mine.data(), mine.size(), after(o.timeout_s), "two-way phase: sending the one-way transfer");
    read_all(fd, reply, 8, after(o.timeout_s), "two-way phase: waiting for the go of the exchange");
    const auto go = Clock::now();
    Clock::time_point sent_at{}, received_at{};
    exchange_all(fd, mine.data(), mine.size(), theirs.data(), theirs.size(), after(o.timeout_s),
                 "two-way phase: the exchange", &sent_at, &received_at);
    put_u64(reply, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(received_at - go).count()));
    write_all(fd, reply, 8, after(o.timeout_s), "two-way phase: sending the exchange's result");
  }
  std::printf("received %.1f MB in %.3f s: %.1f Mbit/s\n", static_cast<double>(bytes) / 1e6, static_cast<double>(ns) / 1e9,
              ns ? static_cast<double>(bytes) * 8 / (static_cast<double>(ns) / 1e9) / 1e6 : 0.0);
  return 0;
}

int peer_side(const NetworkCalibrateOptions& o) {
  auto [host, port] = split_host_port(o.peer);
  Socket s = connect_to(host, port, o.timeout_s);
  const int fd = s.fd();
  const std::string who = fmt::format("{}:{}", host, port);
  exchange_hello(fd, o.timeout_s, who);
  unsigned char hdr[8];
  put_u64(hdr, static_cast<uint64_t>(o.rounds));
  write_all(fd, hdr, 8, after(o.timeout_s), "RTT phase: sending the round count");
  char ping[kPingBytes], pong[kPingBytes];
  std::vector<double> rtts;
  for (int i = 0; i < o.rounds; ++i) {
    std::memset(ping, i & 0xff, sizeof ping);
    const auto t0 = Clock::now();
    write_all(fd, ping, sizeof ping, after(o.timeout_s), "RTT phase: sending a ping");
    read_all(fd, pong, sizeof pong, after(o.timeout_s), "RTT phase: waiting for the answer");
    rtts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (std::memcmp(ping, pong, sizeof ping) != 0) throw NetError(fmt::format("RTT phase: {} echoed other bytes", who));
  }
  std::vector<char> frame(4 + kFrameBytes, 'x');
  frame[0] = static_cast<char>(kFrameBytes >> 24);
  frame[1] = static_cast<char>((kFrameBytes >> 16) & 0xff);
  frame[2] = static_cast<char>((kFrameBytes >> 8) & 0xff);
  frame[3] = static_cast<char>(kFrameBytes & 0xff);
  const auto end = after(o.seconds);
  uint64_t sent = 0;
  const double bulk_cpu0 = thread_cpu_s();
  while (Clock::now() < end) {
    write_all(fd, frame.data(), frame.size(), after(o.timeout_s), "bulk phase: sending data");
    sent += kFrameBytes;
  }
  const char zero[4] = {0, 0, 0, 0};
  write_all(fd, zero, 4, after(o.timeout_s), "bulk phase: ending the data");
  const double bulk_send_cpu = thread_cpu_s() - bulk_cpu0;
  unsigned char reply[24];
  read_all(fd, reply, sizeof reply, after(o.timeout_s), "bulk phase: waiting for the listener's result");
  const uint64_t bytes = get_u64(reply), ns = get_u64(reply + 8);
  const double bulk_recv_cpu = static_cast<double>(get_u64(reply + 16)) * 1e-9;
  if (bytes != sent || ns == 0)
    throw NetError(fmt::format("bulk phase: {} reports {} bytes in {} ns, {} were sent: not a tandem listener?", who,
                               bytes, ns, sent));
  // paced phase (calibrate_network.hpp): small writes at a fixed interval
  const auto paced_writes = static_cast<uint64_t>(o.paced_writes);
  unsigned char paced[24];
  put_u64(paced, kPacedChunkBytes);
  put_u64(paced + 8, paced_writes);
  put_u64(paced + 16, kPacedIntervalUs);
  write_all(fd, paced, sizeof paced, after(o.timeout_s), "paced phase: sending its size");
  const timespec pause{0, static_cast<long>(kPacedIntervalUs * 1000)};
  const auto paced_t0 = Clock::now();
  const double paced_cpu0 = thread_cpu_s();
  for (uint64_t i = 0; i < paced_writes; ++i) {
    write_all(fd, frame.data() + 4, kPacedChunkBytes, after(o.timeout_s), "paced phase: sending data");
    ::nanosleep(&pause, nullptr);
  }
  const double paced_send_cpu = thread_cpu_s() - paced_cpu0;
  read_all(fd, reply, sizeof reply, after(o.timeout_s), "paced phase: waiting for the listener's result");
  const double paced_s = std::chrono::duration<double>(Clock::now() - paced_t0).count();
  const uint64_t paced_bytes = get_u64(reply), paced_reads = get_u64(reply + 8);
  const double paced_recv_cpu = static_cast<double>(get_u64(reply + 16)) * 1e-9;
  if (paced_bytes != kPacedChunkBytes * paced_writes || paced_reads < 1 || paced_reads > paced_bytes)
    throw NetError(fmt::format("paced phase: {} reports {} bytes in {} reads, {} were sent: not a tandem listener?",
                               who, paced_bytes, paced_reads, kPacedChunkBytes * paced_writes));
  const double rtt = median(rtts);
  // two-way phase (calibrate_network.hpp): per repetition each direction's one-way transfer, then the simultaneous
  // exchange; every time from the sender's first write to the receiver's last byte, one-way latency rtt / 2 taken
  // out where a small message (the answer, the go) is in the measured span
  {
    unsigned char tw[24];
    put_u64(tw, o.two_way_bytes);
    put_u64(tw + 8, static_cast<uint64_t>(o.two_way_reps));
    put_u64(tw + 16, static_cast<uint64_t>(std::llround(o.two_way_gap_ms * 1e3)));
    write_all(fd, tw, sizeof tw, after(o.timeout_s), "two-way phase: sending its size");
  }
  const double lat = rtt / 2;
  std::vector<char> mine(o.two_way_reps > 0 ? o.two_way_bytes : 0, 'x'), theirs(mine.size());
  std::vector<double> one_pl, one_lp, ex_pl, ex_lp, exch, factors;
  const auto since = [](Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  const timespec gap{static_cast<time_t>(o.two_way_gap_ms / 1e3),
                     static_cast<long>(std::fmod(o.two_way_gap_ms, 1e3) * 1e6)};
  for (int r = 0; r < o.two_way_reps; ++r) {
    unsigned char msg[8];
    ::nanosleep(&gap, nullptr);  // idle as between training steps: slow start after idle applies to each transfer
    auto t0 = Clock::now();
    write_all(fd, mine.data(), mine.size(), after(o.timeout_s), "two-way phase: sending the one-way transfer");
    read_all(fd, msg, 8, after(o.timeout_s), "two-way phase: waiting for the one-way transfer's answer");
    if (get_u64(msg) != static_cast<uint64_t>(r))
      throw NetError(fmt::format("two-way phase: {} answered repetition {} for {}: not a tandem listener?", who,
                                 get_u64(msg), r));
    one_pl.push_back(std::max(0.0, since(t0, Clock::now()) - lat));
    ::nanosleep(&gap, nullptr);
    put_u64(msg, static_cast<uint64_t>(r));
    t0 = Clock::now();
    write_all(fd, msg, 8, after(o.timeout_s), "two-way phase: sending the go of the listener's one-way transfer");
    read_all(fd, theirs.data(), theirs.size(), after(o.timeout_s), "two-way phase: receiving the one-way transfer");
    one_lp.push_back(std::max(0.0, since(t0, Clock::now()) - lat));
    ::nanosleep(&gap, nullptr);
    t0 = Clock::now();
    write_all(fd, msg, 8, after(o.timeout_s), "two-way phase: sending the go of the exchange");
    Clock::time_point sent_at{}, received_at{};
    exchange_all(fd, mine.data(), mine.size(), theirs.data(), theirs.size(), after(o.timeout_s),
                 "two-way phase: the exchange", &sent_at, &received_at);
    read_all(fd, msg, 8, after(o.timeout_s), "two-way phase: waiting for the exchange's result");
    const double listener_recv = static_cast<double>(get_u64(msg)) * 1e-9;
    if (!(listener_recv > 0 && listener_recv < o.timeout_s))
      throw NetError(fmt::format("two-way phase: {} reports a receive time of {} s: not a tandem listener?", who,
                                 listener_recv));
    ex_pl.push_back(lat + listener_recv);                                   // the go reached it `lat` after t0
    ex_lp.push_back(std::max(0.0, since(t0, received_at) - lat));           // it started `lat` after t0
    exch.push_back(std::max(ex_pl.back(), ex_lp.back()));
    const double one = std::max(one_pl.back(), one_lp.back());
    factors.push_back(one > 0 ? exch.back() / one : 1.0);
  }
  // The loopback calibration's arithmetic (api/src/comm_cpu_fit.hpp), per side; a per-wake-up figure below 0 (the
  // bulk phase's per-byte cost already holds wake-ups as dense as the paced phase's) is reported as 0, as there.
  const double send_b = api::comm_cpu_s_per_byte(bulk_send_cpu, bytes);
  const double recv_b = api::comm_cpu_s_per_byte(bulk_recv_cpu, bytes);
  const double send_w = std::max(0.0, api::comm_cpu_s_per_wakeup(paced_send_cpu, paced_writes, paced_bytes, send_b));
  const double recv_w = std::max(0.0, api::comm_cpu_s_per_wakeup(paced_recv_cpu, paced_reads, paced_bytes, recv_b));
  const double goodput_bps = static_cast<double>(bytes) * 8 / (static_cast<double>(ns) * 1e-9);
  nlohmann::json j = {{"peer", who},
                      {"rtt_us", rtt * 1e6},
                      {"rtt_min_us", *std::min_element(rtts.begin(), rtts.end()) * 1e6},
                      {"rtt_samples", rtts.size()},
                      {"goodput_mbps", goodput_bps / 1e6},
                      {"bytes", bytes},
                      {"seconds", static_cast<double>(ns) * 1e-9},
                      {"tcp_cpu_s_per_byte", {{"sender", send_b}, {"receiver", recv_b}, {"mean", (send_b + recv_b) / 2}}},
                      {"tcp_cpu_s_per_wakeup", {{"sender", send_w}, {"receiver", recv_w}, {"mean", (send_w + recv_w) / 2}}},
                      {"comm_cpu",
                       {{"clock", "CLOCK_THREAD_CPUTIME_ID of each side's measuring thread"},
                        {"bulk", {{"bytes", bytes}, {"sender_cpu_s", bulk_send_cpu}, {"receiver_cpu_s", bulk_recv_cpu}}},
                        {"paced",
                         {{"chunk_bytes", kPacedChunkBytes},
                          {"interval_us", kPacedIntervalUs},
                          {"bytes", paced_bytes},
                          {"seconds", paced_s},
                          {"sender_writes", paced_writes},
                          {"receiver_reads", paced_reads},
                          {"sender_cpu_s", paced_send_cpu},
                          {"receiver_cpu_s", paced_recv_cpu}}}}}};
  double factor_mean = 0, factor_sd = 0;
  if (!factors.empty()) {
    for (double f : factors) factor_mean += f / static_cast<double>(factors.size());
    for (double f : factors) factor_sd += (f - factor_mean) * (f - factor_mean);
    factor_sd = factors.size() > 1 ? std::sqrt(factor_sd / static_cast<double>(factors.size() - 1)) : 0.0;
    const auto ms = [](const std::vector<double>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (double x : v) a.push_back(x * 1e3);
      return a;
    };
    j["tcp_two_way_factor"] = factor_mean;
    j["two_way"] = {{"bytes", o.two_way_bytes},
                    {"repetitions", o.two_way_reps},
                    {"gap_ms", o.two_way_gap_ms},
                    {"factor", factors},
                    {"factor_mean", factor_mean},
                    {"factor_sd", factor_sd},
                    {"factor_min", *std::min_element(factors.begin(), factors.end())},
                    {"factor_max", *std::max_element(factors.begin(), factors.end())},
                    {"one_way_ms", {{"peer_to_listener", ms(one_pl)}, {"listener_to_peer", ms(one_lp)}}},
                    {"exchange_ms", ms(exch)},
                    {"exchange_direction_ms", {{"peer_to_listener", ms(ex_pl)}, {"listener_to_peer", ms(ex_lp)}}},
                    {"definition", "per repetition: the exchange's time (its slower direction, from the sender's first "
                                   "write to the receiver's last byte) over the slower one-way transfer's"}};
  }
  // What a cluster JSON node takes (simulator/cluster.hpp): one-way latency, and the line rate with the goodput
  // factor over what TCP's headers allow; without a nominal rate, the line rate that carries this goodput.
  nlohmann::json node = {{"nic_latency_us", rtt * 1e6 / 2}};
  if (o.nominal_mbps > 0) {
    const double header_limited = o.nominal_mbps * kMssBytes / kFrameWireBytes;
    const double g = goodput_bps / 1e6 / header_limited;
    j["nominal_mbps"] = o.nominal_mbps;
    j["goodput_fraction"] = goodput_bps / 1e6 / o.nominal_mbps;
    j["tcp_goodput"] = std::min(1.0, g);
    if (g > 1.02)  // a token bucket's burst can add a little; more means the nominal rate is not the line rate
      std::fprintf(stderr, "tandem: warning: %.1f Mbit/s of goodput is more than TCP's headers allow at the nominal "
                   "%.1f Mbit/s (%.1f): is --nominal-mbps the link's line rate? tcp_goodput capped at 1\n",
                   goodput_bps / 1e6, o.nominal_mbps, header_limited);
    node["nic_mbps"] = o.nominal_mbps;
    node["tcp_goodput"] = std::min(1.0, g);
  } else {
    node["nic_mbps"] = goodput_bps / 1e6 * kFrameWireBytes / kMssBytes;
  }
  node["protocol"] = "tcp";
  // the simulator takes the exchange's slowdown, at least none (a mean under 1 is noise: the directions share nothing
  // but the ACKs, which its link model already charges)
  if (!factors.empty()) node["tcp_two_way_factor"] = std::max(1.0, factor_mean);
  j["cluster_node"] = node;
  const std::string text = j.dump(2) + "\n";
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    const std::string tmp = o.out + ".tmp";
    {
      std::ofstream f(tmp);
      f << text;
      if (!f) throw NetError(fmt::format("--out {}: cannot write", o.out));
    }
    if (std::rename(tmp.c_str(), o.out.c_str()) != 0)
      throw NetError(fmt::format("--out {}: {}", o.out, std::strerror(errno)));
    std::fprintf(stderr, "RTT %.1f us, goodput %.1f Mbit/s, CPU per byte %.3g s, per wake-up %.3g s (mean of the two "
                 "sides)%s; wrote %s\n", rtt * 1e6, goodput_bps / 1e6, (send_b + recv_b) / 2, (send_w + recv_w) / 2,
                 factors.empty() ? "" : fmt::format(", two-way factor {:.3f} +- {:.3f}", factor_mean, factor_sd).c_str(),
                 o.out.c_str());
  }
  return 0;
}

}  // namespace

int run_network_calibrate(const NetworkCalibrateOptions& o) {
  try {
    const bool listen = o.listen_port >= 0, peer = !o.peer.empty();
    if (listen == peer) throw NetError("--network needs exactly one of --listen PORT (this host waits) and --peer "
                                       "HOST:PORT (this host measures)");
    if (o.listen_port > 65535) throw NetError(fmt::format("--listen: port must be 0..65535, got {}", o.listen_port));
    if (!(o.seconds > 0 && o.seconds <= 600)) throw NetError(fmt::format("--seconds: expected (0, 600], got {}", o.seconds));
    if (!(o.timeout_s > 0)) throw NetError(fmt::format("--timeout-s: expected > 0, got {}", o.timeout_s));
    if (o.rounds < 1 || o.rounds > 100000) throw NetError(fmt::format("--rounds: expected 1..100000, got {}", o.rounds));
    if (!(o.nominal_mbps >= 0 && std::isfinite(o.nominal_mbps)))
      throw NetError(fmt::format("--nominal-mbps: expected a rate > 0, got {}", o.nominal_mbps));
    if (o.two_way_reps < 0 || static_cast<uint64_t>(o.two_way_reps) > kMaxTwoWayReps)
      throw NetError(fmt::format("--two-way-reps: expected 0..{} (0: no two-way phase), got {}", kMaxTwoWayReps, o.two_way_reps));
    if (o.paced_writes < 1 || o.paced_writes > 1000000)
      throw NetError(fmt::format("--paced-writes: expected 1..1000000, got {}", o.paced_writes));
    if (o.two_way_bytes < 1 || o.two_way_bytes > kMaxTwoWayBytes)
      throw NetError(fmt::format("--two-way-bytes: expected 1..{}, got {}", kMaxTwoWayBytes, o.two_way_bytes));
    if (!(o.two_way_gap_ms >= 0 && o.two_way_gap_ms * 1e3 <= static_cast<double>(kMaxTwoWayGapUs)))
      throw NetError(fmt::format("--two-way-gap-ms: expected 0..{}, got {}", kMaxTwoWayGapUs / 1000, o.two_way_gap_ms));
    if (listen && (o.nominal_mbps > 0 || !o.out.empty()))
      throw NetError("--nominal-mbps and --out belong to the measuring side (--peer)");
    return listen ? listen_side(o) : peer_side(o);
  } catch (const NetError& e) {
    std::fprintf(stderr, "tandem: calibrate --network: %s\n", e.what());
    return 1;
  }
}

}  // namespace tandem::cli
