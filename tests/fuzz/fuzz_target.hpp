#pragma once
// One fuzz entry point per reader, written once and run two ways:
//  * tandem_fuzz (clang, TANDEM_FUZZ=ON): libFuzzer drives the target named by $TANDEM_FUZZ_TARGET;
//  * fuzz_replay (every build, gcc included): feeds each committed corpus file through the same entry point.
// A target returns normally for any input; the reader's clear error (tandem::Error) is an expected outcome.
// A crash, a sanitizer report, an escaping exception of another type or a hang is a bug in the reader.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

namespace tandem::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);

inline std::map<std::string, TargetFn>& registry() {
  static std::map<std::string, TargetFn> targets;
  return targets;
}

struct Register {
  Register(const char* name, TargetFn fn) { registry().emplace(name, fn); }
};

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A scratch folder of this process (removed at exit) for readers that take a path.
const std::filesystem::path& scratch_dir();
// Writes `size` bytes to scratch_dir()/name and returns the path.
std::string write_scratch(const std::string& name, const uint8_t* data, size_t size);

}  // namespace tandem::fuzz

#define TANDEM_FUZZ_TARGET(name)                                                              \
  static void tandem_fuzz_##name(const uint8_t* data, size_t size);                           \
  static const ::tandem::fuzz::Register tandem_fuzz_register_##name(#name, tandem_fuzz_##name); \
  static void tandem_fuzz_##name(const uint8_t* data, size_t size)
