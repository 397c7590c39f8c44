#pragma once
// Whether make_backend("cuda") works here, and why not; used as a test-case precondition.
#include <boost/test/unit_test.hpp>

#include <string>

#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute::testing {

struct CudaProbe {
  bool available = false;
  std::string reason;
};

inline const CudaProbe& cuda_probe() {
  static const CudaProbe probe = [] {
    CudaProbe p;
    try {
      make_backend("cuda");
      p.available = true;
    } catch (const Error& e) {
      p.reason = e.what();
    }
    return p;
  }();
  return probe;
}

struct CudaAvailable {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(cuda_probe().available);
    if (!r) r.message() << "SKIPPED, no usable CUDA device: " << cuda_probe().reason;
    return r;
  }
};

}  // namespace tandem::engine::compute::testing
