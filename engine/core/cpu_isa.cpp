#include "engine/core/cpu_isa.hpp"

#include <algorithm>
#include <memory>

#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem {

std::string_view cpu_isa_name(CpuIsa isa) noexcept {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kBaseline: break;
  }
  return "baseline";
}

std::string_view cpu_isa_cap_name(std::optional<CpuIsa> cap) noexcept {
  if (!cap) return "all";
  return *cap == CpuIsa::kBaseline ? "sse41" : cpu_isa_name(*cap);
}

CpuIsa host_cpu_isa() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const CpuIsa host = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return CpuIsa::kAvx512;
    if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
    return CpuIsa::kBaseline;
  }();
  return host;
#else
  return CpuIsa::kBaseline;
#endif
}

std::optional<CpuIsa> cpu_isa_cap(const settings::Settings& s) {
  const std::optional<std::string> v = s.text("TANDEM_CPU_MAX_ISA");  // checked against the registry's choices
  if (!v || *v == "all") return std::nullopt;
  if (*v == "avx512") return CpuIsa::kAvx512;
  if (*v == "avx2") return CpuIsa::kAvx2;
  TANDEM_REQUIRE(*v == "sse41", "TANDEM_CPU_MAX_ISA='{}' must be one of all|avx512|avx2|sse41", *v);
  return CpuIsa::kBaseline;
}

CpuIsa effective_cpu_isa(std::optional<CpuIsa> cap) noexcept {
  const CpuIsa host = host_cpu_isa();
  return cap ? std::min(host, *cap) : host;
}

CpuIsa variant_cpu_isa(CpuIsa isa) noexcept {
#if defined(TANDEM_CPU_ISA_VARIANTS)
  return std::min(isa, host_cpu_isa());
#else
  (void)isa;
  return CpuIsa::kBaseline;
#endif
}

CpuIsa active_cpu_isa() {
  // The snapshot is kept alive by the cache, so a new one never reuses a remembered address.
  thread_local std::shared_ptr<const settings::Settings> seen;
  thread_local CpuIsa isa = CpuIsa::kBaseline;
  std::shared_ptr<const settings::Settings> now = settings::current();
  if (now != seen) {
    isa = effective_cpu_isa(cpu_isa_cap(*now));
    seen = std::move(now);
  }
  return isa;
}

}  // namespace tandem
