#pragma once
// Which x86 vector ISA Tandem's own CPU kernels (engine/compute/cpu/cpu_kernels.cpp, the collectives'
// reductions in engine/comm/reduce_kernels.cpp) run, under the TANDEM_CPU_MAX_ISA cap. Each kernel is
// compiled once per ISA below and one variant is picked from the cap and what the CPU has
// (__builtin_cpu_supports); the CPU backend applies the same cap to oneDNN (cpu_backend.cpp).
#include <optional>
#include <string_view>

// Where kernels are compiled once per ISA (cpu_isa_variants.inc); elsewhere only the baseline exists.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TANDEM_CPU_ISA_VARIANTS 1
#endif

namespace tandem {
namespace settings {
class Settings;
}

// In increasing order: each level includes the ones below it.
enum class CpuIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// "baseline" (x86-64's SSE2; the only level on other architectures), "avx2", "avx512".
std::string_view cpu_isa_name(CpuIsa isa) noexcept;

// The TANDEM_CPU_MAX_ISA value that sets `cap`: "all" (nullopt), "avx512", "avx2", "sse41" (kBaseline).
std::string_view cpu_isa_cap_name(std::optional<CpuIsa> cap) noexcept;

// The best level this CPU runs: kAvx512 with AVX-512F, kAvx2 with AVX2, else kBaseline.
CpuIsa host_cpu_isa() noexcept;

// The cap TANDEM_CPU_MAX_ISA sets in `s`: nullopt for "all" or unset (no cap); "avx512" -> kAvx512,
// "avx2" -> kAvx2, "sse41" -> kBaseline (Tandem's kernels have no SSE4.1 variant; oneDNN is capped at
// SSE4.1). kInvalidArgument naming the setting for any other value.
std::optional<CpuIsa> cpu_isa_cap(const settings::Settings& s);

// min(host_cpu_isa(), cap): the variant the kernels run under that cap.
CpuIsa effective_cpu_isa(std::optional<CpuIsa> cap) noexcept;

// The variant a kernel compiled by cpu_isa_variants.inc runs when asked for `isa`: min(isa, the CPU's), or
// the baseline where no variants are built.
CpuIsa variant_cpu_isa(CpuIsa isa) noexcept;

// effective_cpu_isa() under settings::current()'s cap (the calling context's, else the process's),
// remembered per thread for the last settings snapshot seen.
CpuIsa active_cpu_isa();

}  // namespace tandem
