#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "engine/core/suggest.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {
int check_output_path(const char* command, const std::string& option, const std::string& path,
                      const char* nothing_done) {
  if (path.empty()) return 0;
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "%s: %s %s: is a directory, not a file; %s\n", command, option.c_str(), path.c_str(),
                 nothing_done);
    return 2;
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::access(dir.c_str(), W_OK) != 0) {
    std::fprintf(stderr, "%s: %s %s: cannot write there (%s: %s); %s\n", command, option.c_str(), path.c_str(),
                 dir.c_str(), std::strerror(errno), nothing_done);
    return 2;
  }
  return 0;
}

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}
int launched_world() {
  for (const char* v : {"TANDEM_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') return std::max(1, std::atoi(s));
  }
  return 1;
}
int launched_rank() {
  for (const char* v : {"TANDEM_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') return std::max(0, std::atoi(s));
  }
  return 0;
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

namespace {

// Mistakes CLI11 reports badly, caught before it parses: an unknown command or option gets the closest known
// one; `launch -np N` (mpirun's spelling) is taken as -n N; a launch whose rank command lacks the `--` in front
// is told where to put it. Returns an exit status when the command line is refused, else -1.
int check_command_line(CLI::App& app, std::vector<std::string>& args) {
  if (args.size() < 2 || args[1].empty() || args[1][0] == '-') return -1;
  std::vector<std::string> names;
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) {
    names.push_back(s->get_name());
    if (s->get_name() == args[1]) sub = s;
  }
  if (sub == nullptr) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "tandem: unknown command '%s'%s; the commands are %s (tandem --help)\n", args[1].c_str(),
                 tandem::did_you_mean(args[1], names).c_str(), list.c_str());
    return 2;
  }
  // a nested command (`bench allreduce`) checks its own options
  size_t first = 2;
  std::string path = args[1];
  while (first < args.size() && !args[first].empty() && args[first][0] != '-') {
    CLI::App* nested = nullptr;
    for (CLI::App* s : sub->get_subcommands([](CLI::App*) { return true; }))
      if (s->get_name() == args[first]) nested = s;
    if (nested == nullptr) break;
    sub = nested;
    path += " " + args[first++];
  }
  const bool launch = args[1] == "launch";
  const bool has_dashes = std::find(args.begin(), args.end(), "--") != args.end();
  std::vector<std::string> longs;
  for (const CLI::Option* opt : sub->get_options())
    for (const std::string& l : opt->get_lnames()) longs.push_back("--" + l);
  for (size_t i = first; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (launch && a == "-np") a = "-n";  // mpirun's spelling
    if (a.rfind("--", 0) != 0 || a.size() < 3) continue;
    const std::string name = a.substr(0, a.find('='));
    if (sub->get_option_no_throw(name) != nullptr || name == "--help") continue;
    if (launch && !has_dashes) {
      std::fprintf(stderr, "tandem launch: '%s' is not a launch option; put `--` before the rank's command: "
                   "tandem launch -n N -- PROGRAM ARGS...\n", name.c_str());
      return 2;
    }
    std::fprintf(stderr, "tandem %s: unknown option '%s'%s (tandem %s --help)\n", path.c_str(), name.c_str(),
                 tandem::did_you_mean(name, longs).c_str(), path.c_str());
    return 2;
  }
  return -1;
}

}  // namespace

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
  std::vector<std::string> args(argv, argv + argc);
  if (const int rc = check_command_line(app, args); rc >= 0) return rc;
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);  // CLI11 takes them last first
    app.parse(reversed);
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
