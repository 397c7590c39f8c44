#pragma once
// The simulator tests' check that a call throws a tandem::Error whose message mentions `needle`.
#include <functional>
#include <string>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"

namespace tandem::simulator::testing {

inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    BOOST_ERROR("no error; expected one mentioning \"" << needle << "\"");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, e.what() << " lacks " << needle);
  }
}

}  // namespace tandem::simulator::testing
