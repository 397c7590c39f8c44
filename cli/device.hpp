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

// `--precision f32 | bf16 | fp16` (tandem train, tandem calibrate). bf16 and fp16 are the cuda backend's 16-bit
// math (TANDEM_CUDA_MATH): convolutions and GEMMs on bf16 / fp16 tensor cores, f32 accumulation, every tensor between
// layers, the weights and the optimizer state f32. On a CPU backend fp16 is an emulation (TANDEM_CPU_MATH=fp16:
// operands rounded to IEEE half exactly as the GPU sees them, computed in f32 -- slower, not faster), for checking
// that a model trains in fp16 before renting a GPU; `emulation` says whether the command takes it (tandem train
// does; tandem calibrate does not: it would time the emulation). fp16 needs loss scaling, which tandem train turns on
// (--loss-scale). Sets `setting` to the context setting to add (nullptr for none) and returns "" -- or why the
// combination is refused: bf16 on a CPU backend (which computes in f32), fp16 on a CPU where emulation is not taken.
inline std::string math_setting(const std::string& precision, const std::string& device_or_backend,
                                const char*& setting, bool emulation = false) {
  setting = nullptr;
  if (precision == "f32") return "";
  if (precision != "bf16" && precision != "fp16") return "--precision '" + precision + "' is not f32, bf16 or fp16";
  const bool cuda = device_or_backend.rfind("cuda", 0) == 0;
  if (precision == "bf16") {
    if (!cuda) return "--precision bf16 needs --device cuda: the CPU backends compute in f32 (fp16 has a CPU emulation)";
    setting = "TANDEM_CUDA_MATH=bf16";
    return "";
  }
  if (cuda) {
    setting = "TANDEM_CUDA_MATH=fp16";
    return "";
  }
  if (!emulation)
    return "--precision fp16 needs --device cuda here: on a CPU it is only an emulation (tandem train "
           "--precision fp16 runs it), whose speed says nothing about a GPU's";
  setting = "TANDEM_CPU_MATH=fp16";
  return "";
}

constexpr const char* kPrecisionHelp =
    "f32, bf16 (--device cuda: convolutions and GEMMs on bf16 tensor cores with f32 accumulation; tensors "
    "between layers, weights and optimizer state stay f32) or fp16 (the same on fp16 tensor cores, with dynamic loss "
    "scaling; on a CPU an EMULATION that rounds the operands to half as the GPU would -- slower than f32, for "
    "checking that a model trains in fp16)";

constexpr const char* kDeviceHelp =
    "cpu, or cuda[:N] (a GPU: cuDNN convolutions, cuBLAS GEMMs; bare cuda under a launcher is cuda:<local rank>)";

}  // namespace tandem::cli
