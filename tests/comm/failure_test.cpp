// Failures: mismatched calls, a rank that never shows up, abort, a peer that leaves, bad arguments.
// Every rank must end with a clear error naming what happened -- never corrupted data, never a hang.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <limits>

#include <fmt/ranges.h>

#include "tests/comm/comm_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using Clock = std::chrono::steady_clock;

namespace {

// Runs `mismatched` and then a barrier; returns the first error (status, message).
std::pair<Status, std::string> first_error(const std::function<void()>& mismatched, Communicator& c) {
  std::string msg;
  Status st = status_of(mismatched, &msg);
  if (st == Status::kOk) st = status_of([&] { c.barrier()->wait(); }, &msg);
  return {st, msg};
}

// Rank 0 broadcasts 1024 floats while the others allreduce them; returns the first error (as first_error).
std::pair<Status, std::string> broadcast_against_allreduce(int r, Communicator& c) {
  std::vector<float> buf(1024, 1.f), out(1024);
  return first_error(
      [&] {
        if (r == 0)
          c.broadcast(buf.data(), 1024, DType::kF32, 0)->wait();
        else
          c.allreduce(buf.data(), out.data(), 1024, DType::kF32, ReduceOp::kSum)->wait();
      },
      c);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(failures)

BOOST_AUTO_TEST_CASE(different_collectives_give_a_mismatch_naming_both) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_timeout(10000), [&](int r, Communicator& c) {
      auto [st, msg] = broadcast_against_allreduce(r, c);
      EXPECT(st == Status::kMismatch, "status {} ({})", status_name(st), msg);
      EXPECT(contains(msg, "allreduce(f32, sum, 1024)") && contains(msg, "broadcast(f32, 1024, root 0)"),
             "message lacks a description: {}", msg);
      EXPECT(c.is_failed() && contains(msg, c.failure_message()), "not failed: {}", c.failure_message());
      // Blamed on the other side of the mismatched message (rank 0 for ranks 1 and 2, or 1/2 for 0),
      // found by the rank that received it.
      const auto f = c.failure_status();
      EXPECT(f.failed && f.status == Status::kMismatch && !f.aborted && f.message == c.failure_message(),
             "failure_status: failed {} status {} aborted {}", f.failed, status_name(f.status), f.aborted);
      EXPECT(f.origin >= 0 && f.origin < 3 && f.ranks.size() == 1 && f.ranks[0] != f.origin &&
                 (f.origin == 0 || f.ranks[0] == 0),
             "rank {}: origin {} ranks {}", r, f.origin, fmt::join(f.ranks, ","));
    });
  }
}

// Issue #17: ranks that disagree on the root of a broadcast or a reduce all fail with kMismatch naming both roots
// (a broadcast returned OK everywhere with different data on different ranks; a reduce failed on some ranks
// only), and every rank blames the same ranks.
BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_root_all_get_a_mismatch_naming_both_roots) {
  for (const auto& tr : transports_under_test())
    for (const bool reduce : {false, true})
      for (const int n : {2, 3}) {
        run_ranks(tr, n, with_timeout(5000), [&](int r, Communicator& c) {
          // Two ranks: each thinks it is the root. Three: ranks 0 and 1 say root 0, rank 2 says root 1.
          const int root = n == 2 ? r : (r == 2 ? 1 : 0);
          std::vector<float> buf(4096, static_cast<float>(r)), out(4096);
          std::string msg;
          const Status st = status_of(
              [&] {
                if (reduce)
                  c.reduce(buf.data(), out.data(), buf.size(), DType::kF32, ReduceOp::kSum, root)->wait();
                else
                  c.broadcast(buf.data(), buf.size(), DType::kF32, root)->wait();
              },
              &msg);
          const std::string want = n == 2 ? "rank 0 passed root 0, rank 1 passed root 1"
                                          : "rank 0 passed root 0, rank 2 passed root 1";
          EXPECT(st == Status::kMismatch, "{} {} ranks: status {} ({})", reduce ? "reduce" : "broadcast", n,
                 status_name(st), msg);
          EXPECT(contains(msg, "disagree on the root") && contains(msg, want), "{}", msg);
          EXPECT(contains(msg, reduce ? "reduce(f32, sum, 4096" : "broadcast(f32, 4096"), "{}", msg);
          const auto f = c.failure_status();
          const std::vector<int> blamed = n == 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
          EXPECT(f.failed && f.status == Status::kMismatch && f.origin == 0 && f.ranks == blamed,
                 "rank {}: status {} origin {} ranks {}", r, status_name(f.status), f.origin, fmt::join(f.ranks, ","));
        });
      }
}

