#pragma once
// Every TANDEM_* environment variable read anywhere in the tree (library, CLI, launcher), in one
// registry with its meaning and default; tandem.h lists the same table for users. A Settings is a
// snapshot of them: read from the environment once (each context at tandem_context_create; the
// process once, on first use, for code that runs without a context), then overridden by the
// context's params. Readers ask current(): the settings of the context whose call runs on this
// thread (installed by the C API's scope), else the process snapshot.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::settings {

enum class Kind { kText, kInteger, kChoice };

struct Variable {
  std::string_view name;
  Kind kind;
  int64_t min;                    // kInteger: inclusive range
  int64_t max;
  std::string_view choices;       // kChoice: '|'-separated words
  std::string_view default_text;  // what applies when unset
  std::string_view meaning;
};

// The registry, in the order of tandem.h's table.
std::span<const Variable> variables() noexcept;
// nullptr when `name` is not registered.
const Variable* find(std::string_view name) noexcept;

class Settings {
 public:
  // Every registered variable as the environment has it now (empty counts as unset).
  static Settings from_environment();

  // Sets (nullopt: unsets) `name`; kInvalidArgument naming it when it is not registered.
  void set(std::string_view name, std::optional<std::string> value);
  // "NAME=VALUE" (as in an environment); kInvalidArgument naming the text when malformed.
  void assign(std::string_view assignment);
  // kInvalidArgument naming the first set variable whose value does not fit its kind.
  void validate() const;

  // The value, or nullptr when unset. `name` must be registered (kInternal otherwise).
  const char* get(std::string_view name) const;
  // The value, checked against its kind (kInvalidArgument naming the variable).
  std::optional<std::string> text(std::string_view name) const;
  // An integer within the registry's range; kInvalidArgument naming the variable otherwise.
  std::optional<int64_t> integer(std::string_view name) const;
  // A kChoice whose choices are "0|1": true for "1".
  std::optional<bool> flag(std::string_view name) const;

 private:
  std::vector<std::optional<std::string>> values_ = std::vector<std::optional<std::string>>(variables().size());
};

// Throws kInvalidArgument naming the variable when `value` does not fit `v`'s kind.
void check_value(const Variable& v, std::string_view value);

// The process snapshot (taken on first use).
std::shared_ptr<const Settings> process();
// This thread's installed settings, else process().
std::shared_ptr<const Settings> current();

// An environment lookup for code that takes one (engine/comm's EnvLookup): registered TANDEM_*
// names from current(), any other name (RANK, OMPI_COMM_WORLD_*, SLURM_*) from the environment;
// nullptr when unset. The text lives as long as the settings it came from (the context's, or the
// process snapshot).
const char* lookup(const char* name);

// Installs `s` as this thread's settings for the scope's lifetime (nests).
class Scope {
 public:
  explicit Scope(std::shared_ptr<const Settings> s);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::shared_ptr<const Settings> prev_;
};

// For tests of code that runs without a context: replaces the process snapshot by one with `name`
// set to `value` (unchecked; nullptr unsets) and restores it on destruction. Not for concurrent use
// with another ScopedProcessValue.
class ScopedProcessValue {
 public:
  ScopedProcessValue(std::string_view name, const char* value);
  ~ScopedProcessValue();
  ScopedProcessValue(const ScopedProcessValue&) = delete;
  ScopedProcessValue& operator=(const ScopedProcessValue&) = delete;

 private:
  std::shared_ptr<const Settings> prev_;
};

}  // namespace tandem::settings
