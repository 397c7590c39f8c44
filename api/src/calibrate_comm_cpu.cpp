// tandem calibrate: the CPU cost of moving bytes (api/src/calibrate_handles.hpp measure_comm_cpu).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "api/src/calibrate_handles.hpp"
#include "api/src/comm_cpu_fit.hpp"
#include "engine/core/error.hpp"

namespace tandem::api {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void io_error(const char* call) {
  TANDEM_THROW(Status::kIo, "calibrate: measuring the CPU cost of a loopback TCP transfer: {} failed: {}", call,
               std::strerror(errno));
}

// A connected loopback TCP pair: `out` (the sender's end, TCP_NODELAY as the runtime's transports) and `in`.
struct LoopbackPair {
  Fd listener{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  Fd out{-1}, in{-1};
  LoopbackPair() {
    if (listener.fd < 0) io_error("socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) io_error("bind 127.0.0.1");
    if (::listen(listener.fd, 1) != 0) io_error("listen");
    if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) io_error("getsockname");
    out.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (out.fd < 0) io_error("socket");
    const int one = 1;
    if (::setsockopt(out.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) io_error("setsockopt TCP_NODELAY");
    if (::connect(out.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) io_error("connect 127.0.0.1");
    in.fd = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (in.fd < 0) io_error("accept");
  }
};

// One loopback transfer of `bytes`: {sender's thread CPU seconds, receiver's}.
std::pair<double, double> tcp_once(uint64_t bytes) {
  LoopbackPair pair;
  Fd& out = pair.out;
  Fd& in = pair.in;
  double recv_cpu = 0;
  uint64_t received = 0;
  std::thread receiver([&] {
    std::vector<char> buf(size_t{1} << 20);
    const double t0 = thread_cpu_s();
    while (received < bytes) {
      const ssize_t n = ::recv(in.fd, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      received += static_cast<uint64_t>(n);
    }
    recv_cpu = thread_cpu_s() - t0;
  });
  std::vector<char> data(static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 20)), 1);
  const double t0 = thread_cpu_s();
  uint64_t sent = 0;
  bool failed = false;
  while (sent < bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(bytes - sent, data.size()));
    const ssize_t n = ::send(out.fd, data.data(), want, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed = true;
      break;
    }
    sent += static_cast<uint64_t>(n);
  }
  const double send_cpu = thread_cpu_s() - t0;
  if (failed) ::shutdown(out.fd, SHUT_RDWR);  // the receiver sees the end and stops
  receiver.join();
  if (failed) io_error("send");
  TANDEM_CHECK(received == bytes, Status::kIo, "calibrate: loopback TCP transfer delivered {} of {} bytes", received,
               bytes);
  return {send_cpu, recv_cpu};
}

// A loopback transfer at a slow link's pace: `writes` sends of `chunk` bytes, `interval_us` apart (a sleep, as a
// sender at a link's pace waits for ACKs), the receiver reading what arrived (a recv that sleeps until data comes).
struct PacedRun {
  double send_cpu = 0, recv_cpu = 0;
  uint64_t writes = 0, reads = 0, bytes = 0;
};
PacedRun tcp_paced_once(size_t chunk, uint64_t writes, long interval_us) {
  LoopbackPair pair;
  PacedRun run;
  run.bytes = chunk * writes;
  uint64_t received = 0;
  std::thread receiver([&] {
    std::vector<char> buf(size_t{1} << 20);
    const double t0 = thread_cpu_s();
    while (received < run.bytes) {
      const ssize_t n = ::recv(pair.in.fd, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      received += static_cast<uint64_t>(n);
      ++run.reads;
    }
    run.recv_cpu = thread_cpu_s() - t0;
  });
  std::vector<char> data(chunk, 1);
  const timespec pause{0, interval_us * 1000};
  const double t0 = thread_cpu_s();
  bool failed = false;
  for (uint64_t sent = 0; run.writes < writes && !failed;) {
    const ssize_t n = ::send(pair.out.fd, data.data() + sent, chunk - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    failed = n <= 0;
    sent += failed ? 0 : static_cast<size_t>(n);
    if (sent == chunk) {
      sent = 0;
      ++run.writes;
      ::nanosleep(&pause, nullptr);
    }
  }
  run.send_cpu = thread_cpu_s() - t0;
  if (failed) ::shutdown(pair.out.fd, SHUT_RDWR);
  receiver.join();
  if (failed) io_error("send");
  TANDEM_CHECK(received == run.bytes, Status::kIo, "calibrate: paced loopback TCP transfer delivered {} of {} bytes",
               received, run.bytes);
  return run;
}

// Per side and wake-up: the sender's CPU per write and the receiver's per read, less the bytes' share.
double per_wakeup_s(double send_cpu_s, uint64_t writes, double recv_cpu_s, uint64_t reads, uint64_t bytes,
                    double tcp_s_per_byte) {
  TANDEM_REQUIRE(writes > 0 && reads > 0, "calibrate: a paced transfer needs writes and reads (got {} and {})", writes,
                 reads);
  const double send = comm_cpu_s_per_wakeup(send_cpu_s, writes, bytes, tcp_s_per_byte);
  const double recv = comm_cpu_s_per_wakeup(recv_cpu_s, reads, bytes, tcp_s_per_byte);
  return (send + recv) / 2;
}

}  // namespace

double measure_tcp_wakeup_cpu(double tcp_s_per_byte, int reps) {
  TANDEM_REQUIRE(reps >= 1 && tcp_s_per_byte >= 0, "calibrate: paced transfer x {} at {} s per byte (need >= 1, >= 0)",
                 reps, tcp_s_per_byte);
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    const PacedRun r = tcp_paced_once(kTcpWakeupChunkBytes, kTcpWakeupWrites, kTcpWakeupIntervalUs);
    const double w = per_wakeup_s(r.send_cpu, r.writes, r.recv_cpu, r.reads, r.bytes, tcp_s_per_byte);
    if (i == 0 || w < best) best = w;  // the least disturbed repetition: other work only adds to a thread's CPU
  }
  return std::max(best, 0.0);
}

CommCpuFigures measure_comm_cpu(uint64_t bytes, int iters) {
  TANDEM_REQUIRE(bytes >= 4096 && iters >= 1, "calibrate: comm CPU transfer of {} bytes x {} (need >= 4096, >= 1)",
                 bytes, iters);
  CommCpuFigures f;
  std::vector<double> tcp, copy;
  tcp_once(bytes);  // the first transfer also faults the buffers in and grows the socket buffers
  for (int i = 0; i < iters; ++i) {
    const auto [s, r] = tcp_once(bytes);
    tcp.push_back((comm_cpu_s_per_byte(s, bytes) + comm_cpu_s_per_byte(r, bytes)) / 2);
  }
  f.tcp_s_per_byte = median_of(tcp);
  f.tcp_s_per_wakeup = measure_tcp_wakeup_cpu(f.tcp_s_per_byte);
  const size_t n = size_t{32} << 20;  // past the caches, like a gradient bucket streaming through the ring
  std::vector<char> src(n, 3), dst(n, 0);
  for (int i = 0; i <= iters; ++i) {
    const double t0 = thread_cpu_s();
    std::memcpy(dst.data(), src.data(), n);
    const double s = thread_cpu_s() - t0;
    if (i > 0) copy.push_back(s / static_cast<double>(n));  // the first pass also faults dst in
    src[static_cast<size_t>(i)] = dst[n - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  f.copy_s_per_byte = median_of(copy);
  return f;
}

}  // namespace tandem::api
