// tcp: a send that is cancelled (or destroyed incomplete) no longer reads its parts once cancel() returns (issue #17:
// "when an operation returns an error, no transport may still touch its buffers"). A send already partly written
// must still be finished -- the peer's byte stream cannot skip the rest of a frame -- so its unwritten rest is copied
// at cancel(); a send not yet started is dropped from the queue. Over shared memory (plain "tcp"), local sockets
// ("tcp+unix") and TCP ("tcp+inet").
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>

#include "engine/core/settings.hpp"
#include "tests/transports/harness.hpp"
#include "tests/transports/pages.hpp"

namespace bdata = boost::unit_test::data;
using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;

BOOST_AUTO_TEST_SUITE(tcp_release)

// Rank 0 starts a 64 MiB send A to rank 1, which has posted its receives but does not progress yet: the socket (or
// ring) takes the first bytes, the rest waits in rank 0's queue. A 4 MiB send B queues behind it. Rank 0 cancels
// both at once, overwrites both buffers with a guard byte (as a freed and reused buffer would hold) and unmaps them,
// then sends a small message C and drives its transport until rank 1 has C. Rank 1 then receives A whole with none
// of the guard bytes (its rest was copied at cancel), then C intact; B (never started) never arrives and the stream
// stays in step. Before, the cancelled A stayed queued pointing at the caller's buffer: its tail carried guard bytes,
// or the unmapped pages failed the connection (EFAULT) or crashed the process (shared memory).
BOOST_DATA_TEST_CASE(a_cancelled_send_no_longer_reads_its_parts_once_cancel_returns,
                     bdata::make({"tcp", "tcp+unix", "tcp+inet"}), spec) {
  constexpr size_t kBig = size_t{64} << 20, kQueued = size_t{4} << 20, kSmall = 1000;
  size_t guards = 0;
  bool started = false;
  std::atomic<bool> have_c{false};
  run_ranks(spec, 2, [&](Rank& rk) {
    if (rk.rank == 0) {
      Pages a(kBig), b(kQueued);
      std::fill(a.begin(), a.begin() + kBig, 0x5a);
      std::fill(b.begin(), b.begin() + kQueued, 0x6b);
      const ConstPart pa{a.data, kBig}, pb{b.data, kQueued};
      rk.sync.arrive_and_wait();  // (1) rank 1 has posted its receives
      auto sa = rk.t.isend(1, 77, std::span(&pa, 1));
      auto sb = rk.t.isend(1, 78, std::span(&pb, 1));
      started = !sa->test() && !sb->test();  // rank 1 reads nothing yet: A is at most partly written
      sa->cancel();
      sb.reset();  // destroying an incomplete request cancels it too
      std::fill(a.begin(), a.begin() + kBig, 0xee);
      std::fill(b.begin(), b.begin() + kQueued, 0xee);
      a.unmap();
      b.unmap();
      std::string cancelled;
      try {
        sa->test();
      } catch (const Error& e) {
        cancelled = e.what();
      }
      CHECK_RANK(cancelled.find("cancelled") != std::string::npos, "the cancelled send says: '" << cancelled << "'");
      std::vector<unsigned char> c(kSmall, 0x3c);
      const ConstPart pc{c.data(), c.size()};
      auto sc = rk.t.isend(1, 79, std::span(&pc, 1));
      rk.sync.arrive_and_wait();  // (2) rank 1 may read
      wait(rk.t, *sc);
      // What is left of A is written by progress(): keep driving until rank 1 has C (behind it).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!have_c.load() && std::chrono::steady_clock::now() < until)
        rk.t.wait_for_progress(std::chrono::milliseconds(1));
      rk.sync.arrive_and_wait();  // (3)
      return;
    }
    std::vector<unsigned char> ga(kBig, 0), gb(kQueued, 0), gc(kSmall, 0);
    const MutPart pa{ga.data(), ga.size()}, pb{gb.data(), gb.size()}, pc{gc.data(), gc.size()};
    auto ra = rk.t.irecv(0, 77, std::span(&pa, 1));
    auto rb = rk.t.irecv(0, 78, std::span(&pb, 1));
    auto rc = rk.t.irecv(0, 79, std::span(&pc, 1));
    rk.sync.arrive_and_wait();  // (1)
    rk.sync.arrive_and_wait();  // (2)
    try {
      wait(rk.t, *rc, std::chrono::milliseconds(60000));
    } catch (...) {
      have_c = true;
      throw;
    }
    have_c = true;
    CHECK_RANK(ra->test(), "A did not arrive before C");
    CHECK_RANK(ra->bytes() == kBig, ra->bytes() << " bytes of A arrived");
    guards = static_cast<size_t>(std::count(ga.begin(), ga.end(), 0xee));
    CHECK_RANK(std::count(ga.begin(), ga.end(), 0x5a) + guards == static_cast<long>(kBig), "foreign bytes in A");
    CHECK_RANK(rc->bytes() == kSmall && std::count(gc.begin(), gc.end(), 0x3c) == static_cast<long>(kSmall),
               "C arrived damaged: " << rc->bytes() << " bytes");
    CHECK_RANK(!rb->test(), "B, cancelled before it started, arrived");
    rk.sync.arrive_and_wait();  // (3)
  });
  BOOST_TEST_MESSAGE(spec << ": " << guards << " guard bytes arrived");
  BOOST_TEST(started, "the sends completed before they were cancelled: the test proves nothing");
  BOOST_TEST(guards == 0u, guards << " bytes written after cancel() returned reached the receiver");
}

