// Issue #17: a ucx rank left "deaf" by a same-host rank killed while writing into its shared-memory receive queue
// (tests/transports/ucx_deaf_test.cpp makes one; its operations with same-host ranks then fail at once) must take
// part again in the communicator the survivors shrink to: Communicator::shrink reconnects the transport
// (Transport::reconnect), which moves the deaf rank to a fresh worker and its peers to it.
//
// Made for real, in three processes: rank 1 (comm_peer flood) floods this process, rank 0, with 4,000-byte
// messages and is SIGKILLed at a varying moment; rank 2 (comm_peer partner) then sends 1 MiB to rank 0 on a
// communicator of ranks {0, 2}, which rank 1's death alone does not fail: rank 0 receives it (it still hears) or
// fails a peer failure (deaf). Either way both survivors shrink the world to {0, 2} and all-reduce there, 1000
// floats and then 1 MiB of them: every element must be 4 on both ranks (rank 2 checks its own, its exit code
// says), within the communicator's 4 s deadline. Bounded: at most kTrials trials, stopping after kDeafWanted deaf
// ones; needs one; every process is reaped by its PID.
#include <signal.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "engine/core/settings.hpp"
#include "tests/comm/comm_harness.hpp"
#include "tests/transports/peer_process.hpp"

namespace {

using namespace tandem;
using namespace tandem::testing;
using transports::testing::PeerDir;
using transports::testing::reap_killed_and_partner;
using transports::testing::spawn_peer;
using Clock = std::chrono::steady_clock;

// As many as ucx_deaf's reproduction allows; a run stops after its second deaf trial (2 of 3 trials deaf in a plain
// build here).
constexpr int kTrials = 60;
// Under a sanitizer the processes run several times slower and the kill seldom lands inside a write: 0 deaf of 30
// trials beside the other sanitized suites (CI of session 28), 1 of 30 and 2 of 12 by hand. There a run without a
// deaf trial is reported, not failed -- every trial's shrink and sums are still checked -- and the reproduction is
// asserted by the plain build, which CI always runs.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
constexpr int kDeafWanted = 2;

struct Trial {
  std::string outcome;  // "heard", "deaf", or what went wrong
  std::string after;    // what went wrong after the shrink ("" when every sum was right)
  long shrunk_ms = -1;  // from the shrink's start to the second all-reduce's end
  int partner_code = -1;
};

std::string all_fours(Communicator& c, size_t count) {
  std::vector<float> in(count, 1.f), out(count, -1.f);  // rank 0 gives 1, rank 2 gives 3
  c.allreduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum)->wait();
  for (size_t i = 0; i < count; ++i)
    if (out[i] != 4.f) return fmt::format("element {} of {} is {}, not 4", i, count, out[i]);
  return "";
}

Trial run_trial(int flood_before_kill) {
  PeerDir dir("ucx-shrink");
  const pid_t flooder = spawn_peer({TANDEM_COMM_PEER_EXE, dir.path(), "1", "flood"});
  const pid_t partner = spawn_peer({TANDEM_COMM_PEER_EXE, dir.path(), "2", "partner"});
  Trial trial;
  if (flooder > 0 && partner > 0) {
    std::vector<unsigned char> big(size_t{1} << 20), small(4000);
    try {
      BootstrapInfo info;
      info.rank = 0;
      info.size = 3;
      info.host = "localhost";
      CommOptions options = with_timeout(4000);
      options.transport = "ucx";
      auto store = std::make_shared<transports::testing::FileStore>(dir.path());
      auto world = Communicator::create(info, store, options);
      auto pair = world->split(0, 0);
      for (int i = 0; i < flood_before_kill; ++i) world->recv(small.data(), small.size(), DType::kU8, 1, 7)->wait();
      ::kill(flooder, SIGKILL);
      std::string why;
      const Status heard = status_of([&] { pair->recv(big.data(), big.size(), DType::kU8, 1, 9)->wait(); }, &why);
      trial.outcome = heard == Status::kOk ? "heard"
                      : heard == Status::kPeerFailure ? "deaf"
                                                      : fmt::format("{} from {{0, 2}}: {}", status_name(heard), why);
      unsigned char never = 0;
      const Status dead = status_of([&] { world->recv(&never, 1, DType::kU8, 1, 8)->wait(); }, &why);
      if (dead != Status::kPeerFailure && dead != Status::kTimeout)
        trial.outcome += fmt::format("; the receive from the dead rank 1 gave {} ({})", status_name(dead), why);
      const auto t0 = Clock::now();
      try {
        auto survivors = world->shrink();
        if (survivors->size() != 2 || survivors->rank() != 0)
          trial.after = fmt::format("shrunk to rank {} of {}", survivors->rank(), survivors->size());
        if (trial.after.empty()) trial.after = all_fours(*survivors, 1000);
        if (trial.after.empty()) trial.after = all_fours(*survivors, size_t{1} << 18);
        trial.shrunk_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        survivors->barrier()->wait();
      } catch (const Error& e) {
        trial.after = fmt::format("{}: {}", status_name(e.status()), e.what());
      }
    } catch (const std::exception& e) {
      trial.outcome = std::string("unexpected: ") + e.what();
    }
  } else {
    trial.outcome = "could not start the peers";
  }
  trial.partner_code = reap_killed_and_partner(flooder, partner);
  return trial;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ucx_shrink)

