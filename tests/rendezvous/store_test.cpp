// The rendezvous store's behaviour for peers that hold the secret: set/get/add/erase/barrier
// across threads and processes, deadlines, limits and shutdown.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/comm/rendezvous_client.hpp"
#include "engine/comm/rendezvous_server.hpp"
#include "engine/core/error.hpp"
#include "test_util.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using namespace std::chrono_literals;
using rdv_test::Clock;
using rdv_test::ms_since;

namespace {

constexpr const char* kSecret = "test-secret-0123456789";

RendezvousServerOptions server_options(int world_size = 0) {
  RendezvousServerOptions o;
  o.secret = kSecret;
  o.world_size = world_size;
  return o;
}

RendezvousClientOptions client_options(const RendezvousServer& s, int rank = 0, int size = 0) {
  RendezvousClientOptions o;
  o.port = s.port();
  o.secret = kSecret;
  o.rank = rank;
  o.size = size;
  o.timeout = 5000ms;
  return o;
}

template <typename F>
Status status_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return Status::kOk;
}

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(rendezvous_store)

BOOST_AUTO_TEST_CASE(set_then_get_returns_the_exact_bytes) {
  RendezvousServer server(server_options());
  BOOST_TEST(server.port() > 0);
  RendezvousClient c(client_options(server));
  const std::string binary("a\0b\xff\x01z", 6);
  c.set("bin", binary);
  c.set("empty", "");
  BOOST_TEST(c.get("bin", 1000ms) == binary);
  BOOST_TEST(c.get("empty", 1000ms).empty());
  c.set("bin", "overwritten");
  BOOST_TEST(c.get("bin", 1000ms) == "overwritten");
  BOOST_TEST(server.stats().keys == 2u);
}

BOOST_AUTO_TEST_CASE(get_waits_until_another_client_sets_the_key) {
  RendezvousServer server(server_options());
  RendezvousClient reader(client_options(server, 0));
  RendezvousClient writer(client_options(server, 1));
  const auto start = Clock::now();
  std::thread t([&] {
    std::this_thread::sleep_for(150ms);
    writer.set("late", "value");
  });
  const std::string v = reader.get("late", 5000ms);
  t.join();
  BOOST_TEST(v == "value");
  BOOST_TEST(ms_since(start) >= 140);
  BOOST_TEST(ms_since(start) < 2000);
}