// No memory for that rest (test hook TANDEM_TEST_TCP_NO_COPY, on rank 0's thread around the cancel): rank 0 gives the
// connection up (the stream cannot be finished without the caller's parts), rank 1's receive of A fails as a peer
// failure naming rank 0, and both ranks blame rank 0, whose memory ran out (Transport::at_fault). Before, rank 0
// blamed rank 1 for the connection it gave up itself, and rank 1 blamed rank 0: a shrink dropped both.
BOOST_DATA_TEST_CASE(a_cancelled_send_without_memory_for_its_rest_gives_the_connection_up_and_both_blame_the_sender,
                     bdata::make({"tcp", "tcp+inet"}), spec) {
  constexpr size_t kBig = size_t{64} << 20;
  int sender_blames = -1, receiver_blames = -1;
  std::string receiver_error;
  run_ranks(spec, 2, [&](Rank& rk) {
    if (rk.rank == 0) {
      std::vector<unsigned char> a(kBig, 0x5a);
      const ConstPart pa{a.data(), kBig};
      rk.sync.arrive_and_wait();  // (1) rank 1 has posted its receive
      auto sa = rk.t.isend(1, 77, std::span(&pa, 1));
      CHECK_RANK(!sa->test(), "the 64 MiB send completed at once: nothing is left to copy");
      {
        auto hooked = std::make_shared<settings::Settings>(*settings::current());
        hooked->assign("TANDEM_TEST_TCP_NO_COPY=1");
        const settings::Scope scope(hooked);
        sa->cancel();
      }
      sender_blames = rk.t.at_fault(1);
      rk.sync.arrive_and_wait();  // (2) rank 1 may read
      rk.sync.arrive_and_wait();  // (3) it has seen the connection's end
      return;
    }
    std::vector<unsigned char> ga(kBig, 0);
    const MutPart pa{ga.data(), ga.size()};
    auto ra = rk.t.irecv(0, 77, std::span(&pa, 1));
    rk.sync.arrive_and_wait();  // (1)
    rk.sync.arrive_and_wait();  // (2)
    Status st = Status::kOk;
    try {
      wait(rk.t, *ra, std::chrono::milliseconds(30000));
    } catch (const Error& e) {
      st = e.status();
      receiver_error = e.what();
    }
    receiver_blames = rk.t.at_fault(0);
    rk.sync.arrive_and_wait();  // (3)
    CHECK_RANK(st == Status::kPeerFailure, "rank 1's receive of the cut stream: " << status_name(st) << " "
                                                                                  << receiver_error);
  });
  BOOST_TEST_MESSAGE(spec << ": rank 1's receive: " << receiver_error);
  BOOST_TEST(receiver_error.find("rank 0") != std::string::npos, receiver_error);
  BOOST_TEST(sender_blames == 0, "rank 0 blames rank " << sender_blames << " for the connection it gave up");
  BOOST_TEST(receiver_blames == 0);
}

BOOST_AUTO_TEST_SUITE_END()