BOOST_AUTO_TEST_CASE(ranks_that_agree_on_the_root_still_broadcast_and_reduce) {
  for (const auto& tr : transports_under_test())
    run_ranks(tr, 3, with_timeout(10000), [&](int r, Communicator& c) {
      for (int root = 0; root < 3; ++root) {
        std::vector<float> buf(1000, static_cast<float>(r + 1)), out(1000, -1.f);
        c.broadcast(buf.data(), buf.size(), DType::kF32, root)->wait();
        EXPECT(buf[0] == static_cast<float>(root + 1) && buf[999] == static_cast<float>(root + 1), "broadcast {}",
               buf[0]);
        std::vector<float> in(1000, static_cast<float>(r + 1));
        c.reduce(in.data(), out.data(), in.size(), DType::kF32, ReduceOp::kSum, root)->wait();
        EXPECT(r != root || out[0] == 6.f, "reduce {}", out[0]);
      }
    });
}

BOOST_AUTO_TEST_CASE(different_counts_give_a_mismatch) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_timeout(10000), [&](int r, Communicator& c) {
      std::vector<float> buf(2048, 1.f), out(2048);
      const size_t count = r == 2 ? 2048 : 1024;
      auto [st, msg] = first_error(
          [&] { c.allreduce(buf.data(), out.data(), count, DType::kF32, ReduceOp::kSum)->wait(); }, c);
      EXPECT(st == Status::kMismatch, "status {} ({})", status_name(st), msg);
      EXPECT(contains(msg, "allreduce(f32, sum, 1024)") && contains(msg, "allreduce(f32, sum, 2048)"), "{}", msg);
    });
  }
}