BOOST_AUTO_TEST_CASE(signals_delivered_while_waiting_are_neither_errors_nor_fatal_to_the_server) {
  // A process's threads receive signals (SIGCHLD in a launcher, a profiler's SIGPROF): zmq_poll then fails with EINTR
  // whatever SA_RESTART says. That must not fail a client's wait, nor stop the server's thread.
  struct sigaction quiet {}, old{};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  BOOST_REQUIRE(sigaction(SIGUSR1, &quiet, &old) == 0);
  RendezvousServer server(server_options());
  RendezvousClient reader(client_options(server, 0));
  RendezvousClient writer(client_options(server, 1));
  const pthread_t waiting = pthread_self();
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread pelter([&] {  // both at the waiting thread and at the process (any thread: the server's too)
    for (int i = 0; !done.load() && i < 5000; ++i, sent.fetch_add(2)) {
      pthread_kill(waiting, SIGUSR1);
      kill(getpid(), SIGUSR1);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    writer.set("late", "value");
  });
  std::string v;
  const Status st = status_of([&] { v = reader.get("late", 5000ms); });
  late.join();
  const Status after = status_of([&] { BOOST_TEST(reader.add("counter", 2) == 2); });
  done.store(true);
  pelter.join();
  sigaction(SIGUSR1, &old, nullptr);
  BOOST_TEST(sent.load() > 20);
  BOOST_TEST((st == Status::kOk));
  BOOST_TEST(v == "value");
  BOOST_TEST((after == Status::kOk));
}

BOOST_AUTO_TEST_CASE(get_timeout_throws_ktimeout_naming_the_key) {
  RendezvousServer server(server_options());
  RendezvousClient c(client_options(server));
  const auto start = Clock::now();
  std::string msg;
  Status st = Status::kOk;
  try {
    c.get("job/missing-key", 300ms);
  } catch (const Error& e) {
    st = e.status();
    msg = e.what();
  }
  const auto took = ms_since(start);
  BOOST_TEST(static_cast<int>(st) == static_cast<int>(Status::kTimeout));
  BOOST_TEST(msg.find("job/missing-key") != std::string::npos, msg);
  BOOST_TEST(took >= 290);
  BOOST_TEST(took < 2000);
  // The timed-out wait leaves nothing behind: a later set/get on the same key works.
  c.set("job/missing-key", "now");
  BOOST_TEST(c.get("job/missing-key", 0ms) == "now");
}

BOOST_AUTO_TEST_CASE(ranks_as_threads_exchange_values) {
  RendezvousServer server(server_options(8));
  constexpr int kRanks = 8;
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r) {
    ts.emplace_back([&, r] {
      RendezvousClient c(client_options(server, r, kRanks));
      c.set("addr/" + std::to_string(r), "rank-" + std::to_string(r) + "-address");
      int ok = 0;
      for (int p = 0; p < kRanks; ++p) {
        ok += c.get("addr/" + std::to_string(p), 5000ms) == "rank-" + std::to_string(p) + "-address";
      }
      if (ok == kRanks) ++good;
    });
  }
  for (auto& t : ts) t.join();
  BOOST_TEST(good.load() == kRanks);
  BOOST_TEST(server.stats().authenticated == static_cast<uint64_t>(kRanks));
}

BOOST_AUTO_TEST_CASE(one_client_shared_by_threads_multiplexes_waits) {
  // Thread A blocks in get() on a key that thread B sets through the same client: B's request must
  // go out while A is waiting.
  RendezvousServer server(server_options());
  RendezvousClient c(client_options(server));
  std::string got;
  std::thread a([&] { got = c.get("shared/k", 5000ms); });
  std::this_thread::sleep_for(50ms);
  const auto start = Clock::now();
  c.set("shared/k", "v");
  a.join();
  BOOST_TEST(got == "v");
  BOOST_TEST(ms_since(start) < 1000);
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&] {
      for (int i = 0; i < 50; ++i) c.add("shared/counter", 1);
    });
  }
  for (auto& t : adders) t.join();
  BOOST_TEST(c.add("shared/counter", 0) == 200);
}

