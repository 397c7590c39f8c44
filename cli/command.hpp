#pragma once
// Subcommand registry for the `tandem` CLI. Each cmd_*.cpp defines one subcommand:
//   static tandem::cli::Registration reg{"launch", "start N local ranks", setup};
// where setup(CLI::App& sub) declares options and returns the function to run (exit code).
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

}  // namespace tandem::cli
