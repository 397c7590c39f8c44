// The floor under the zmq and tcp transports: two threads exchange messages in both directions
// at once -- the pattern of a 2-rank ring step -- with nothing of Tandem's in the way: bare ZeroMQ
// (PAIR sockets, zero-copy send, the receiver copying each message out, as a transport must) and
// bare stream sockets (non-blocking send/recv straight between the buffers), each over loopback
// TCP and over a local socket (ZeroMQ's ipc with an abstract name; an AF_UNIX socket pair) -- the
// paths the transports take between hosts and between the ranks of one host.
// Prints GB/s per direction for each; a transport cannot beat the floor of what it is built on.
//   bare_exchange [--min BYTES] [--max BYTES] [--iters N]
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void no_free(void*, void*) {}

double zmq_exchange(size_t n, int iters, bool local) {
  void* ctx[2] = {zmq_ctx_new(), zmq_ctx_new()};
  void* s[2] = {zmq_socket(ctx[0], ZMQ_PAIR), zmq_socket(ctx[1], ZMQ_PAIR)};
  const std::string bind = local ? "ipc://@tandem-bare-exchange-" + std::to_string(::getpid()) : "tcp://127.0.0.1:*";
  if (zmq_bind(s[0], bind.c_str()) != 0) return 0;
  char endpoint[256];
  size_t len = sizeof endpoint;
  zmq_getsockopt(s[0], ZMQ_LAST_ENDPOINT, endpoint, &len);
  zmq_connect(s[1], endpoint);
  std::vector<char> out[2] = {std::vector<char>(n, 1), std::vector<char>(n, 2)}, in[2] = {std::vector<char>(n), std::vector<char>(n)};
  auto side = [&](int k) {
    for (int i = 0; i < iters; ++i) {
      zmq_msg_t m;
      zmq_msg_init_data(&m, out[k].data(), n, no_free, nullptr);
      zmq_msg_send(&m, s[k], 0);
      zmq_msg_t r;
      zmq_msg_init(&r);
      zmq_msg_recv(&r, s[k], 0);
      std::memcpy(in[k].data(), zmq_msg_data(&r), n);
      zmq_msg_close(&r);
    }
  };
  const auto t0 = Clock::now();
  std::thread other(side, 1);
  side(0);
  other.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int k = 0; k < 2; ++k) {
    zmq_close(s[k]);
    zmq_ctx_term(ctx[k]);
  }
  return n * double(iters) / secs / 1e9;
}

// Two connected non-blocking stream sockets: loopback TCP (with TCP_NODELAY), or an AF_UNIX pair.
bool socket_pair(bool local, int fd[2]) {
  if (local) {
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) return false;
    for (int i = 0; i < 2; ++i) ::fcntl(fd[i], F_SETFL, O_NONBLOCK);
    return true;
  }
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1) != 0) return false;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &alen);
  fd[1] = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd[1], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
  fd[0] = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  const int one = 1;
  for (int i = 0; i < 2; ++i) {
    ::setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(fd[i], F_SETFL, O_NONBLOCK);
  }
  return true;
}

double socket_exchange(size_t n, int iters, bool local) {
  int fd[2];
  if (!socket_pair(local, fd)) return 0;
  std::vector<char> out[2] = {std::vector<char>(n, 1), std::vector<char>(n, 2)}, in[2] = {std::vector<char>(n), std::vector<char>(n)};
  auto side = [&](int k) {
    for (int i = 0; i < iters; ++i) {
      size_t sent = 0, got = 0;
      while (sent < n || got < n) {
        bool moved = false;
        if (sent < n) {
          const ssize_t w = ::send(fd[k], out[k].data() + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (w > 0) sent += static_cast<size_t>(w), moved = true;
        }
        if (got < n) {
          const ssize_t r = ::recv(fd[k], in[k].data() + got, n - got, MSG_DONTWAIT);
          if (r > 0) got += static_cast<size_t>(r), moved = true;
        }
        if (!moved) {
          pollfd p{fd[k], static_cast<short>((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0)), 0};
          ::poll(&p, 1, 1000);
        }
      }
    }
  };
  const auto t0 = Clock::now();
  std::thread other(side, 1);
  side(0);
  other.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd[0]);
  ::close(fd[1]);
  return n * double(iters) / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  size_t lo = 4096, hi = size_t{16} << 20;
  int iters = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--min") lo = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--max") hi = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bare_exchange [--min BYTES] [--max BYTES] [--iters N]\n");
      return 2;
    }
  }
  std::printf("# GB/s per direction, both directions at once, 2 threads; loopback TCP, then local sockets\n");
  std::printf("%12s %14s %14s %14s %14s\n", "bytes", "zeromq tcp", "socket tcp", "zeromq ipc", "socket unix");
  for (size_t n = lo; n <= hi; n *= 4) {
    const double zt = zmq_exchange(n, iters, false), st = socket_exchange(n, iters, false);
    const double zl = zmq_exchange(n, iters, true), sl = socket_exchange(n, iters, true);
    std::printf("%12zu %14.3f %14.3f %14.3f %14.3f\n", n, zt, st, zl, sl);
  }
  return 0;
}
