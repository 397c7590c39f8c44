#include "simulator/presets.hpp"

#include "engine/core/error.hpp"
#include "engine/core/suggest.hpp"
#include "simulator/network/topology.hpp"

namespace tandem::simulator {

namespace {
constexpr double kGiB = 1073741824.0;
constexpr double kGbps = 1e9 / 8;  // bytes/s in one Gbit/s

// A Xeon core with AVX2 FMA does 32 f32 FLOP/cycle, with AVX-512 64; a vCPU is one hyperthread.
std::vector<Preset> build() {
  std::vector<Preset> v;
  {
    Preset p;
    p.name = "t2.micro";
    p.vcpus = 1;
    p.memory_bytes = 1 * kGiB;
    p.peak_flops = 2.5e9 * 32;  // Xeon E5-2676 v3 (Haswell) 2.4 GHz, up to 3.3 turbo, AVX2
    p.efficiency = 0.25;
    p.mem_bytes_per_s = 8e9;
    // "low to moderate". ~65 Mbit/s sustained between t2.micro hosts is a measured TCP goodput; the TCP link model
    // adds headers and ACKs on top of the line rate, so the preset holds the line rate that gives a ring's uplink
    // (data one way, ACKs of the incoming stream) 65 Mbit/s of payload: 69.4 Mbit/s.
    p.nic_bytes_per_s = 65e6 / 8 * network::kTcpDuplexWirePerPayload;
    p.nic_latency_s = 250e-6;
    p.usd_per_hour = 0.0116;
    p.os_reserved_bytes = 200 * 1048576.0;
    p.burst = {0.10, 6, 144, 30, CreditMode::kStandard, 0.05};
    p.source = "aws.amazon.com/ec2/instance-types/t2 (1 vCPU, 1 GiB, 10% baseline, 6 credits/h, 144 max, "
               "30 launch credits), ec2/pricing/on-demand us-east-1 $0.0116/h; network measured ~65 Mbit/s TCP goodput "
               "(69.4 Mbit/s line rate)";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "t3.micro";
    p.vcpus = 2;
    p.memory_bytes = 1 * kGiB;
    p.peak_flops = 1 * 3.1e9 * 64;  // 2 vCPUs = 1 core of a Xeon Platinum 8175M, AVX-512
    p.efficiency = 0.25;
    p.mem_bytes_per_s = 10e9;
    p.nic_bytes_per_s = 5 * kGbps;  // "up to 5 Gigabit" (burst; baseline ~0.064 Gbit/s per AWS tables)
    p.nic_latency_s = 100e-6;
    p.usd_per_hour = 0.0104;
    p.os_reserved_bytes = 200 * 1048576.0;
    p.burst = {0.10, 12, 288, 0, CreditMode::kUnlimited, 0.05};
    p.source = "aws.amazon.com/ec2/instance-types/t3 (2 vCPU, 1 GiB, 10% baseline per vCPU, 12 credits/h, "
               "288 max, no launch credits, unlimited by default), on-demand us-east-1 $0.0104/h";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "c5.large";
    p.vcpus = 2;
    p.memory_bytes = 4 * kGiB;
    p.peak_flops = 1 * 3.4e9 * 64;  // 1 core, Xeon Platinum 8124M/8275CL 3.4-3.6 GHz, AVX-512
    p.efficiency = 0.35;
    p.mem_bytes_per_s = 12e9;
    p.nic_bytes_per_s = 10 * kGbps;  // "up to 10 Gigabit"
    p.nic_latency_s = 60e-6;
    p.usd_per_hour = 0.085;
    p.os_reserved_bytes = 300 * 1048576.0;
    p.source = "aws.amazon.com/ec2/instance-types/c5 (2 vCPU, 4 GiB, up to 10 Gbit/s), us-east-1 $0.085/h";
    v.push_back(p);
  }
  {
    Preset p = v.back();
    p.name = "c5.xlarge";
    p.vcpus = 4;
    p.memory_bytes = 8 * kGiB;
    p.peak_flops = 2 * 3.4e9 * 64;
    p.mem_bytes_per_s = 20e9;
    p.usd_per_hour = 0.17;
    p.source = "aws.amazon.com/ec2/instance-types/c5 (4 vCPU, 8 GiB, up to 10 Gbit/s), us-east-1 $0.17/h";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "g4dn.xlarge";
    p.vcpus = 4;
    p.gpus = 1;
    p.bf16 = false;  // Turing: fp16 tensor cores only
    p.memory_bytes = 16 * kGiB;
    p.gpu_memory_bytes = 16 * kGiB;
    p.peak_flops = 8.1e12;  // T4 f32 (65 TFLOP/s f16 tensor cores)
    p.efficiency = 0.45;
    p.mem_bytes_per_s = 320e9;
    p.kernel_overhead_s = 8e-6;
    p.nic_bytes_per_s = 25 * kGbps;  // "up to 25 Gigabit"
    p.nic_latency_s = 50e-6;
    p.intra_bytes_per_s = 12e9;  // PCIe 3.0 x16
    p.intra_latency_s = 5e-6;
    p.usd_per_hour = 0.526;
    p.os_reserved_bytes = 1 * kGiB;
    p.source = "aws.amazon.com/ec2/instance-types/g4 (1x T4 16 GB, 4 vCPU, 16 GiB, up to 25 Gbit/s), $0.526/h; "
               "NVIDIA T4 data sheet (8.1 TFLOP/s f32, 320 GB/s)";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "p3.2xlarge";
    p.vcpus = 8;
    p.gpus = 1;
    p.bf16 = false;  // Volta: fp16 tensor cores only (p3.16xlarge copies this)
    p.memory_bytes = 61 * kGiB;
    p.gpu_memory_bytes = 16 * kGiB;
    p.peak_flops = 15.7e12;  // V100 SXM2 f32 (125 TFLOP/s f16 tensor cores)
    p.efficiency = 0.5;
    p.mem_bytes_per_s = 900e9;
    p.kernel_overhead_s = 6e-6;
    p.nic_bytes_per_s = 10 * kGbps;  // "up to 10 Gigabit"
    p.nic_latency_s = 50e-6;
    p.intra_bytes_per_s = 12e9;
    p.intra_latency_s = 5e-6;
    p.usd_per_hour = 3.06;
    p.os_reserved_bytes = 1 * kGiB;
    p.source = "aws.amazon.com/ec2/instance-types/p3 (1x V100 16 GB, 8 vCPU, 61 GiB, up to 10 Gbit/s), $3.06/h; "
               "NVIDIA V100 data sheet (15.7 TFLOP/s f32, 900 GB/s)";
    v.push_back(p);
  }
  {
    Preset p = v.back();
    p.name = "p3.16xlarge";
    p.vcpus = 64;
    p.gpus = 8;
    p.memory_bytes = 488 * kGiB;
    p.nic_bytes_per_s = 25 * kGbps;
    p.intra_bytes_per_s = 150e9;  // NVLink 2.0 hybrid cube mesh: 300 GB/s per GPU both directions
    p.intra_latency_s = 3e-6;
    p.usd_per_hour = 24.48;
    p.source = "aws.amazon.com/ec2/instance-types/p3 (8x V100 16 GB with NVLink, 64 vCPU, 488 GiB, 25 Gbit/s), "
               "$24.48/h";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "p4d.24xlarge";
    p.vcpus = 96;
    p.gpus = 8;
    p.memory_bytes = 1152 * kGiB;
    p.gpu_memory_bytes = 40 * kGiB;
    p.peak_flops = 19.5e12;  // A100 f32 (156 TFLOP/s TF32, 312 f16/bf16 tensor cores)
    p.efficiency = 0.5;
    p.mem_bytes_per_s = 1555e9;
    p.kernel_overhead_s = 5e-6;
    p.nic_bytes_per_s = 400 * kGbps;  // 4 x 100 Gbit/s EFA
    p.rdma = true;  // EFA (SRD): no TCP stack on the path
    p.nic_latency_s = 15e-6;
    p.intra_bytes_per_s = 300e9;  // NVSwitch: 600 GB/s per GPU both directions
    p.intra_latency_s = 3e-6;
    p.usd_per_hour = 32.77;
    p.os_reserved_bytes = 4 * kGiB;
    p.source = "aws.amazon.com/ec2/instance-types/p4 (8x A100 40 GB, NVSwitch 600 GB/s, 4x100 Gbit/s EFA, 96 vCPU, "
               "1152 GiB), $32.77/h; NVIDIA A100 data sheet (19.5 TFLOP/s f32, 1555 GB/s)";
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "p5.48xlarge";
    p.vcpus = 192;
    p.gpus = 8;
    p.memory_bytes = 2048 * kGiB;
    p.gpu_memory_bytes = 80 * kGiB;
    p.peak_flops = 67e12;  // H100 SXM f32 (495 TFLOP/s TF32 dense, 989 bf16 dense)
    p.efficiency = 0.5;
    p.mem_bytes_per_s = 3350e9;
    p.kernel_overhead_s = 4e-6;
    p.nic_bytes_per_s = 3200 * kGbps;  // 32 x 100 Gbit/s EFA v2
    p.rdma = true;
    p.nic_latency_s = 15e-6;
    p.intra_bytes_per_s = 450e9;  // NVLink 4: 900 GB/s per GPU both directions
    p.intra_latency_s = 2e-6;
    p.usd_per_hour = 98.32;
    p.os_reserved_bytes = 4 * kGiB;
    p.source = "aws.amazon.com/ec2/instance-types/p5 (8x H100 80 GB, NVLink 900 GB/s, 3200 Gbit/s EFA, 192 vCPU, "
               "2 TiB), $98.32/h; NVIDIA H100 SXM data sheet (67 TFLOP/s f32, 3.35 TB/s)";
    v.push_back(p);
  }
  return v;
}
}  // namespace

const char* credit_mode_name(CreditMode m) noexcept {
  switch (m) {
    case CreditMode::kNone: return "none";
    case CreditMode::kStandard: return "standard";
    case CreditMode::kUnlimited: return "unlimited";
  }
  return "?";
}

CreditMode parse_credit_mode(const std::string& s) {
  if (s == "standard") return CreditMode::kStandard;
  if (s == "unlimited") return CreditMode::kUnlimited;
  TANDEM_THROW(Status::kInvalidArgument, "unknown credit mode \"{}\" (standard, unlimited)", s);
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> v = build();
  return v;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  std::vector<std::string> names;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
    names.push_back(p.name);
  }
  TANDEM_THROW(Status::kInvalidArgument, "unknown instance preset \"{}\"{} (known: {})", name, did_you_mean(name, names),
               known);
}

}  // namespace tandem::simulator
