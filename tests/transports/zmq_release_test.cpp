// zmq: a send that is cancelled or failed no longer reads its buffer once cancel() (or the request's destruction)
// returns (issue #17: a survivor of a killed rank freed its all-reduce buffer after the error, and ZeroMQ's I/O
// thread -- still writing a zero-copy frame of the failed collective to a live peer -- hit EFAULT and aborted the
// process with "Bad address (src/tcp.cpp:254)").
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include "tests/transports/harness.hpp"
#include "tests/transports/pages.hpp"
#include "tests/transports/peer_process.hpp"
#include "transports/zmq/zmq_transport.hpp"

using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;
using Clock = std::chrono::steady_clock;

namespace {

long ms_since(Clock::time_point t0) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

// Rank 0 as a process of its own ("idle": it sends rank 1 a 100-byte message, then only progresses) and rank 1 here,
// connected to it. stop() waits for that message (`first` says whether it came) and stops rank 0 (SIGSTOP): it then
// takes no data. The destructor kills and reaps it (by its PID; never left behind); `status` is its wait status.
struct IdlePeer {
  explicit IdlePeer(const std::string& name)
      : dir(name), pid(spawn_peer({TANDEM_TRANSPORT_PEER_EXE, "zmq", dir.path(), name, "0", "2", "idle"})) {
    BOOST_REQUIRE(pid > 0);
  }
  ~IdlePeer() { reap(); }
  void stop() {
    std::vector<unsigned char> small(100);
    const MutPart a{small.data(), small.size()};
    auto r = t->irecv(0, 3, std::span<const MutPart>(&a, 1));
    first = poll_for(*t, *r, std::chrono::milliseconds(10000)) ? "ok" : "pending";
    ::kill(pid, SIGSTOP);
  }
  int reap() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      status = reap_peer(pid);
      pid = -1;
    }
    return status;
  }
  PeerDir dir;
  pid_t pid;
  std::unique_ptr<Transport> t;
  std::string first = "not run";
  int status = 0;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(zmq_release)

// Rank 0 starts a 64 MiB send (zero-copy frames pointing into its buffer) and cancels it at once, while ZeroMQ is
// still writing it; then it overwrites the buffer with a guard byte, as a freed and reused buffer would hold, and
// unmaps it. Rank 1 receives the message: it arrives whole (a frame handed to ZeroMQ cannot be recalled) and holds
// none of the guard bytes. Before, cancel() returned at once: the tail of the message carried the guard bytes (or
// the unmapped pages aborted the process inside ZeroMQ).
BOOST_AUTO_TEST_CASE(a_cancelled_send_no_longer_reads_its_buffer_once_cancel_returns) {
  constexpr size_t kBytes = size_t{64} << 20;
  for (int round = 0; round < 3; ++round) {
    long cancel_ms = -1;
    size_t guards = 0;
    run_ranks("zmq", 2, [&](Rank& rk) {
      if (rk.rank == 0) {
        Pages buf(kBytes);
        std::fill(buf.begin(), buf.begin() + kBytes, 0x5a);
        const ConstPart part{buf.data, kBytes};
        rk.sync.arrive_and_wait();  // (1) rank 1 has posted its receive
        auto req = rk.t.isend(1, 77, std::span(&part, 1));
        const auto t0 = Clock::now();
        req->cancel();
        cancel_ms = ms_since(t0);
        std::fill(buf.begin(), buf.begin() + kBytes, 0xee);
        buf.unmap();
        rk.sync.arrive_and_wait();  // (2)
        rk.sync.arrive_and_wait();  // (3) rank 1 has its message
        return;
      }
      std::vector<unsigned char> got(kBytes, 0);
      const MutPart part{got.data(), got.size()};
      auto recv = rk.t.irecv(0, 77, std::span(&part, 1));
      rk.sync.arrive_and_wait();  // (1)
      rk.sync.arrive_and_wait();  // (2)
      wait(rk.t, *recv);
      CHECK_RANK(recv->bytes() == kBytes, recv->bytes() << " bytes arrived");
      guards = static_cast<size_t>(std::count(got.begin(), got.end(), 0xee));
      CHECK_RANK(std::count(got.begin(), got.end(), 0x5a) + guards == static_cast<long>(kBytes), "foreign bytes arrived");
      rk.sync.arrive_and_wait();  // (3)
    });
    BOOST_TEST_MESSAGE("round " << round << ": cancel took " << cancel_ms << " ms; " << guards << " guard bytes arrived");
    BOOST_TEST(guards == 0u, guards << " bytes written after cancel() returned reached the receiver");
    BOOST_TEST(cancel_ms >= 0);
    BOOST_TEST(cancel_ms < 5000, "cancel took " << cancel_ms << " ms");
  }
}

