#pragma once
// `--device cpu | cuda | cuda:N` (tandem train, tandem calibrate): the compute backend and its device. A bare
// "cuda" under a launcher that names this rank's place on its host (TANDEM_LOCAL_RANK, LOCAL_RANK, Open MPI's
// or Slurm's local rank) is cuda:<local rank>, one GPU per rank as on every multi-GPU node; alone, cuda:0.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "tandem/tandem.h"

namespace tandem::cli {

// The backend name for tandem_model_params_t.backend ("cpu", "cuda:N"), or nullopt when `device` is not one
// of the forms above (the caller names it). With more local ranks than GPUs, bare "cuda" wraps around (local
// rank modulo the GPUs this process sees) and says so once on stderr: the ranks then share GPUs, and their
// device collectives stage through host memory (NCCL takes one rank per GPU).
inline std::optional<std::string> backend_for_device(const std::string& device) {
  if (device == "cpu") return std::string("cpu");
  if (device == "cuda") {
    for (const char* v : {"TANDEM_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
      const char* s = std::getenv(v);
      if (s == nullptr || *s == '\0') continue;
      const int local = std::max(0, std::atoi(s));
      int32_t gpus = 0;
      if (local > 0 && tandem_cuda_device_count(&gpus) == TANDEM_OK && gpus > 0 && local >= gpus) {
        std::fprintf(stderr, "tandem: local rank %d of a host with %d GPU%s: using cuda:%d, shared with other ranks\n",
                     local, gpus, gpus == 1 ? "" : "s", local % gpus);
        return "cuda:" + std::to_string(local % gpus);
      }
      return "cuda:" + std::to_string(local);
    }
    return std::string("cuda:0");
  }
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos)
    return device;
  return std::nullopt;
}

// `--precision f32 | bf16 | fp16` (tandem train, tandem calibrate). bf16 is the cuda backend's bf16 math
// (TANDEM_CUDA_MATH=bf16): convolutions and GEMMs on bf16 tensor cores, f32 accumulation, every tensor between
// layers, the weights and the optimizer state f32. Sets `setting` to the context setting to add (nullptr for
// none) and returns "" -- or why the combination is refused: bf16 on a CPU backend (which computes in f32), and
// fp16, whose gradients need dynamic loss scaling that the trainer does not do.
inline std::string math_setting(const std::string& precision, const std::string& device_or_backend,
                                const char*& setting) {
  setting = nullptr;
  if (precision == "f32") return "";
  if (precision == "fp16")
    return "--precision fp16 needs dynamic loss scaling, which the trainer does not do yet; bf16 needs none "
           "(same range as f32)";
  if (precision != "bf16") return "--precision '" + precision + "' is not f32, bf16 or fp16";
  if (device_or_backend.rfind("cuda", 0) != 0)
    return "--precision bf16 needs --device cuda: the CPU backends compute in f32";
  setting = "TANDEM_CUDA_MATH=bf16";
  return "";
}

constexpr const char* kPrecisionHelp =
    "f32, or bf16 (--device cuda: convolutions and GEMMs on bf16 tensor cores with f32 accumulation; tensors "
    "between layers, weights and optimizer state stay f32)";

constexpr const char* kDeviceHelp =
    "cpu, or cuda[:N] (a GPU: cuDNN convolutions, cuBLAS GEMMs; bare cuda under a launcher is cuda:<local rank>)";

}  // namespace tandem::cli
