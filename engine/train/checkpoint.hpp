#pragma once
// Checkpoint files: a header (magic "TNDMCKPT", format version, record count) and named records (a JSON metadata
// record and f32 tensors), each with its byte length and CRC32. Written to "<path>.tmp", fsync'd, renamed over
// <path> and the directory fsync'd, so a crash leaves either the old or the new file. Loading checks everything and
// refuses a corrupted, truncated or foreign file with kIo naming the file and the record.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::engine::train {

constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  nlohmann::json meta;
  std::vector<std::pair<std::string, std::vector<float>>> tensors;

  void add(std::string name, std::vector<float> values) { tensors.emplace_back(std::move(name), std::move(values)); }
  // The named tensor; throws kIo naming the checkpoint's missing record.
  const std::vector<float>& tensor(const std::string& name) const;
  bool has(const std::string& name) const;
};

void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
Checkpoint load_checkpoint(const std::string& path);

}  // namespace tandem::engine::train
