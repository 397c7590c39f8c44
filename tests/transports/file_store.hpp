#pragma once
// A KvStore in a directory, for tests whose ranks are separate processes on this machine: set()
// writes a file and renames it into place; get() polls for it.
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
