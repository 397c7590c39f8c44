#pragma once
// Subcommand registry for the `tandem` CLI. Each cmd_*.cpp defines one subcommand:
//   static tandem::cli::Registration reg{"launch", "start N local ranks", setup};
// where setup(CLI::App& sub) declares options and returns the function to run (exit code).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tandem::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App&)>;

struct Command {
  std::string name;
  std::string help;
  Setup setup;
};

std::vector<Command>& commands();

struct Registration {
  Registration(std::string name, std::string help, Setup setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// Prints "tandem: <message>" plus the library's last error to stderr; returns 1.
int fail(const std::string& message);

// A sample shape written CxHxW (e.g. 3x32x32), each part positive; false when `text` is not one.
inline bool parse_chw(const std::string& text, int64_t& c, int64_t& h, int64_t& w) {
  long long a = 0, b = 0, d = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lldx%lldx%lld%c", &a, &b, &d, &tail) != 3 || a <= 0 || b <= 0 || d <= 0) return false;
  c = a;
  h = b;
  w = d;
  return true;
}

}  // namespace tandem::cli
