#pragma once
// oneDNN calls that turn dnnl::error into tandem::Error (kBackend) naming what was attempted.
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/core/error.hpp"

namespace tandem::engine::compute::cpu {

template <typename F> auto dnnl_try(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    TANDEM_THROW(Status::kBackend, "oneDNN failed in {}: {} (status {})", what, e.what(), static_cast<int>(e.status));
  }
}

inline void exec(const dnnl::primitive& p, dnnl::stream& s, const std::unordered_map<int, dnnl::memory>& args,
                 const char* what) {
  dnnl_try(what, [&] {
    p.execute(s, args);
    s.wait();
  });
}

}  // namespace tandem::engine::compute::cpu
