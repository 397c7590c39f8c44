#pragma once
// Shared by the nn, data, optim and train suites: run f, expect a tandem::Error with `status` whose message contains
// every needle.
#include <boost/test/unit_test.hpp>

#include <initializer_list>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::testing {

template <typename F>
void expect_error(F&& f, Status status, std::initializer_list<std::string> needles) {
  try {
    f();
    BOOST_FAIL("expected an error");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(status), e.what());
    for (const auto& n : needles) {
      BOOST_TEST(std::string(e.what()).find(n) != std::string::npos, "'" << e.what() << "' lacks '" << n << "'");
    }
  }
}

}  // namespace tandem::testing
