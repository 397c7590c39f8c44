#pragma once
// `--device cpu | cuda | cuda:N` (tandem train, tandem calibrate): the compute backend and its device. A bare
// "cuda" under a launcher that names this rank's place on its host (TANDEM_LOCAL_RANK, LOCAL_RANK, Open MPI's
// or Slurm's local rank) is cuda:<local rank>, one GPU per rank as on every multi-GPU node; alone, cuda:0.
#include <cstdlib>
#include <optional>
#include <string>

namespace tandem::cli {

// The backend name for tandem_model_params_t.backend ("cpu", "cuda:N"), or nullopt when `device` is not one
// of the forms above (the caller names it).
inline std::optional<std::string> backend_for_device(const std::string& device) {
  if (device == "cpu") return std::string("cpu");
  if (device == "cuda") {
    for (const char* v : {"TANDEM_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
      const char* s = std::getenv(v);
      if (s != nullptr && *s != '\0') return "cuda:" + std::to_string(std::max(0, std::atoi(s)));
    }
    return std::string("cuda:0");
  }
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos)
    return device;
  return std::nullopt;
}

constexpr const char* kDeviceHelp =
    "cpu, or cuda[:N] (a GPU: cuDNN convolutions, cuBLAS GEMMs; bare cuda under a launcher is cuda:<local rank>)";

}  // namespace tandem::cli
