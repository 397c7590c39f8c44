#pragma once
// Helpers shared by the rendezvous tests: free loopback ports, log capture, raw TCP sockets and
// child processes with deadlines (every child is killed and reaped by PID).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/log.hpp"

namespace rdv_test {

// Runs `body(rank)` on `ranks` threads and returns each rank's error ("" when it returned).
template <typename Fn>
inline std::vector<std::string> on_ranks(int ranks, Fn body) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> ts;
  for (int r = 0; r < ranks; ++r)
    ts.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

using Clock = std::chrono::steady_clock;

inline int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// A port the kernel just handed out on 127.0.0.1 (free at the time of the call).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Connected TCP socket to 127.0.0.1:port, or -1.
inline int tcp_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool write_all(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes (true) or `timeout_ms` passes (false).
inline bool wait_closed(int fd, int timeout_ms) {
  const auto start = Clock::now();
  char buf[4096];
  while (ms_since(start) < timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

// Collects log lines while alive (the server logs from its own thread).
class LogCapture {
 public:
  LogCapture() { tandem::log::set_sink(&LogCapture::sink, this); }
  ~LogCapture() { tandem::log::set_sink(nullptr, nullptr); }
  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }
  bool contains(const std::string& needle) {
    for (const auto& l : lines()) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  static void sink(int, const char* msg, void* user) {
    auto* self = static_cast<LogCapture*>(user);
    std::lock_guard lock(self->mu_);
    self->lines_.emplace_back(msg);
  }
  std::mutex mu_;
  std::vector<std::string> lines_;
};

struct ProcessResult {
  int status = -1;         // raw wait status
  bool timed_out = false;  // killed by us at the deadline
  std::string out, err;
  int64_t elapsed_ms = 0;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Runs argv with extra environment, capturing stdout/stderr; SIGKILLs its process group at the
// deadline. `on_start` (optional) gets the PID once it runs (to send it signals).
template <typename OnStart>
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          int timeout_ms, OnStart on_start) {
  int out_pipe[2], err_pipe[2];
  ::pipe2(out_pipe, O_CLOEXEC);
  ::pipe2(err_pipe, O_CLOEXEC);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    if (env.count(s.substr(0, s.find('='))) == 0) env_strings.push_back(s);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  on_start(pid);
  ProcessResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const int left = timeout_ms - static_cast<int>(ms_since(start));
    if (left <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, std::min(left, 100)) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  // Output is closed; the process itself gets the rest of the deadline to exit.
  for (;;) {
    pid_t w = ::waitpid(pid, &r.status, WNOHANG);
    if (w == pid) break;
    if (ms_since(start) > timeout_ms) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &r.status, 0);
      break;
    }
    ::usleep(5000);
  }
  r.elapsed_ms = ms_since(start);
  return r;
}

inline ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                 int timeout_ms) {
  return run_process(argv, env, timeout_ms, [](pid_t) {});
}

// True when `pid` no longer exists (not even as a zombie of someone else).
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A zombie still answers kill(); check its state.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;
  char line[512] = {0};
  const bool ok = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  if (!ok) return true;
  const char* close_paren = std::strrchr(line, ')');
  return close_paren != nullptr && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

}  // namespace rdv_test
