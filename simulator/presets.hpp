#pragma once
// Cloud instance presets: the facts that matter for training time and cost. Sources are noted per
// preset in presets.cpp (AWS instance-type pages and on-demand prices, us-east-1 Linux, checked
// 2024-2025; GPU peaks from NVIDIA data sheets; the t2.micro network figure is the one measured for
// the seed paper's setting). Sustained FLOP/s = peak x efficiency; efficiency is a typical fraction
// of peak reached by convolutional training, and --epoch-time-s or a calibration profile replace it
// with measured numbers.
#include <string>
#include <vector>

namespace tandem::simulator {

enum class CreditMode : uint8_t { kNone = 0, kStandard = 1, kUnlimited = 2 };
const char* credit_mode_name(CreditMode m) noexcept;
CreditMode parse_credit_mode(const std::string& s);  // "standard", "unlimited"

// AWS CPU credits (burstable t2/t3): one credit is one vCPU at 100% for one minute.
struct BurstSpec {
  double baseline = 1.0;            // sustained share of each vCPU (0.1 for t2.micro)
  double credits_per_hour = 0;      // earned (6 for t2.micro)
  double max_credits = 0;           // cap on earned credits (144 for t2.micro: 24 h of earnings)
  double launch_credits_per_vcpu = 0;  // t2 standard only (30)
  CreditMode default_mode = CreditMode::kNone;
  double surplus_usd_per_vcpu_hour = 0.05;  // unlimited mode, Linux t2/t3
};

struct Preset {
  std::string name;
  int vcpus = 1;
  int gpus = 0;                       // 0: a CPU node (one rank using all vCPUs)
  double memory_bytes = 0;            // host memory
  double gpu_memory_bytes = 0;        // per GPU
  double peak_flops = 0;              // per rank (all vCPUs of a CPU node, or one GPU), f32
  double efficiency = 0.3;            // sustained fraction of peak for training
  double mem_bytes_per_s = 0;         // per rank (DRAM for CPU nodes, HBM/GDDR for GPUs)
  double kernel_overhead_s = 0;       // per layer per pass (GPU kernel launches)
  double nic_bytes_per_s = 0;         // per host, each direction
  double nic_latency_s = 0;           // one-way host to host through the switch
  double intra_bytes_per_s = 0;       // per GPU link to the host fabric (NVLink/NVSwitch or PCIe)
  double intra_latency_s = 0;
  bool rdma = false;                  // the NIC moves data by RDMA (EFA, InfiniBand); else TCP over Ethernet
  bool bf16 = true;                   // GPU nodes: the GPU computes bfloat16 natively (not before Ampere: T4, V100)
  double usd_per_hour = 0;            // on-demand
  double os_reserved_bytes = 0;       // host memory the OS and the runtime keep
  BurstSpec burst;                    // default_mode kNone: not burstable
  std::string source;                 // where the numbers come from
};

const std::vector<Preset>& presets();
// Throws kInvalidArgument listing the known presets for an unknown name.
const Preset& find_preset(const std::string& name);

}  // namespace tandem::simulator
