// tandem_context_cpu_isa: the vector ISAs in effect under a context's TANDEM_CPU_MAX_ISA.
#include "api/src/guard.hpp"
#include "api/src/handles.hpp"
#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/core/cpu_isa.hpp"
#include "engine/core/settings.hpp"

extern "C" {

TANDEM_API tandem_status_t tandem_context_cpu_isa(tandem_context_t* ctx, const char** host, const char** cap,
                                                  const char** kernels, const char** onednn) TANDEM_NOEXCEPT {
  return tandem::api::guarded([&] {
    TANDEM_REQUIRE(ctx != nullptr, "tandem_context_cpu_isa: ctx must be non-null");
    const tandem::api::ContextScope scope(ctx->env);
    const std::optional<tandem::CpuIsa> c = tandem::cpu_isa_cap(*tandem::settings::current());
    // The same step a CPU model's creation takes: oneDNN is capped (or found already beyond the cap) first.
    const tandem::CpuIsa k = tandem::engine::compute::cpu::apply_cpu_isa_cap();
    const char* d = tandem::engine::compute::cpu::onednn_isa_name();
    // Names of static storage (string_view literals, NUL-terminated).
    if (host != nullptr) *host = tandem::cpu_isa_name(tandem::host_cpu_isa()).data();
    if (cap != nullptr) *cap = tandem::cpu_isa_cap_name(c).data();
    if (kernels != nullptr) *kernels = tandem::cpu_isa_name(k).data();
    if (onednn != nullptr) *onednn = d;
  });
}

}  // extern "C"