BOOST_AUTO_TEST_CASE(ranks_as_processes_exchange_values) {
  // Ranks 1..3 are separate processes (fork + exec of the probe program, so each starts clean);
  // this process is rank 0 and owns the server.
  RendezvousServer server(server_options(4));
  constexpr int kRanks = 4;
  std::vector<pid_t> pids;
  for (int r = 1; r < kRanks; ++r) {
    const std::vector<std::string> env_strings = {
        "TANDEM_RANK=" + std::to_string(r), "TANDEM_WORLD_SIZE=" + std::to_string(kRanks),
        "TANDEM_MASTER_ADDR=127.0.0.1", "TANDEM_MASTER_PORT=" + std::to_string(server.port()),
        std::string("TANDEM_SECRET=") + kSecret, "TANDEM_LOG_LEVEL=error"};
    std::vector<char*> env;
    for (const auto& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
    env.push_back(nullptr);
    char* argv[] = {const_cast<char*>(RENDEZVOUS_PROBE_PATH), const_cast<char*>("exchange"), nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int null_fd = ::open("/dev/null", O_WRONLY);
      ::dup2(null_fd, 1);
      ::execve(argv[0], argv, env.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  RendezvousClient parent(client_options(server, 0, kRanks));
  parent.set("probe/0", "0");
  parent.barrier("probe/done", kRanks, 10000ms);  // passes only once every process arrived
  const auto start = Clock::now();
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (ms_since(start) > 15000) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      ::usleep(5000);
    }
    BOOST_TEST(WIFEXITED(status));
    BOOST_TEST(WEXITSTATUS(status) == 0);  // the probe checks every value it read
  }
  for (int r = 1; r < kRanks; ++r) BOOST_TEST(parent.get("probe/" + std::to_string(r), 0ms) == std::to_string(r));
}

BOOST_AUTO_TEST_CASE(add_counts_and_erase_removes) {
  RendezvousServer server(server_options());
  RendezvousClient c(client_options(server));
  BOOST_TEST(c.add("n", 5) == 5);
  BOOST_TEST(c.add("n", -7) == -2);
  BOOST_TEST(c.get("n", 0ms) == "-2");
  c.set("text", "not a number");
  BOOST_TEST(static_cast<int>(status_of([&] { c.add("text", 1); })) == static_cast<int>(Status::kInvalidArgument));
  BOOST_TEST(c.erase("n"));
  BOOST_TEST(!c.erase("n"));
  BOOST_TEST(static_cast<int>(status_of([&] { c.get("n", 0ms); })) == static_cast<int>(Status::kTimeout));
}

BOOST_AUTO_TEST_CASE(barrier_releases_all_or_says_how_many_arrived) {
  RendezvousServer server(server_options());
  std::atomic<int> passed{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      RendezvousClient c(client_options(server, r));
      c.barrier("b1", 3, 5000ms);
      ++passed;
    });
  }
  for (auto& t : ts) t.join();
  BOOST_TEST(passed.load() == 3);

  RendezvousClient a(client_options(server, 0));
  RendezvousClient b(client_options(server, 1));
  std::string msg_a;
  std::thread ta([&] { msg_a = message_of([&] { a.barrier("b2", 3, 300ms); }); });
  const std::string msg_b = message_of([&] { b.barrier("b2", 3, 300ms); });
  ta.join();
  BOOST_TEST(msg_b.find("only 2 of 3") != std::string::npos, msg_b);
  BOOST_TEST(msg_a.find("b2") != std::string::npos, msg_a);
}

BOOST_AUTO_TEST_CASE(limits_are_checked_before_sending) {
  RendezvousServer server(server_options());
  RendezvousClient c(client_options(server));
  BOOST_TEST(static_cast<int>(status_of([&] { c.set("big", std::string((16 << 20) + 1, 'x')); })) ==
             static_cast<int>(Status::kInvalidArgument));
  BOOST_TEST(static_cast<int>(status_of([&] { c.set(std::string(5000, 'k'), "v"); })) ==
             static_cast<int>(Status::kInvalidArgument));
  // The largest allowed value goes through intact.
  const std::string max_value(16 << 20, 'm');
  c.set("max", max_value);
  BOOST_TEST(c.get("max", 2000ms).size() == max_value.size());
}

BOOST_AUTO_TEST_CASE(world_size_and_rank_are_checked_at_join) {
  RendezvousServer server(server_options(2));
  BOOST_TEST(static_cast<int>(status_of([&] { RendezvousClient c(client_options(server, 1, 3)); })) ==
             static_cast<int>(Status::kMismatch));
  const std::string msg = message_of([&] { RendezvousClient c(client_options(server, 5, 2)); });
  BOOST_TEST(msg.find("rank 5") != std::string::npos, msg);
  RendezvousClient ok(client_options(server, 1, 2));
  ok.set("fine", "1");
}

BOOST_AUTO_TEST_CASE(port_in_use_is_a_transport_error_naming_the_port) {
  RendezvousServer first(server_options());
  auto o = server_options();
  o.port = first.port();
  const std::string msg = message_of([&] { RendezvousServer second(o); });
  BOOST_TEST(msg.find(std::to_string(first.port())) != std::string::npos, msg);
  BOOST_TEST(static_cast<int>(status_of([&] { RendezvousServer second(o); })) ==
             static_cast<int>(Status::kTransport));
}

