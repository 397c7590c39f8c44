// The CUDA backend against the reference backend (tests/compute/conformance.hpp), labelled gpu.
// Without a usable GPU every case is skipped by its precondition, which logs why, and the
// executable exits with 77 so that CTest reports "Skipped" rather than "Passed".
#define BOOST_TEST_MODULE tandem_compute_gpu
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cstdio>

#include "tests/compute/gpu/gpu_available.hpp"

int main(int argc, char* argv[]) {
  const int rc = boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
  const auto& probe = tandem::engine::compute::testing::cuda_probe();
  if (rc == 0 && !probe.available) {
    std::fprintf(stderr, "\n*** test_compute_gpu SKIPPED: no usable CUDA device here: %s\n", probe.reason.c_str());
    return 77;
  }
  return rc;
}
