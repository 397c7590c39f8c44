#pragma once
// The transport tests' peer rank in a process of its own (tests/transports/peer): started with
// posix_spawn, reaped by its PID, meeting the test's rank through a FileStore in a PeerDir.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tests/transports/file_store.hpp"

extern char** environ;

namespace tandem::transports::testing {

// Starts the peer with `args` (the program first) and this process's environment; -1 on failure.
inline pid_t spawn_peer(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  return posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0 ? pid : -1;
}

// Waits up to 5 s for `pid` to end (it should already have), then kills it; returns its wait status.
inline int reap_peer(pid_t pid) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

// The end of a trial with a killed peer and a partner (ucx_deaf_test, tests/comm/ucx_shrink_test): kills `killed` if it
// still runs and reaps both; returns the partner's exit code (-1 when it did not exit, or never started).
inline int reap_killed_and_partner(pid_t killed, pid_t partner) {
  if (killed > 0) {
    ::kill(killed, SIGKILL);
    reap_peer(killed);
  }
  if (partner <= 0) return -1;
  const int status = reap_peer(partner);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A FileStore in a fresh directory of its own under the system's temporary one, named after this process, `name` and
// a counter, shared by a test and the peer processes it spawns (pass path() to them); removed again with it.
class PeerDir {
 public:
  explicit PeerDir(const std::string& name) : path_(fresh(name)), store_(path_) {}
  ~PeerDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  PeerDir(const PeerDir&) = delete;
  PeerDir& operator=(const PeerDir&) = delete;
  std::string path() const { return path_.string(); }
  FileStore& store() { return store_; }

 private:
  static std::filesystem::path fresh(const std::string& name) {
    static std::atomic<int> counter{0};
    auto dir = std::filesystem::temp_directory_path() /
               fmt::format("tandem-transport-test-{}-{}-{}", ::getpid(), name, counter.fetch_add(1));
    std::filesystem::remove_all(dir);
    return dir;
  }
  std::filesystem::path path_;
  FileStore store_;
};

}  // namespace tandem::transports::testing
