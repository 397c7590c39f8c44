// comm_options_from_env: the one reader of the communicator's TANDEM_* variables.
#include <boost/test/unit_test.hpp>

#include <map>

#include "engine/comm/comm_options_env.hpp"
#include "tests/comm/comm_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using engine::comm::comm_options_from_env;
using engine::comm::EnvLookup;

namespace {

EnvLookup lookup_in(std::map<std::string, std::string> env) {
  return [env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(comm_options_env)

BOOST_AUTO_TEST_CASE(every_variable_fills_a_default) {
  const auto o = comm_options_from_env(CommOptions{}, lookup_in({{"TANDEM_TRANSPORT", "zmq"},
                                                                 {"TANDEM_TIMEOUT_MS", "1500"},
                                                                 {"TANDEM_ALLREDUCE_ALGO", "hd"},
                                                                 {"TANDEM_DETERMINISTIC", "true"},
                                                                 {"TANDEM_CHUNK_BYTES", "65536"}}));
  BOOST_TEST(o.transport == "zmq");
  BOOST_TEST(o.timeout.count() == 1500);
  BOOST_TEST((o.allreduce_algorithm == engine::comm::Algorithm::kHalvingDoubling));
  BOOST_TEST(o.deterministic);
  BOOST_TEST(o.chunk_bytes == 65536u);
}

BOOST_AUTO_TEST_CASE(explicit_choices_and_empty_values_are_kept) {
  CommOptions set;
  set.transport = "inproc";
  set.timeout = std::chrono::milliseconds(77);
  set.chunk_bytes = 1024;
  const auto env = lookup_in({{"TANDEM_TRANSPORT", "zmq"}, {"TANDEM_TIMEOUT_MS", "1500"}, {"TANDEM_CHUNK_BYTES", "9"}});
  const auto o = comm_options_from_env(set, env);
  BOOST_TEST(o.transport == "inproc");
  BOOST_TEST(o.timeout.count() == 77);
  BOOST_TEST(o.chunk_bytes == 1024u);
  // An empty value counts as unset; "0" turns nothing off that was asked for.
  const auto e = comm_options_from_env(CommOptions{}, lookup_in({{"TANDEM_TRANSPORT", ""}, {"TANDEM_DETERMINISTIC", "0"}}));
  BOOST_TEST(e.transport == "auto");
  BOOST_TEST(!e.deterministic);
  CommOptions det;
  det.deterministic = true;
  BOOST_TEST(comm_options_from_env(det, lookup_in({{"TANDEM_DETERMINISTIC", "0"}})).deterministic);
}

BOOST_AUTO_TEST_CASE(malformed_values_name_the_variable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"TANDEM_TIMEOUT_MS", "0"},   {"TANDEM_TIMEOUT_MS", "12ms"},  {"TANDEM_CHUNK_BYTES", "-1"},
      {"TANDEM_DETERMINISTIC", "2"}, {"TANDEM_ALLREDUCE_ALGO", "fastest"}};
  for (const auto& entry : bad) {
    const std::string& var = entry.first;  // not a structured binding: clang 14 cannot capture those in a lambda
    const std::string& value = entry.second;
    std::string msg;
    const Status st = status_of([&] { comm_options_from_env(CommOptions{}, lookup_in({{var, value}})); }, &msg);
    BOOST_TEST((st == Status::kInvalidArgument), var << "=" << value << ": " << status_name(st));
    if (var != "TANDEM_ALLREDUCE_ALGO") BOOST_TEST(msg.find(var) != std::string::npos, var << ": '" << msg << "'");
  }
}

BOOST_AUTO_TEST_SUITE_END()