// A send that never handed ZeroMQ a frame -- to oneself, copied (small), or cancelled after it completed -- is
// released at once: the wait above is for frames only (a send to oneself once waited the whole release window).
BOOST_AUTO_TEST_CASE(sends_without_frames_in_zeromq_are_released_at_once) {
  long longest = -1;
  run_ranks("zmq", 2, [&](Rank& rk) {
    for (const size_t bytes : {size_t{3000}, size_t{1} << 20}) {
      std::vector<unsigned char> out(bytes, 7), in(bytes, 0);
      const ConstPart sp{out.data(), out.size()};
      const MutPart rp{in.data(), in.size()};
      for (const int peer : {rk.rank, 1 - rk.rank}) {
        auto r = rk.t.irecv(peer, 11, std::span(&rp, 1));
        auto sq = rk.t.isend(peer, 11, std::span(&sp, 1));
        wait(rk.t, *r);
        wait(rk.t, *sq);
        CHECK_RANK(in == out, "exchange with rank " << peer);
        const auto t0 = Clock::now();
        sq->cancel();
        sq.reset();
        if (rk.rank == 0) longest = std::max(longest, ms_since(t0));
      }
    }
  });
  BOOST_TEST(longest >= 0);
  BOOST_TEST(longest < 200, "releasing a completed send took " << longest << " ms");
}

// Rank 0 is another process, stopped (SIGSTOP) while rank 1 (this process) sends it 16 MiB: most of the frames stay
// queued in ZeroMQ. Then rank 0 is killed. The send fails naming rank 0, and destroying the failed request -- which
// waits until ZeroMQ let go of the frames -- returns promptly, far within the release window: ZeroMQ drops what was
// queued for a dead rank with its connection. The buffer is unmapped right after; the transport keeps progressing
// and is destroyed without touching it.
BOOST_AUTO_TEST_CASE(a_send_failed_by_a_killed_peer_lets_go_of_its_buffer_promptly) {
  constexpr size_t kBytes = size_t{16} << 20;
  IdlePeer peer("zmq-killed");
  std::string outcome = "not run";
  long failed_ms = -1, release_ms = -1;
  bool queued = false;
  try {
    peer.t = create_transport(options_for("zmq", 1, 2, peer.dir.store(), "zmq-killed"));
    Transport& t = *peer.t;
    peer.stop();
    Pages buf(kBytes);
    std::fill(buf.begin(), buf.begin() + kBytes, 0x5a);
    const ConstPart part{buf.data, kBytes};
    auto send = t.isend(0, 5, std::span(&part, 1));
    for (int i = 0; i < 50; ++i) t.wait_for_progress(std::chrono::milliseconds(1));
    queued = !send->test();  // frames still held by ZeroMQ: the stopped rank takes nothing
    const auto t0 = Clock::now();
    ::kill(peer.pid, SIGKILL);
    try {
      outcome = poll_for(t, *send, std::chrono::milliseconds(10000)) ? "completed" : "pending";
    } catch (const Error& e) {
      outcome = std::string(status_name(e.status())) + ": " + e.what();
    }
    failed_ms = ms_since(t0);
    const auto t1 = Clock::now();
    send.reset();
    release_ms = ms_since(t1);
    buf.unmap();
    for (int i = 0; i < 100; ++i) t.wait_for_progress(std::chrono::milliseconds(1));
    peer.t.reset();
  } catch (const std::exception& e) {
    outcome = std::string("unexpected: ") + e.what();
  }
  const int status = peer.reap();
  BOOST_TEST_MESSAGE("send to a stopped then killed rank: " << outcome << " after " << failed_ms
                                                            << " ms; releasing it took " << release_ms << " ms");
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(peer.first == "ok", peer.first);
  BOOST_TEST(queued, "the send to the stopped rank completed before it was killed");
  BOOST_TEST(outcome.find(status_name(Status::kPeerFailure)) == 0, outcome);
  BOOST_TEST(outcome.find("rank 0") != std::string::npos, outcome);
  BOOST_TEST(release_ms >= 0);
  BOOST_TEST(release_ms < 1000, "releasing the failed send took " << release_ms << " ms");
}

