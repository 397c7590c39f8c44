// The oneDNN CPU backend (work in progress: see issue #3).
#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions&) {
  TANDEM_THROW(Status::kUnsupported, "compute backend 'cpu' (oneDNN) is not implemented yet; use 'reference'");
}

}  // namespace tandem::engine::compute
