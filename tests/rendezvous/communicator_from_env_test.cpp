// Communicators built by the bootstrap: explicit parameters in threads, the environment under
// `tandem launch`, and CommOptions from TANDEM_* variables. Rank 0's rendezvous server must live as
// long as any communicator (or split of one) that may still use it.
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"
#include "test_util.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using namespace std::chrono_literals;

namespace {

EnvLookup lookup_in(const std::map<std::string, std::string>& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(communicator_from_bootstrap)

BOOST_AUTO_TEST_CASE(explicit_ranks_allreduce_and_splits_outlive_their_parent) {
  const int port = rdv_test::free_port();
  constexpr int kRanks = 3;
  std::vector<double> sums(kRanks, -1), child_sums(kRanks, -1);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r) {
    ts.emplace_back([&, r] {
      try {
        CommOptions o;
        o.transport = "zmq";
        o.timeout = 10000ms;
        auto comm = create_communicator(r, kRanks, "127.0.0.1", port, "explicit-secret", o);
        double v = r + 1;
        comm->allreduce(&v, &v, 1, DType::kF64, ReduceOp::kSum)->wait();
        sums[r] = v;
        // Split, then drop the parent first: on rank 0 the child keeps the rendezvous server alive.
        auto child = comm->split(r == 1 ? 0 : 1, r);
        comm.reset();
        double w = 10;
        child->allreduce(&w, &w, 1, DType::kF64, ReduceOp::kSum)->wait();
        child_sums[r] = w;
        child->barrier()->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < kRanks; ++r) {
    BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
    BOOST_TEST(sums[r] == 6.0);
    BOOST_TEST(child_sums[r] == (r == 1 ? 10.0 : 20.0));
  }
}

BOOST_AUTO_TEST_CASE(launched_ranks_build_communicators_from_the_environment) {
  const auto r = rdv_test::run_process(
      {TANDEM_CLI_PATH, "launch", "-n", "3", "--transport", "zmq", "--timeout-ms", "10000", "--",
       RENDEZVOUS_PROBE_PATH, "allreduce"},
      {}, 30000);
  BOOST_TEST(r.exit_code() == 0, r.err);
  for (int i = 0; i < 3; ++i) {
    const std::string want = "[rank " + std::to_string(i) + "] rank " + std::to_string(i) + " of 3 over zmq: sum 6\n";
    BOOST_TEST(r.out.find(want) != std::string::npos, r.out << r.err);
  }
}

BOOST_AUTO_TEST_CASE(comm_options_come_from_tandem_variables) {
  const std::map<std::string, std::string> env = {
      {"TANDEM_TRANSPORT", "zmq"}, {"TANDEM_TIMEOUT_MS", "4321"}, {"TANDEM_DETERMINISTIC", "1"}};
  CommOptions o = comm_options_from_env(CommOptions{}, lookup_in(env));
  BOOST_TEST(o.transport == "zmq");
  BOOST_TEST(o.timeout.count() == 4321);
  BOOST_TEST(o.deterministic);
  CommOptions chosen;
  chosen.transport = "inproc";  // an explicit choice is not overridden
  BOOST_TEST(comm_options_from_env(chosen, lookup_in(env)).transport == "inproc");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"TANDEM_TIMEOUT_MS", "soon"}, {"TANDEM_TIMEOUT_MS", "-5"}, {"TANDEM_DETERMINISTIC", "yes"}};
  for (const auto& [var, value] : bad) {
    std::string msg;
    try {
      comm_options_from_env(CommOptions{}, lookup_in({{var, value}}));
    } catch (const Error& e) {
      BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(Status::kInvalidArgument));
      msg = e.what();
    }
    BOOST_TEST(msg.find(var) != std::string::npos, var << "=" << value << ": '" << msg << "'");
  }
}

BOOST_AUTO_TEST_SUITE_END()
