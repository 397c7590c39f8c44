#pragma once
// Subcommand registry for the `tandem` CLI. Each cmd_*.cpp defines one subcommand:
//   static tandem::cli::Registration reg{"launch", "start N local ranks", setup};
// where setup(CLI::App& sub) declares options and returns the function to run (exit code).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// Numeric checks for options. CLI11's PositiveNumber says "Value 0 not in range 0.000000 to 1797...(309 digits)"
// for 0 or -4 (its range starts at the smallest double); these name the rule and the value.
inline CLI::Validator numeric_rule(bool (*ok)(double), const char* rule, const char* desc) {
  return CLI::Validator(
      [ok, rule](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !ok(v)) return std::string(rule) + ", got " + text;
        return {};
      },
      desc);
}
inline const CLI::Validator kPositive = numeric_rule([](double v) { return v > 0; }, "must be > 0", "POSITIVE");
inline const CLI::Validator kNonNegative =
    numeric_rule([](double v) { return v >= 0; }, "must be >= 0", "NONNEGATIVE");

// --width-mult scales mobilenetv2's channels only; given with another model it was ignored without a word. Returns
// "" or the error (for a zoo name; a spec file states its own widths).
inline std::string width_mult_error(const std::string& model) {
  if (model == "mobilenetv2" || model == "mobilenetv2_imagenet") return "";
  return "--width-mult applies to mobilenetv2 and mobilenetv2_imagenet only (the model is " + model + ")";
}

// A file the command writes at its end (a checkpoint, a trace, a profile): its directory must exist and be writable,
// and the path must not be a directory, checked before any work. Prints "COMMAND: OPTION PATH: why; NOTHING_DONE"
// and returns 2, or returns 0 (also for an empty path).
int check_output_path(const char* command, const std::string& option, const std::string& path,
                      const char* nothing_done);

// Prints "tandem: <message>" plus the library's last error to stderr; returns 1.
int fail(const std::string& message);

// The world size a launcher announced (tandem launch, torchrun, mpirun, srun), or 1.
int launched_world();
// The rank a launcher announced (the same launchers), or 0.
int launched_rank();

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
