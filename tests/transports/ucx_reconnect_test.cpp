// Transport::reconnect on ucx (issue #17; Communicator::shrink calls it over the survivors): among healthy ranks it
// changes nothing, and its errors name the rank. The deaf rank it exists for is made for real, and mended, in
// tests/comm/ucx_shrink_test.cpp (three processes).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "engine/core/error.hpp"
#include "tests/transports/harness.hpp"
#include "transports/memory_store.hpp"

namespace {

using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;
using Clock = std::chrono::steady_clock;

// Runs reconnect and returns its error's status and text (kOk, "" when it returned).
std::pair<Status, std::string> reconnect_outcome(Transport& t, KvStore& store, const std::string& prefix,
                                                 std::vector<int> peers, std::chrono::milliseconds timeout) {
  try {
    t.reconnect(store, prefix, peers, timeout);
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {Status::kOk, ""};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ucx_reconnect)

BOOST_AUTO_TEST_CASE(reconnecting_healthy_ranks_leaves_every_message_arriving_whole) {
  MemoryStore keys;
  run_ranks("ucx", 3, [&](Rank& rk) {
    const auto [status, what] = reconnect_outcome(rk.t, keys, "healthy/", {0, 1, 2}, std::chrono::seconds(10));
    TANDEM_CHECK(status == Status::kOk, Status::kInternal, "reconnect failed: {}", what);
    // A ring, eager (4,000 bytes) and rendezvous (1 MiB) messages, each checked byte for byte.
    const int next = (rk.rank + 1) % rk.size, prev = (rk.rank + rk.size - 1) % rk.size;
    for (const size_t bytes : {size_t{4000}, size_t{1} << 20}) {
      const auto out = payload(rk.rank, next, 1, bytes);
      std::vector<unsigned char> in(bytes);
      const ConstPart o{out.data(), out.size()};
      const MutPart i{in.data(), in.size()};
      auto r = rk.t.irecv(prev, 5, std::span(&i, 1));
      auto s = rk.t.isend(next, 5, std::span(&o, 1));
      wait(rk.t, *r);
      wait(rk.t, *s);
      TANDEM_CHECK(in == payload(prev, rk.rank, 1, bytes), Status::kInternal, "rank {}: {} bytes from rank {} differ",
                   rk.rank, bytes, prev);
    }
  });
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_publishes_is_named_in_a_timeout) {
  MemoryStore keys;
  run_ranks("ucx", 2, [&](Rank& rk) {
    if (rk.rank == 0) {
      const auto t0 = Clock::now();
      const auto [status, what] = reconnect_outcome(rk.t, keys, "silent/", {0, 1}, std::chrono::milliseconds(300));
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      TANDEM_CHECK(status == Status::kTimeout && what.find("rank 1's worker address") != std::string::npos,
                   Status::kInternal, "expected a timeout naming rank 1, got {}: {}", status_name(status), what);
      TANDEM_CHECK(ms < 3000, Status::kInternal, "a 300 ms reconnect gave up after {} ms", ms);
    }
    rk.sync.arrive_and_wait();  // rank 1 stays alive (and silent) until rank 0 has given up
  });
}

BOOST_AUTO_TEST_CASE(a_malformed_address_is_refused_naming_its_rank) {
  MemoryStore keys;
  keys.set("bad/1", "zz-not-hex 12 host");
  run_ranks("ucx", 2, [&](Rank& rk) {
    if (rk.rank == 0) {
      const auto [status, what] = reconnect_outcome(rk.t, keys, "bad/", {0, 1}, std::chrono::seconds(5));
      TANDEM_CHECK(status == Status::kTransport && what.find("malformed worker address for rank 1") != std::string::npos,
                   Status::kInternal, "expected kTransport naming rank 1, got {}: {}", status_name(status), what);
    }
    rk.sync.arrive_and_wait();
  });
}

BOOST_AUTO_TEST_SUITE_END()
