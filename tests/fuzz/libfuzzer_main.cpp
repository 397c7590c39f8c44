// libFuzzer entry points for tandem_fuzz: $TANDEM_FUZZ_TARGET names the target to drive (see fuzz_target.hpp).
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz_target.hpp"

namespace {
tandem::fuzz::TargetFn target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("TANDEM_FUZZ_TARGET");
  auto& targets = tandem::fuzz::registry();
  if (name == nullptr || targets.count(name) == 0) {
    std::fprintf(stderr, "tandem_fuzz: set TANDEM_FUZZ_TARGET to one of:");
    for (const auto& [n, fn] : targets) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  target = targets.at(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  target(data, size);
  return 0;
}