BOOST_AUTO_TEST_CASE(stopping_server_serves_joined_clients_until_they_close) {
  // Rank 0 finishes first: its server must still answer a rank that asks a moment later, and stop
  // as soon as that rank has closed its client (not after the whole grace period).
  auto server = std::make_unique<RendezvousServer>(server_options());
  auto owner = std::make_unique<RendezvousClient>(client_options(*server, 0));
  std::string got;
  auto late = std::make_unique<RendezvousClient>(client_options(*server, 1));
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    got = late->get("done", 2000ms);
    late.reset();  // says goodbye
  });
  owner->set("done", "yes");
  owner.reset();
  const auto start = Clock::now();
  server.reset();
  const auto took = ms_since(start);
  t.join();
  BOOST_TEST(got == "yes");
  BOOST_TEST(took >= 150);
  BOOST_TEST(took < 2500);  // well before the 3000 ms grace
}

BOOST_AUTO_TEST_CASE(server_shutdown_fails_waiters_fast_and_later_calls_by_deadline) {
  auto so = server_options();
  so.shutdown_grace = 300ms;  // the waiting client never closes: the grace bounds the wait
  auto server = std::make_unique<RendezvousServer>(so);
  auto o = client_options(*server);
  o.timeout = 400ms;
  RendezvousClient c(o);
  Status waiter_status = Status::kOk;
  std::string waiter_msg;
  std::thread t([&] {
    try {
      c.get("never", 10000ms);
    } catch (const Error& e) {
      waiter_status = e.status();
      waiter_msg = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  server.reset();
  t.join();
  BOOST_TEST(static_cast<int>(waiter_status) == static_cast<int>(Status::kPeerFailure), waiter_msg);
  BOOST_TEST(ms_since(start) < 2000);
  const auto start2 = Clock::now();
  BOOST_TEST(static_cast<int>(status_of([&] { c.set("after", "x"); })) == static_cast<int>(Status::kTimeout));
  BOOST_TEST(ms_since(start2) < 2000);
}

// A write a rank makes on its way out (Communicator::leave) keeps its own deadline, though the client's is long: with
// the server gone it fails with kTimeout naming the key, not after the client's 20 s (the bound below only tells the
// two apart).
BOOST_AUTO_TEST_CASE(set_within_keeps_its_own_deadline_when_the_server_is_gone) {
  auto so = server_options();
  so.shutdown_grace = 300ms;
  auto server = std::make_unique<RendezvousServer>(so);
  auto o = client_options(*server);
  o.timeout = 20000ms;
  RendezvousClient c(o);
  c.set_within("before", "x", 2000ms);
  BOOST_TEST(c.get("before", 2000ms) == "x");
  server.reset();
  const auto start = Clock::now();
  Status status = Status::kOk;
  std::string msg;
  try {
    c.set_within("after", "x", 300ms);
  } catch (const Error& e) {
    status = e.status();
    msg = e.what();
  }
  BOOST_TEST(static_cast<int>(status) == static_cast<int>(Status::kTimeout), msg);
  BOOST_TEST(msg.find("set 'after'") != std::string::npos, msg);
  BOOST_TEST(ms_since(start) < 10000);
}

BOOST_AUTO_TEST_CASE(unreachable_server_times_out_naming_the_address) {
  RendezvousClientOptions o;
  o.port = rdv_test::free_port();
  o.secret = kSecret;
  o.timeout = 300ms;
  const auto start = Clock::now();
  const std::string msg = message_of([&] { RendezvousClient c(o); });
  BOOST_TEST(msg.find("127.0.0.1:" + std::to_string(o.port)) != std::string::npos, msg);
  BOOST_TEST(ms_since(start) < 2000);
}

BOOST_AUTO_TEST_SUITE_END()
