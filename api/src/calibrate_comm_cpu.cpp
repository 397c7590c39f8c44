// tandem calibrate: the CPU cost of moving bytes (api/src/calibrate_handles.hpp measure_comm_cpu).
#include <arpa/inet.h>
#include <netinet/in.h>
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
#include "engine/core/error.hpp"

namespace tandem::api {

namespace {

double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

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

// One loopback transfer of `bytes`: {sender's thread CPU seconds, receiver's}.
std::pair<double, double> tcp_once(uint64_t bytes) {
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd < 0) io_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) io_error("bind 127.0.0.1");
  if (::listen(listener.fd, 1) != 0) io_error("listen");
  if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) io_error("getsockname");
  Fd out(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (out.fd < 0) io_error("socket");
  if (::connect(out.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) io_error("connect 127.0.0.1");
  Fd in(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (in.fd < 0) io_error("accept");
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

}  // namespace

CommCpuFigures measure_comm_cpu(uint64_t bytes, int iters) {
  TANDEM_REQUIRE(bytes >= 4096 && iters >= 1, "calibrate: comm CPU transfer of {} bytes x {} (need >= 4096, >= 1)",
                 bytes, iters);
  CommCpuFigures f;
  std::vector<double> tcp, copy;
  tcp_once(bytes);  // the first transfer also faults the buffers in and grows the socket buffers
  for (int i = 0; i < iters; ++i) {
    const auto [s, r] = tcp_once(bytes);
    tcp.push_back((s + r) / 2 / static_cast<double>(bytes));
  }
  f.tcp_s_per_byte = median_of(tcp);
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
