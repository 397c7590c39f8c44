// Communicator::grow and join_communicator (issue #17, elastic growth): ranks started later join a running job
// through its rendezvous -- with its secret, never without -- and the running ranks admit them together.
#include <atomic>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/comm/admission.hpp"
#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"
#include "test_util.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using rdv_test::on_ranks;

BootstrapConfig job_config(int port, const std::string& secret, int job_size, int joiner) {
  BootstrapConfig c;
  c.info.rank = joiner;    // numbers the joiner in logs
  c.info.size = job_size;  // inproc: part of the job's identity
  c.info.host = "localhost";
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.secret = secret;
  return c;
}

double sum_of(Communicator& c, double v) {
  c.allreduce(&v, &v, 1, DType::kF64, ReduceOp::kSum)->wait();
  return v;
}

// Polls pending_joins (collective) until `want` joiners wait; bounded.
void wait_for_joiners(Communicator& c, int64_t want) {
  for (int i = 0; i < 2000; ++i) {
    if (c.pending_joins() >= want) return;
    std::this_thread::sleep_for(5ms);
  }
  TANDEM_THROW(Status::kTimeout, "{} joiner(s) never asked", want);
}

void check(bool ok, const std::string& what) { TANDEM_CHECK(ok, Status::kInternal, "{}", what); }

}  // namespace

BOOST_AUTO_TEST_SUITE(grow)

BOOST_AUTO_TEST_CASE(two_joiners_are_admitted_and_the_grown_world_of_four_allreduces) {
  for (const char* transport : {"inproc", "tcp"}) {
    const int port = rdv_test::free_port();
    CommOptions o;
    o.transport = transport;
    o.timeout = 10000ms;
    std::atomic<int> ready{0};
    const auto errors = on_ranks(4, [&](int i) {
      std::unique_ptr<Communicator> grown;
      if (i < 2) {
        auto c = create_communicator(i, 2, "127.0.0.1", port, "grow-secret", o);
        ++ready;
        check(c->pending_joins() >= 0, "pending_joins");
        wait_for_joiners(*c, 2);
        grown = c->grow({4, 0ms});
        check(grown != nullptr, "nobody admitted");
        check(grown->rank() == i && grown->epoch() == 1 && grown->parent_ranks() == std::vector<int>{0, 1, -1, -1},
              fmt::format("old rank {}: rank {} epoch {}", i, grown->rank(), grown->epoch()));
        check(sum_of(*c, 1) == 2, "the old communicator still works");
      } else {
        for (int k = 0; k < 1000 && ready < 2; ++k) std::this_thread::sleep_for(5ms);
        grown = join_communicator(job_config(port, "grow-secret", 2, i - 2), o, 20000ms);
        check(grown->rank() >= 2 && grown->epoch() == 1, fmt::format("joiner rank {}", grown->rank()));
      }
      check(grown->size() == 4, fmt::format("size {}", grown->size()));
      const double s = sum_of(*grown, grown->rank() + 1);
      check(s == 10, fmt::format("sum {} over the grown world", s));
      grown->barrier()->wait();
    });
    for (int i = 0; i < 4; ++i) BOOST_TEST(errors[i].empty(), transport << " thread " << i << ": " << errors[i]);
  }
}

BOOST_AUTO_TEST_CASE(a_joiner_with_a_wrong_secret_is_refused_and_never_counted) {
  const int port = rdv_test::free_port();
  CommOptions o;
  o.transport = "tcp";
  o.timeout = 5000ms;
  std::atomic<int> phase{0};
  const auto errors = on_ranks(3, [&](int i) {
    if (i < 2) {
      auto c = create_communicator(i, 2, "127.0.0.1", port, "right-secret", o);
      ++phase;
      for (int k = 0; k < 1000 && phase < 3; ++k) std::this_thread::sleep_for(5ms);  // the intruder has tried
      check(c->pending_joins() == 0, "a joiner with the wrong secret was counted");
      check(c->grow({}) == nullptr, "grow admitted someone");
      return;
    }
    for (int k = 0; k < 1000 && phase < 2; ++k) std::this_thread::sleep_for(5ms);
    Status st = Status::kOk;
    std::string msg;
    try {
      join_communicator(job_config(port, "wrong-secret", 2, 0), o, 3000ms);
    } catch (const Error& e) {
      st = e.status();
      msg = e.what();
    }
    phase = 3;
    check(st == Status::kAuth, fmt::format("status {}: {}", status_name(st), msg));
  });
  for (int i = 0; i < 3; ++i) BOOST_TEST(errors[i].empty(), "thread " << i << ": " << errors[i]);
}

BOOST_AUTO_TEST_CASE(a_joiner_beyond_max_ranks_is_refused_with_the_reason) {
  const int port = rdv_test::free_port();
  CommOptions o;
  o.transport = "inproc";
  o.timeout = 10000ms;
  std::atomic<int> ready{0};
  std::atomic<int> admitted{0}, refused{0};
  const auto errors = on_ranks(4, [&](int i) {
    if (i < 2) {
      auto c = create_communicator(i, 2, "127.0.0.1", port, "max-secret", o);
      ++ready;
      wait_for_joiners(*c, 2);
      auto g = c->grow({3, 0ms});
      check(g != nullptr && g->size() == 3, "one joiner admitted");
      check(sum_of(*g, 1) == 3, "three ranks");
      return;
    }
    for (int k = 0; k < 1000 && ready < 2; ++k) std::this_thread::sleep_for(5ms);
    try {
      auto g = join_communicator(job_config(port, "max-secret", 2, i - 2), o, 20000ms);
      ++admitted;
      check(sum_of(*g, 1) == 3, "three ranks");
    } catch (const Error& e) {
      ++refused;
      check(e.status() == Status::kUnsupported && std::string(e.what()).find("--max-ranks is 3") != std::string::npos,
            fmt::format("refusal: {}", e.what()));
    }
  });
  for (int i = 0; i < 4; ++i) BOOST_TEST(errors[i].empty(), "thread " << i << ": " << errors[i]);
  BOOST_TEST(admitted == 1);
  BOOST_TEST(refused == 1);
}

BOOST_AUTO_TEST_CASE(a_joiner_that_dies_while_admitted_costs_one_deadline_and_the_job_goes_on) {
  for (const char* transport : {"inproc", "tcp"}) {
    const int port = rdv_test::free_port();
    CommOptions o;
    o.transport = transport;
    o.timeout = 1500ms;
    std::atomic<int> ready{0};
    const auto errors = on_ranks(3, [&](int i) {
      if (i < 2) {
        auto c = create_communicator(i, 2, "127.0.0.1", port, "die-secret", o);
        ++ready;
        wait_for_joiners(*c, 1);
        const auto t0 = Clock::now();
        check(c->grow({}) == nullptr, "the dead joiner was admitted");
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        check(ms < 6000, fmt::format("grow took {} ms", ms));
        check(sum_of(*c, 1) == 2, "the job goes on at 2 ranks");
        return;
      }
      for (int k = 0; k < 1000 && ready < 2; ++k) std::this_thread::sleep_for(5ms);
      // Asks, is admitted, and "dies" before connecting to the grown world.
      Rendezvous r = join_rendezvous(job_config(port, "die-secret", 2, 0), transport, 5000ms);
      const JoinAnswer a = request_admission(*r.store, "ghost@host", 20000ms);
      check(a.rank == 2 && a.size == 3, "answer");
    });
    for (int i = 0; i < 3; ++i) BOOST_TEST(errors[i].empty(), transport << " thread " << i << ": " << errors[i]);
  }
}

BOOST_AUTO_TEST_SUITE_END()