BOOST_AUTO_TEST_CASE(point_to_point_size_mismatch) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 2, with_timeout(10000), [&](int r, Communicator& c) {
      std::vector<float> buf(20);
      auto [st, msg] = first_error(
          [&] {
            if (r == 0)
              c.send(buf.data(), 10, DType::kF32, 1, 4)->wait();
            else
              c.recv(buf.data(), 20, DType::kF32, 0, 4)->wait();
          },
          c);
      EXPECT(st == Status::kMismatch, "status {} ({})", status_name(st), msg);
      EXPECT(contains(msg, "recv(f32, 20, tag 4)") && contains(msg, "send(f32, 10, tag 4)"), "{}", msg);
    });
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_calls_times_out_everywhere_naming_it) {
  for (const auto& tr : transports_under_test())
    for (auto algo : {engine::comm::Algorithm::kAuto, engine::comm::Algorithm::kRing}) {
      std::atomic<int> finished{0};
      CommOptions o = with_timeout(500);
      o.allreduce_algorithm = algo;
      run_ranks(tr, 3, o, [&](int r, Communicator& c) {
        if (r == 2) {  // absent: never calls, stays alive until the others have given up
          const auto until = Clock::now() + std::chrono::seconds(10);
          while (finished.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          // The others' abort reaches this rank too.
          while (!c.is_failed() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          EXPECT(c.is_failed(), "the absent rank never learnt of the failure");
          const auto f = c.failure_status();
          EXPECT(f.status == Status::kTimeout && (f.origin == 0 || f.origin == 1) && f.ranks == std::vector<int>{2},
                 "absent rank: status {} origin {} ranks {}", status_name(f.status), f.origin, fmt::join(f.ranks, ","));
          return;
        }
        std::vector<float> in(1000, 1.f), out(1000);
        const auto t0 = Clock::now();
        std::string msg;
        const Status st = status_of([&] { c.allreduce(in.data(), out.data(), 1000, DType::kF32, ReduceOp::kSum)->wait(); },
                                    &msg);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        ++finished;
        EXPECT(st == Status::kTimeout, "status {} ({})", status_name(st), msg);
        EXPECT(ms >= 450 && ms < 3000, "gave up after {} ms with a 500 ms deadline", ms);
        EXPECT(contains(msg, "rank 2 never took part") && contains(msg, "allreduce(f32, sum, 1000)"), "{}", msg);
        const auto f = c.failure_status();
        EXPECT(f.failed && !f.aborted && f.ranks == std::vector<int>{2} && (f.origin == 0 || f.origin == 1),
               "rank {}: origin {} ranks {}", r, f.origin, fmt::join(f.ranks, ","));
      });
    }
}

BOOST_AUTO_TEST_CASE(abort_reaches_every_peer) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_timeout(10000), [&](int r, Communicator& c) {
      std::vector<float> in(100, 1.f), out(100);
      if (r == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        c.abort("stop now");
        EXPECT(c.is_failed(), "abort did not fail the communicator");
        const auto f = c.failure_status();
        EXPECT(f.failed && f.aborted && f.origin == 0 && f.ranks.empty() && contains(f.message, "stop now"),
               "aborting rank: aborted {} origin {} ranks {} ({})", f.aborted, f.origin, fmt::join(f.ranks, ","),
               f.message);
        std::string msg;
        EXPECT(status_of([&] { c.barrier(); }, &msg) == Status::kPeerFailure, "{}", msg);
        return;
      }
      const auto t0 = Clock::now();
      std::string msg;
      const Status st =
          status_of([&] { c.allreduce(in.data(), out.data(), 100, DType::kF32, ReduceOp::kSum)->wait(); }, &msg);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      EXPECT(st == Status::kPeerFailure, "status {} ({})", status_name(st), msg);
      EXPECT(contains(msg, "rank 0") && contains(msg, "stop now"), "{}", msg);
      EXPECT(ms < 3000, "took {} ms to notice", ms);
      const auto f = c.failure_status();
      EXPECT(f.failed && f.status == Status::kPeerFailure && f.aborted && f.origin == 0 && f.ranks.empty(),
             "rank {}: status {} aborted {} origin {} ranks {}", r, status_name(f.status), f.aborted, f.origin,
             fmt::join(f.ranks, ","));
    });
  }
}

BOOST_AUTO_TEST_CASE(a_peer_that_leaves_fails_the_others) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_timeout(4000), [&](int r, Communicator& c) {
      if (r == 2) return;  // its communicator is destroyed right away
      std::vector<float> in(50000, 1.f), out(50000);
      const auto t0 = Clock::now();
      std::string msg;
      const Status st =
          status_of([&] { c.allreduce(in.data(), out.data(), 50000, DType::kF32, ReduceOp::kSum)->wait(); }, &msg);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      EXPECT(st == Status::kPeerFailure || st == Status::kTimeout, "status {} ({})", status_name(st), msg);
      EXPECT(contains(msg, "rank 2"), "{}", msg);
      EXPECT(ms < 6000, "took {} ms", ms);
      // Whoever noticed first (this rank or the other survivor) blames rank 2.
      const auto f = c.failure_status();
      EXPECT(f.failed && !f.aborted && f.ranks == std::vector<int>{2} && (f.origin == 0 || f.origin == 1),
             "rank {}: origin {} ranks {} ({})", r, f.origin, fmt::join(f.ranks, ","), f.message);
    });
  }
}

