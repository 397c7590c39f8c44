#include <cstdio>

#include "cli/command.hpp"
#include "tandem/tandem.h"

namespace {
tandem::cli::Registration reg{"version", "print the library version", [](CLI::App&) -> tandem::cli::Runner {
  return [] {
    std::printf("tandem %s (ABI %u)\n", tandem_version_string(), tandem_version());
    return 0;
  };
}};
}  // namespace
