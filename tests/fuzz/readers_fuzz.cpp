// The file and JSON readers: model spec, cluster, job, calibration profile, IDX, CIFAR-10 and checkpoints.
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/error.hpp"
#include "engine/data/readers.hpp"
#include "engine/nn/model_spec.hpp"
#include "engine/train/checkpoint.hpp"
#include "simulator/cluster.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/job.hpp"
#include "tests/fuzz/checkpoint_identity.hpp"
#include "tests/fuzz/fuzz_target.hpp"

namespace {

// Parses JSON text the way the readers' callers do; nullopt for text that is not JSON.
std::optional<nlohmann::json> parse_json(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

TANDEM_FUZZ_TARGET(model_spec_json) {
  namespace nn = tandem::engine::nn;
  try {
    const nn::ModelSpec spec = nn::model_from_json_text(std::string(tandem::fuzz::as_text(data, size)));
    (void)spec.totals();
    // What the reader accepted, it writes back and reads again to the same spec.
    const nlohmann::json j = nn::model_to_json(spec);
    if (nn::model_to_json(nn::model_from_json(j)) != j) __builtin_trap();
  } catch (const tandem::Error&) {
  }
}

TANDEM_FUZZ_TARGET(cluster_json) {
  const std::string text(tandem::fuzz::as_text(data, size));
  try {
    // parse_cluster reads a path when the text names a file: keep the fuzzer to inline specifications.
    if (text.find('/') == std::string::npos && text.find(".json") == std::string::npos)
      (void)tandem::simulator::parse_cluster(text);
    if (auto j = parse_json(data, size)) (void)tandem::simulator::cluster_from_json(*j);
  } catch (const tandem::Error&) {
  }
}

TANDEM_FUZZ_TARGET(job_json) {
  const std::string text(tandem::fuzz::as_text(data, size));
  // "model_file" names a file to read (the model spec reader has its own target): keep the fuzzer off the disk.
  if (text.find("model_file") != std::string::npos) return;
  try {
    (void)tandem::simulator::parse_job_text(text);
  } catch (const tandem::Error&) {
  }
}

TANDEM_FUZZ_TARGET(profile_json) {
  try {
    if (auto j = parse_json(data, size)) {
      const auto p = tandem::simulator::profile_from_json(*j);
      (void)tandem::simulator::profile_to_json(p);
    }
  } catch (const tandem::Error&) {
  }
}

TANDEM_FUZZ_TARGET(idx) {
  const std::string path = tandem::fuzz::write_scratch("input.idx", data, size);
  try {
    (void)tandem::engine::data::read_idx(path);
  } catch (const tandem::Error&) {
  }
}

TANDEM_FUZZ_TARGET(cifar) {
  tandem::fuzz::write_scratch("test_batch.bin", data, size);
  try {
    (void)tandem::engine::data::load_cifar10(false, tandem::fuzz::scratch_dir().string());
  } catch (const tandem::Error&) {
  }
}

// The checkpoint reader, and the trainer's reading of its metadata for the run of tests/fuzz/checkpoint_identity.hpp.
TANDEM_FUZZ_TARGET(checkpoint) {
  namespace train = tandem::engine::train;
  const std::string path = tandem::fuzz::write_scratch("input.ckpt", data, size);
  try {
    (void)train::load_checkpoint(path);
    const tandem::fuzz::CheckpointIdentity id;
    (void)train::load_training_checkpoint(path, id.identity, 1, 0);
  } catch (const tandem::Error&) {
  }
}
