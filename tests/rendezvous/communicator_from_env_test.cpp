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

using rdv_test::on_ranks;

// A listening TCP socket on 127.0.0.1:port, held by the test (as another job would hold the port); -1 if taken.
int hold_port(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(communicator_from_bootstrap)

// Issue #17: the communicators a job creates one after another on one rendezvous port never mix. Rank 0 destroys
// each one last (late), so the others already ask for the next one while rank 0's previous server still runs;
// they used to join that server (mismatch errors, or ranks that could not reach rank 0 until their deadline).
BOOST_AUTO_TEST_CASE(communicators_created_again_and_again_on_one_port_never_mix) {
  const int port = rdv_test::free_port();
  constexpr int kRanks = 3, kRounds = 4;
  for (const char* transport : {"tcp", "zmq"}) {
    const auto errors = on_ranks(kRanks, [&](int r) {
      CommOptions o;
      o.transport = transport;
      o.timeout = 10000ms;
      for (int round = 0; round < kRounds; ++round) {
        auto comm = create_communicator(r, kRanks, "127.0.0.1", port, "again-secret", o);
        double v = r + 1 + 10.0 * round;
        comm->allreduce(&v, &v, 1, DType::kF64, ReduceOp::kSum)->wait();
        TANDEM_CHECK(v == 6 + 30.0 * round, Status::kInternal, "round {}: sum {}", round, v);
        comm->barrier()->wait();
        if (r == 0) std::this_thread::sleep_for(100ms);
      }
    });
    for (int r = 0; r < kRanks; ++r) BOOST_TEST(errors[r].empty(), transport << " rank " << r << ": " << errors[r]);
  }
}

// Issue #17: a second communicator created while the first lives shares rank 0's rendezvous server (rank 0 failed
// with "Address already in use" while the others hung until their deadline); both then work side by side.
BOOST_AUTO_TEST_CASE(a_second_communicator_on_the_same_port_while_the_first_lives_works) {
  const int port = rdv_test::free_port();
  constexpr int kRanks = 3;
  const auto t0 = rdv_test::Clock::now();
  const auto errors = on_ranks(kRanks, [&](int r) {
    CommOptions o;
    o.transport = "tcp";
    o.timeout = 10000ms;
    auto first = create_communicator(r, kRanks, "127.0.0.1", port, "twice-secret", o);
    auto second = create_communicator(r, kRanks, "127.0.0.1", port, "twice-secret", o);
    double a = r + 1, b = 10.0 * (r + 1);
    second->allreduce(&b, &b, 1, DType::kF64, ReduceOp::kSum)->wait();
    first->allreduce(&a, &a, 1, DType::kF64, ReduceOp::kSum)->wait();
    TANDEM_CHECK(a == 6 && b == 60, Status::kInternal, "sums {} and {}", a, b);
    first->barrier()->wait();
    first.reset();
    second->barrier()->wait();
  });
  for (int r = 0; r < kRanks; ++r) BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
  BOOST_TEST(rdv_test::ms_since(t0) < 8000);
}

// Issue #17: ranks that are threads of one process (the inproc transport) meet in memory: no rendezvous port is
// opened, so a port held by someone else -- another such process with the same defaults -- does not matter
// (rank 0 failed with "Address already in use" and the others waited for their deadline).
BOOST_AUTO_TEST_CASE(inproc_ranks_open_no_rendezvous_port) {
  const int port = rdv_test::free_port();
  const int held = hold_port(port);
  BOOST_REQUIRE(held >= 0);
  constexpr int kRanks = 3;
  for (int job = 0; job < 2; ++job) {  // twice: the second job's ranks must not meet the first's
    const auto errors = on_ranks(kRanks, [&](int r) {
      CommOptions o;
      o.transport = "inproc";
      o.timeout = 5000ms;
      auto comm = create_communicator(r, kRanks, "127.0.0.1", port, "inproc-secret", o);
      TANDEM_CHECK(std::string(comm->transport_name()) == "inproc", Status::kInternal, "{}", comm->transport_name());
      double v = r + 1;
      comm->allreduce(&v, &v, 1, DType::kF64, ReduceOp::kSum)->wait();
      TANDEM_CHECK(v == 6, Status::kInternal, "sum {}", v);
    });
    for (int r = 0; r < kRanks; ++r) BOOST_TEST(errors[r].empty(), "job " << job << " rank " << r << ": " << errors[r]);
  }
  ::close(held);
}

// Issue #17 (header vs library): an unknown transport is TANDEM_ERR_UNSUPPORTED, on every rank at once, before any
// rank waits for another (it was INVALID_ARGUMENT on rank 0 after the rendezvous).
BOOST_AUTO_TEST_CASE(an_unknown_transport_is_unsupported_on_every_rank_at_once) {
  const int port = rdv_test::free_port();
  const auto t0 = rdv_test::Clock::now();
  std::vector<Status> status(2, Status::kOk);
  const auto errors = on_ranks(2, [&](int r) {
    CommOptions o;
    o.transport = "carrier-pigeon";
    o.timeout = 10000ms;
    try {
      create_communicator(r, 2, "127.0.0.1", port, "pigeon-secret", o);
    } catch (const Error& e) {
      status[r] = e.status();
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST((status[r] == Status::kUnsupported), "rank " << r << ": " << errors[r]);
    BOOST_TEST(errors[r].find("unknown transport 'carrier-pigeon'") != std::string::npos, errors[r]);
  }
  BOOST_TEST(rdv_test::ms_since(t0) < 2000);
}

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
