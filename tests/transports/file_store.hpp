#pragma once
// A KvStore in a directory, for tests whose ranks are separate processes on this machine: set()
// writes a file and renames it into place; get() polls for it; add() counts under an exclusive flock.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "engine/core/error.hpp"
#include "transports/transport.hpp"

namespace tandem::transports::testing {

class FileStore final : public KvStore {
 public:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) { std::filesystem::create_directories(dir_); }

  void set(const std::string& key, const std::string& value) override {
    const auto final_path = path_of(key);
    const auto tmp = final_path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << value;
      TANDEM_CHECK(out.good(), Status::kIo, "FileStore: cannot write {}", tmp);
    }
    std::filesystem::rename(tmp, final_path);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const int fd = ::open((dir_ / "counters.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    TANDEM_CHECK(fd >= 0, Status::kIo, "FileStore: cannot open the counters' lock in {}", dir_.string());
    ::flock(fd, LOCK_EX);
    int64_t value = 0;
    try {
      if (std::ifstream in(path_of(key), std::ios::binary); in) {
        std::string text;
        in >> text;
        value = std::stoll(text);
      }
      value += delta;
      set(key, std::to_string(value));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return value;
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    const auto p = path_of(key);
    while (!std::filesystem::exists(p)) {
      TANDEM_CHECK(std::chrono::steady_clock::now() < until, Status::kTimeout,
                   "FileStore: key '{}' did not appear within {} ms", key, timeout.count());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::filesystem::path path_of(const std::string& key) const {
    std::string name;
    for (unsigned char c : key) name += fmt::format("{:02x}", c);
    return dir_ / name;
  }

  std::filesystem::path dir_;
};

}  // namespace tandem::transports::testing