BOOST_AUTO_TEST_CASE(a_rank_left_deaf_by_a_killed_peer_all_reduces_again_after_the_shrink) {
  int deaf = 0, heard = 0, trials = 0;
  for (int n = 0; n < kTrials && deaf < kDeafWanted; ++n) {
    const Trial t = run_trial(20 + (n * 37) % 400);
    ++trials;
    BOOST_TEST_MESSAGE("trial " << n << ": " << t.outcome << "; after the shrink: "
                                << (t.after.empty() ? "sums right" : t.after) << " (" << t.shrunk_ms
                                << " ms); rank 2 exited " << t.partner_code);
    if (t.outcome == "heard") ++heard;
    else if (t.outcome == "deaf") ++deaf;
    else BOOST_ERROR("trial " << n << ": " << t.outcome);
    BOOST_TEST(t.after.empty(), "trial " << n << " (" << t.outcome << "), rank 0 after the shrink: " << t.after);
    BOOST_TEST(t.partner_code == 0, "trial " << n << " (" << t.outcome << "): rank 2 exited " << t.partner_code
                                             << " (0: its sums in the shrunk communicator were right)");
  }
  BOOST_TEST_MESSAGE(deaf << " deaf of " << trials << " trials (" << heard << " heard)");
  if (kSanitized && deaf == 0) {
    BOOST_TEST_MESSAGE("no trial left rank 0 deaf in " << trials << " sanitized trials: only the heard path was checked");
  } else {
    BOOST_TEST(deaf >= 1, "no trial left rank 0 deaf in " << trials << " trials: the reproduction did not work");
  }
}

// A rank whose transport cuts a peer off for want of its own memory (ucx: none for the copy a cancelled send goes on
// from; test hook TANDEM_TEST_UCX_NO_COPY) is the one at fault, and the only rank the shrink drops. Three ranks on
// threads. Ranks 1 and 2 split a pair, which rank 2 destroys at once (it never receives on it). Rank 1, hooked, sends
// rank 2 1 MiB on the pair and aborts the pair: the abort cancels the send, which rank 2 never took, and rank 1 cuts
// rank 2 off. The world's next all-reduce then fails on every rank, and every rank blames rank 1. Before, rank 1
// blamed rank 2 (the peer of its failed operations) while rank 2 blamed rank 1, so the shrink dropped both (or,
// where rank 2 had adopted rank 1's report first, only rank 2). Now ranks 0 and 2 go on and rank 1 is refused.
BOOST_AUTO_TEST_CASE(a_rank_that_cuts_a_peer_off_for_want_of_memory_is_the_one_the_shrink_drops) {
  const auto built = transports::available_transports();
  if (std::find(built.begin(), built.end(), "ucx") == built.end()) return;
  constexpr int kCutter = 1, kCut = 2;
  std::vector<std::string> blamed(3), cut_error(3, "none"), outcome(3);
  run_ranks("ucx", 3, with_timeout(3000), [&](int r, Communicator& world) {
    auto hooked = std::make_shared<settings::Settings>(*settings::current());
    if (r == kCutter) hooked->assign("TANDEM_TEST_UCX_NO_COPY=1");
    const settings::Scope scope(hooked);  // this thread's, and the progress thread's of the pair it splits
    auto pair = world.split(r == 0 ? -1 : 0, r);
    if (r == kCut) pair.reset();
    world.barrier()->wait();
    if (r == kCutter) {
      std::vector<unsigned char> big(size_t{1} << 20, 0x5a);
      pair->send(big.data(), big.size(), DType::kU8, 1, 3)->wait();  // buffered: it waits for rank 2, which never takes it
      pair->abort("rank 1 gives the pair up");
      status_of([&] { pair->barrier()->wait(); });  // the abort cancelled the send: no memory for its copy, a cut
    }
    // The cut fails rank 2's world at once; an all-reduce the others finish before they hear of it (rank 2's part
    // may already have left) is a sound result, so every rank all-reduces until its world fails, a few times at most.
    float one = 1.f, sum = 0.f;
    std::string why;
    Status st = Status::kOk;
    for (int attempt = 0; attempt < 4 && st == Status::kOk; ++attempt)
      st = status_of([&] { world.allreduce(&one, &sum, 1, DType::kF32, ReduceOp::kSum)->wait(); }, &why);
    EXPECT(st == Status::kPeerFailure, "rank {}: the all-reduces after the cut gave {} ({})", r, status_name(st), why);
    if (r != 0) cut_error[static_cast<size_t>(r)] = why;
    blamed[static_cast<size_t>(r)] = fmt::format("{}", fmt::join(world.failure_status().ranks, ","));
    try {
      auto s = world.shrink();
      outcome[static_cast<size_t>(r)] =
          fmt::format("rank {} of {}, parents {}", s->rank(), s->size(), fmt::join(s->parent_ranks(), ","));
      float mine = static_cast<float>(r + 1), total = 0.f;
      s->allreduce(&mine, &total, 1, DType::kF32, ReduceOp::kSum)->wait();
      outcome[static_cast<size_t>(r)] += fmt::format(", sum {}", total);
    } catch (const Error& e) {
      outcome[static_cast<size_t>(r)] = fmt::format("{}: {}", status_name(e.status()), e.what());
    }
  });
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST_MESSAGE("rank " << r << ": blames " << blamed[r] << "; " << outcome[r]);
    BOOST_TEST(blamed[r] == "1", "rank " << r << " blames ranks {" << blamed[r] << "}");
  }
  BOOST_TEST(contains(cut_error[kCut], "rank 1 cut rank 2 off"), cut_error[kCut]);
  BOOST_TEST(outcome[0] == "rank 0 of 2, parents 0,2, sum 4");  // old ranks 0 and 2 give 1 and 3
  BOOST_TEST(outcome[kCut] == "rank 1 of 2, parents 0,2, sum 4");
  BOOST_TEST(contains(outcome[kCutter], "was declared dead"), outcome[kCutter]);
}

BOOST_AUTO_TEST_SUITE_END()
