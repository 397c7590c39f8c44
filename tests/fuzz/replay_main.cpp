// fuzz_replay TARGET PATH...: runs every file under each PATH (a file or a folder, not recursive) through the
// fuzz target TARGET once, in name order. Exits non-zero when the target is unknown or no input was found; a
// reader bug crashes (or trips a sanitizer) on the input that shows it, which the output names just before.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/fuzz/fuzz_target.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  auto& targets = tandem::fuzz::registry();
  if (argc < 3 || targets.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...\ntargets:");
    for (const auto& [name, fn] : targets) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const auto fn = targets.at(argv[1]);
  std::vector<fs::path> inputs;
  for (int i = 2; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz_replay: %s is neither a file nor a folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "fuzz_replay: no inputs for target %s\n", argv[1]);
    return 1;
  }
  for (const auto& p : inputs) {
    std::printf("%s: %s\n", argv[1], p.filename().c_str());
    std::fflush(stdout);
    std::ifstream f(p, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    fn(bytes.data(), bytes.size());
  }
  std::printf("%s: %zu inputs replayed\n", argv[1], inputs.size());
  return 0;
}