// Issue #17 (header vs library): tandem_comm_get_failure reports the failure "as every rank of the job reports it",
// but each rank that detected a fault itself named itself as the origin. Once the ranks' reports have crossed
// (the failing call returned, then a moment), every rank names the same origin and blames the same ranks.
BOOST_AUTO_TEST_CASE(every_rank_blames_the_same_ranks_for_one_failure) {
  using namespace std::chrono_literals;
  for (const auto& tr : transports_under_test()) {
    std::vector<engine::comm::FailureStatus> left(3), mismatched(3);
    run_ranks(tr, 3, with_timeout(4000), [&](int r, Communicator& c) {
      if (r == 2) return;  // leaves: both others detect it
      std::vector<float> in(50000, 1.f), out(50000);
      status_of([&] { c.allreduce(in.data(), out.data(), in.size(), DType::kF32, ReduceOp::kSum)->wait(); });
      std::this_thread::sleep_for(300ms);
      left[r] = c.failure_status();
    });
    run_ranks(tr, 3, with_timeout(4000), [&](int r, Communicator& c) {
      broadcast_against_allreduce(r, c);
      std::this_thread::sleep_for(300ms);
      mismatched[r] = c.failure_status();
    });
    BOOST_TEST((left[0].failed && left[1].failed), tr);
    BOOST_TEST(left[0].origin == left[1].origin, tr << ": origins " << left[0].origin << " and " << left[1].origin);
    BOOST_TEST((left[0].ranks == std::vector<int>{2} && left[1].ranks == std::vector<int>{2}), tr);
    for (int r = 1; r < 3; ++r) {
      BOOST_TEST(mismatched[r].failed, tr);
      BOOST_TEST(mismatched[r].origin == mismatched[0].origin,
                 tr << ": rank " << r << " origin " << mismatched[r].origin << ", rank 0 " << mismatched[0].origin);
      BOOST_TEST((mismatched[r].ranks == mismatched[0].ranks), tr << ": rank " << r << " blames differently");
    }
  }
}

BOOST_AUTO_TEST_CASE(invalid_arguments_are_refused_and_leave_the_communicator_usable) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 2, with_timeout(10000), [&](int r, Communicator& c) {
      std::vector<float> a(8, 1.f), b(8);
      const auto bad = static_cast<DType>(42);
      const auto bad_op = static_cast<ReduceOp>(9);
      const size_t huge = std::numeric_limits<size_t>::max() / 2;
      std::string msg;
      EXPECT(status_of([&] { c.broadcast(a.data(), 8, DType::kF32, 2); }, &msg) == Status::kInvalidArgument, "");
      EXPECT(contains(msg, "root 2"), "{}", msg);
      EXPECT(status_of([&] { c.reduce(a.data(), b.data(), 8, DType::kF32, ReduceOp::kSum, -1); }) ==
                 Status::kInvalidArgument, "");
      EXPECT(status_of([&] { c.allreduce(a.data(), b.data(), 8, bad, ReduceOp::kSum); }, &msg) ==
                 Status::kInvalidArgument, "");
      EXPECT(contains(msg, "dtype value 42"), "{}", msg);
      EXPECT(status_of([&] { c.allreduce(a.data(), b.data(), 8, DType::kF32, bad_op); }) == Status::kInvalidArgument,
             "");
      EXPECT(status_of([&] { c.allreduce(a.data(), b.data(), huge, DType::kF32, ReduceOp::kSum); }, &msg) ==
                 Status::kInvalidArgument, "");
      EXPECT(contains(msg, "overflow"), "{}", msg);
      EXPECT(status_of([&] { c.allgather(a.data(), b.data(), huge / 4, DType::kF64); }) == Status::kInvalidArgument, "");
      EXPECT(status_of([&] { c.allreduce(nullptr, b.data(), 8, DType::kF32, ReduceOp::kSum); }) ==
                 Status::kInvalidArgument, "");
      EXPECT(status_of([&] { c.send(a.data(), 8, DType::kF32, 1 - r, 1u << 24); }) == Status::kInvalidArgument, "");
      EXPECT(status_of([&] { c.recv(a.data(), 8, DType::kF32, 5, 0); }) == Status::kInvalidArgument, "");
      EXPECT(!c.is_failed(), "bad arguments must not fail the communicator");
      const auto f = c.failure_status();
      EXPECT(!f.failed && f.status == Status::kOk && f.origin == -1 && f.ranks.empty(), "healthy: origin {}", f.origin);
      c.allreduce(a.data(), b.data(), 8, DType::kF32, ReduceOp::kSum)->wait();
      EXPECT(b[7] == 2.f, "allreduce after bad calls gave {}", b[7]);
    });
  }
}

BOOST_AUTO_TEST_SUITE_END()
