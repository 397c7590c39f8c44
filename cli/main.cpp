#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/command.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {
std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}
int fail(const std::string& message) {
  const char* detail = tandem_last_error_message();
  if (detail != nullptr && *detail != '\0') {
    std::fprintf(stderr, "tandem: %s: %s\n", message.c_str(), detail);
  } else {
    std::fprintf(stderr, "tandem: %s\n", message.c_str());
  }
  return 1;
}
}  // namespace tandem::cli

int main(int argc, char** argv) {
  CLI::App app{"tandem: hybrid-parallel training runtime and cluster simulator"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tandem ") + tandem_version_string());
  auto& cmds = tandem::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, tandem::cli::Runner>> runners;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // A command may still refuse an option's value once it runs (CLI::ValidationError, e.g. a malformed --cut);
  // nothing a command throws may end the process with a crash.
  try {
    for (auto& [sub, run] : runners) {
      if (sub->parsed()) return run();
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
    return 1;
  }
  return 1;
}
