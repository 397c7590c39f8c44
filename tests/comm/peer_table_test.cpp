// PeerTable: the failure bookkeeping (blame, origin, first failure wins), the timeout verdict, and
// the control channel between two ranks (aborts relayed with their origin, timeout notices).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/comm/peer_table.hpp"
#include "tests/comm/transport_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using engine::comm::PeerTable;
using engine::comm::SharedTransport;

namespace {

// Polls until the peer's control message arrives; returns the error an abort throws (kOk: none in time).
Status poll_until_error(PeerTable& t, std::string* msg) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    const Status st = status_of([&] { t.poll(); }, msg);
    if (st != Status::kOk) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::kOk;
}

// Rank `origin` notes the blame, fails and tells the others; every other rank polls until the abort
// arrives (it must note a blame), fails with it, and hands the table and the error to `check`.
template <typename Check>
void relay(int n, int origin, bool aborted, std::vector<int> blamed, Status status, const std::string& message,
           Check check) {
  std::atomic<int> got{0};
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[r] = r;
  run_on_transports(n, [&](int r, SharedTransport& shared) {
    PeerTable t(shared, r, members, 0);
    if (r == origin) {
      t.blame(origin, aborted, blamed);
      t.fail(status, message, true);
      wait_for(got, n - 1);
      return;
    }
    std::string msg;
    const Status st = poll_until_error(t, &msg);
    EXPECT(t.blamed(), "rank {}: the abort noted no blame ({})", r, msg);
    t.fail(st, msg, false);
    check(r, t, st, msg);
    ++got;
  });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(peer_table)

BOOST_AUTO_TEST_CASE(rank_lists_and_phrases) {
  BOOST_TEST(engine::comm::ranks_phrase({3}) == "rank 3");
  BOOST_TEST(engine::comm::ranks_phrase({1, 2}) == "ranks 1, 2");
  BOOST_TEST(engine::comm::format_rank_list({2, 5, 11}) == "2,5,11");
  BOOST_TEST((engine::comm::parse_rank_list("2,5,11") == std::vector<int>{2, 5, 11}));
  BOOST_TEST((engine::comm::parse_rank_list("1,x,3") == std::vector<int>{1, 3}));
  BOOST_TEST(engine::comm::parse_rank_list("").empty());
}

BOOST_AUTO_TEST_CASE(timeout_verdict_blames_ranks_nobody_heard_from) {
  using engine::comm::timeout_verdict;
  // Rank 0 waits for 1 and 2; rank 1 announced it waits for 3: 2 and 3 never took part.
  auto v = timeout_verdict(0, {1, 2}, {{1, {3}}});
  BOOST_TEST((v.missing == std::vector<int>{2, 3}));
  BOOST_TEST((v.stuck == std::vector<int>{1}));
  // Nobody else announced anything: everyone waited for is blamed.
  v = timeout_verdict(2, {0, 1}, {});
  BOOST_TEST((v.missing == std::vector<int>{0, 1}));
  BOOST_TEST(v.stuck.empty());
  // Everyone waited for is stuck as well: nobody can be named.
  v = timeout_verdict(0, {1}, {{1, {0}}});
  BOOST_TEST(v.missing.empty());
  BOOST_TEST((v.stuck == std::vector<int>{1}));
}

BOOST_AUTO_TEST_CASE(the_first_failure_wins_with_its_blame) {
  run_on_transports(1, [](int, SharedTransport& shared) {
    PeerTable t(shared, 0, {0}, 0);
    EXPECT(!t.is_failed() && !t.failure_status().failed && t.failure_status().origin == -1, "healthy table failed");
    EXPECT(status_of([&] { t.check_usable(); }) == Status::kOk, "a healthy table is usable");
    // kOk records nothing but drops the pending blame.
    t.blame(0, false, {5});
    EXPECT(t.blamed(), "blame not noted");
    t.fail(Status::kOk, "", false);
    EXPECT(!t.is_failed() && !t.blamed(), "kOk failed the table or kept the blame");
    // Blamed ranks come out sorted, without duplicates.
    t.blame(0, true, {7, 3, 7});
    const auto [st, msg] = t.fail(Status::kTimeout, "first", false);
    EXPECT(st == Status::kTimeout && msg == "first", "fail returned {} '{}'", status_name(st), msg);
    auto f = t.failure_status();
    EXPECT(f.failed && f.status == Status::kTimeout && f.origin == 0 && f.aborted &&
               f.ranks == std::vector<int>({3, 7}) && f.message == "first",
           "failure_status: origin {} aborted {} ranks {}", f.origin, f.aborted, f.ranks.size());
    EXPECT(!t.blamed(), "the blame outlived the failure");
    // A later failure changes nothing.
    t.blame(0, false, {1});
    const auto [st2, msg2] = t.fail(Status::kMismatch, "second", false);
    EXPECT(st2 == Status::kTimeout && msg2 == "first" && t.failure_message() == "first", "overwritten by {}", msg2);
    f = t.failure_status();
    EXPECT(f.ranks == std::vector<int>({3, 7}) && f.aborted, "blame overwritten");
    std::string why;
    EXPECT(status_of([&] { t.check_usable(); }, &why) == Status::kTimeout &&
               why == "communicator already failed: first",
           "check_usable: '{}'", why);
  });
}

BOOST_AUTO_TEST_CASE(a_failure_without_blame_is_this_ranks_own) {
  run_on_transports(1, [](int, SharedTransport& shared) {
    PeerTable t(shared, 0, {0}, 0);
    t.fail(Status::kInternal, "broken", true);  // no peers to tell
    const auto f = t.failure_status();
    EXPECT(f.origin == 0 && !f.aborted && f.ranks.empty(), "origin {} aborted {}", f.origin, f.aborted);
  });
}

BOOST_AUTO_TEST_CASE(an_abort_reaches_the_peer_with_its_origin_and_blame) {
  relay(3, 0, false, {2, 2}, Status::kMismatch, "rank 0 called allreduce but rank 2 sent broadcast",
        [](int r, PeerTable& t, Status st, const std::string& msg) {
          EXPECT(st == Status::kMismatch, "status {} '{}'", status_name(st), msg);
          EXPECT(msg.find("(reported by rank 0)") != std::string::npos &&
                     msg.find("rank 2 sent broadcast") != std::string::npos,
                 "{}", msg);
          const auto f = t.failure_status();
          EXPECT(f.origin == 0 && !f.aborted && f.ranks == std::vector<int>{2}, "rank {}: origin {} ranks {}", r,
                 f.origin, f.ranks.size());
        });
}

BOOST_AUTO_TEST_CASE(an_application_abort_is_a_peer_failure_naming_the_rank) {
  relay(2, 1, true, {}, Status::kPeerFailure, "rank 1 aborted the communicator: enough",
        [](int, PeerTable& t, Status st, const std::string& msg) {
          EXPECT(st == Status::kPeerFailure && msg == "rank 1 aborted the communicator: enough", "{} '{}'",
                 status_name(st), msg);
          const auto f = t.failure_status();
          EXPECT(f.origin == 1 && f.aborted && f.ranks.empty(), "origin {} aborted {}", f.origin, f.aborted);
        });
}

BOOST_AUTO_TEST_CASE(timeout_notices_are_kept_per_operation) {
  std::atomic<int> got{0};
  run_on_transports(2, [&](int r, SharedTransport& shared) {
    PeerTable t(shared, r, {0, 1}, 0);
    if (r == 0) {
      t.announce_wait(7, {1});
      wait_for(got, 1);
    } else {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (t.notices(7).empty() && std::chrono::steady_clock::now() < until) {
        t.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const auto& n = t.notices(7);
      EXPECT(n.size() == 1 && n.count(0) && n.at(0) == std::vector<int>{1}, "notices for op 7: {}", n.size());
      EXPECT(t.notices(8).empty() && !t.is_failed(), "a notice failed the table or landed elsewhere");
      ++got;
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
