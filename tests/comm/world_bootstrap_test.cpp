// Communicator::create's steps: a key namespace per world communicator and store, the exchange of
// hosts and the settings every rank must agree on, and the topology the hosts give.
#include <boost/test/unit_test.hpp>

#include <thread>

#include "engine/comm/world_bootstrap.hpp"
#include "tests/comm/comm_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace tandem::engine::comm;

BOOST_AUTO_TEST_SUITE(world_bootstrap)

BOOST_AUTO_TEST_CASE(each_creation_on_a_store_gets_the_next_prefix_per_rank) {
  auto a = std::make_shared<transports::MemoryStore>();
  auto b = std::make_shared<transports::MemoryStore>();
  BOOST_TEST(world_key_prefix(a, 0) == "tandem/comm0/");
  BOOST_TEST(world_key_prefix(a, 0) == "tandem/comm1/");
  BOOST_TEST(world_key_prefix(a, 1) == "tandem/comm0/");  // counted per rank
  BOOST_TEST(world_key_prefix(b, 0) == "tandem/comm0/");  // and per store
  BOOST_TEST(world_key_prefix(a, 1) == "tandem/comm1/");
}

BOOST_AUTO_TEST_CASE(settings_text_names_what_ranks_must_agree_on) {
  CommOptions o;
  BOOST_TEST(agreed_settings(o) == "algo=auto det=0 chunk=0");
  o.allreduce_algorithm = Algorithm::kRing;
  o.deterministic = true;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::milliseconds(5);  // not agreed on
  BOOST_TEST(agreed_settings(o) == "algo=ring det=1 chunk=4096");
}

BOOST_AUTO_TEST_CASE(hosts_are_exchanged_and_mismatched_settings_refused) {
  auto run = [](const std::vector<std::string>& settings, std::vector<std::vector<std::string>>& hosts,
                std::vector<std::string>& errors) {
    auto store = std::make_shared<transports::MemoryStore>();
    const int n = static_cast<int>(settings.size());
    hosts.assign(n, {});
    errors.assign(n, "");
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          hosts[r] = exchange_hosts(*store, "p/", r, n, "h" + std::to_string(r % 2), settings[r],
                                    std::chrono::milliseconds(5000));
        } catch (const Error& e) {
          errors[r] = fmt::format("{}|{}", status_name(e.status()), e.what());
        }
      });
    for (auto& t : threads) t.join();
  };
  std::vector<std::vector<std::string>> hosts;
  std::vector<std::string> errors;
  run({"algo=auto", "algo=auto", "algo=auto"}, hosts, errors);
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST(errors[r].empty(), errors[r]);
    BOOST_TEST((hosts[r] == std::vector<std::string>{"h0", "h1", "h0"}));
  }
  run({"algo=auto", "algo=ring"}, hosts, errors);
  BOOST_TEST(errors[0].find("mismatch") != std::string::npos, errors[0]);
  BOOST_TEST(errors[0].find("rank 0 was created with algo=auto but rank 1 with algo=ring") != std::string::npos,
             errors[0]);
  BOOST_TEST(errors[1].find("rank 1 was created with algo=ring but rank 0 with algo=auto") != std::string::npos,
             errors[1]);
}

// A rank that never joins (stalled or dead before it posted its host; the chaos benchmark stalls one there) is named
// in the error of every rank that waited for it, not only through its store key.
BOOST_AUTO_TEST_CASE(a_rank_that_never_joins_is_named_when_the_exchange_times_out) {
  auto store = std::make_shared<transports::MemoryStore>();
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // ranks 0 and 1 of 3; rank 2 never comes
    threads.emplace_back([&, r] {
      try {
        exchange_hosts(*store, "p/", r, 3, "h", "s", std::chrono::milliseconds(100));
      } catch (const Error& e) {
        errors[r] = fmt::format("{}|{}", status_name(e.status()), e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(errors[r].find(status_name(Status::kTimeout)) == 0, errors[r]);
    BOOST_TEST(errors[r].find(fmt::format("rank 2 did not join within 100 ms (rank {} waited for it", r)) !=
                   std::string::npos,
               errors[r]);
    BOOST_TEST(errors[r].find("p/host/2") != std::string::npos, errors[r]);
  }
}

BOOST_AUTO_TEST_CASE(topology_numbers_hosts_by_first_appearance) {
  BOOST_TEST((topology_of({"b", "a", "b", "c", "a"}).host_of == std::vector<int32_t>{0, 1, 0, 2, 1}));
  BOOST_TEST(topology_of({}).host_of.empty());
}

BOOST_AUTO_TEST_SUITE_END()
