// The floor under the zmq and tcp transports: two threads exchange messages in both directions
// at once over loopback -- the pattern of a 2-rank ring step -- with nothing of Tandem's in the
// way: bare ZeroMQ (PAIR sockets, zero-copy send, the receiver copying each message out, as a
// transport must) and bare TCP sockets (non-blocking send/recv straight between the buffers).
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

double zmq_exchange(size_t n, int iters) {
  void* ctx[2] = {zmq_ctx_new(), zmq_ctx_new()};
  void* s[2] = {zmq_socket(ctx[0], ZMQ_PAIR), zmq_socket(ctx[1], ZMQ_PAIR)};
  if (zmq_bind(s[0], "tcp://127.0.0.1:*") != 0) return 0;
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

double tcp_exchange(size_t n, int iters) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1) != 0) return 0;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &alen);
  int fd[2];
  fd[1] = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd[1], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 0;
  fd[0] = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  const int one = 1;
  for (int f : fd) {
    ::setsockopt(f, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(f, F_SETFL, O_NONBLOCK);
  }
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
  std::printf("%12s %16s %16s   (GB/s per direction, both directions at once, 2 threads, loopback)\n", "bytes",
              "bare zeromq", "bare tcp");
  for (size_t n = lo; n <= hi; n *= 4) {
    const double z = zmq_exchange(n, iters), t = tcp_exchange(n, iters);
    std::printf("%12zu %16.3f %16.3f\n", n, z, t);
  }
  return 0;
}