// Rank 0 is another process, stopped (SIGSTOP) and never resumed before it is killed: it takes no data, so ZeroMQ
// holds the frames of two 16 MiB sends to it. The first cancel waits its whole release window (kReleaseWindowMs)
// and gives up (logged); the second, towards the same peer while the first is still held, does not wait again; and
// destroying the transport drops what is queued at once instead of lingering 2 s -- its frames would be written
// from a buffer the caller was told it may free if the peer came back during the linger.
BOOST_AUTO_TEST_CASE(sends_to_a_stopped_peer_are_given_up_after_one_window_and_teardown_drops_them) {
  constexpr size_t kBytes = size_t{16} << 20;
  std::vector<unsigned char> a(kBytes, 0x11), b(kBytes, 0x22);  // outlive the transport
  IdlePeer peer("zmq-given-up");
  std::string outcome = "not run";
  long cancel_ms[2] = {-1, -1}, destroy_ms = -1;
  bool queued = false;
  try {
    peer.t = create_transport(options_for("zmq", 1, 2, peer.dir.store(), "zmq-given-up"));
    Transport& t = *peer.t;
    peer.stop();
    const ConstPart pa{a.data(), a.size()}, pb{b.data(), b.size()};
    auto sa = t.isend(0, 5, std::span(&pa, 1));
    auto sb = t.isend(0, 6, std::span(&pb, 1));
    for (int i = 0; i < 20; ++i) t.wait_for_progress(std::chrono::milliseconds(1));
    queued = !sa->test() && !sb->test();
    for (int k = 0; k < 2; ++k) {
      const auto t0 = Clock::now();
      (k == 0 ? sa : sb)->cancel();
      cancel_ms[k] = ms_since(t0);
    }
    try {
      outcome = sa->test() ? "completed" : "pending";
    } catch (const Error& e) {
      outcome = std::string(status_name(e.status())) + ": " + e.what();
    }
    const auto t1 = Clock::now();
    peer.t.reset();
    destroy_ms = ms_since(t1);
  } catch (const std::exception& e) {
    outcome = std::string("unexpected: ") + e.what();
  }
  const int status = peer.reap();
  BOOST_TEST_MESSAGE("sends to a stopped rank: cancels " << cancel_ms[0] << " and " << cancel_ms[1] << " ms, teardown "
                                                         << destroy_ms << " ms; " << outcome);
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(peer.first == "ok", peer.first);
  BOOST_TEST(queued, "a send to the stopped rank completed");
  BOOST_TEST(outcome.find("cancelled") != std::string::npos, outcome);
  constexpr long kWindow = transports::zmq::kReleaseWindowMs;
  BOOST_TEST(cancel_ms[0] >= kWindow - 50, "the first cancel gave up early: " << cancel_ms[0] << " ms");
  BOOST_TEST(cancel_ms[0] < kWindow + 1500, "the first cancel took " << cancel_ms[0] << " ms");
  BOOST_TEST(cancel_ms[1] >= 0);
  BOOST_TEST(cancel_ms[1] < 500, "the second cancel towards the same peer waited " << cancel_ms[1] << " ms");
  BOOST_TEST(destroy_ms >= 0);
  BOOST_TEST(destroy_ms < 1000, "the teardown lingered " << destroy_ms << " ms on frames given up");
}

BOOST_AUTO_TEST_SUITE_END()
