#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <system_error>

#include "tests/fuzz/fuzz_target.hpp"

namespace tandem::fuzz {

namespace {
struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    dir = std::filesystem::temp_directory_path() / ("tandem-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
}  // namespace

const std::filesystem::path& scratch_dir() {
  static Scratch s;
  return s.dir;
}

std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) throw std::runtime_error("fuzz harness: cannot write " + path);
  return path;
}

}  // namespace tandem::fuzz
