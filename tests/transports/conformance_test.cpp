// The one conformance suite every transport passes: each case runs over every built transport and
// several world sizes, ranks being threads of this process.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstring>

#include <sys/resource.h>

#include <fmt/ranges.h>

#include "tests/transports/harness.hpp"

namespace bdata = boost::unit_test::data;
using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;

namespace {

std::unique_ptr<Request> send_bytes(Transport& t, int peer, uint64_t tag, const std::vector<unsigned char>& v) {
  ConstPart p{v.data(), v.size()};
  return t.isend(peer, tag, std::span<const ConstPart>(&p, 1));
}
std::unique_ptr<Request> recv_bytes(Transport& t, int peer, uint64_t tag, std::vector<unsigned char>& v) {
  MutPart p{v.data(), v.size()};
  return t.irecv(peer, tag, std::span<const MutPart>(&p, 1));
}

const auto kTransports = bdata::make(transport_variants(available_transports()));
const auto kWorlds = bdata::make({2, 3, 4});

}  // namespace

BOOST_AUTO_TEST_SUITE(transport_conformance)

BOOST_DATA_TEST_CASE(ping_pong_returns_each_message_intact, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const int partner = r.rank ^ 1;
    if (partner >= r.size) return;
    for (int round = 0; round < 20; ++round) {
      const size_t bytes = size_t{1} << (round % 18);  // 1 B .. 128 KiB
      if (r.rank % 2 == 0) {
        auto out = payload(r.rank, partner, round, bytes);
        std::vector<unsigned char> back(bytes);
        auto rq = recv_bytes(r.t, partner, 7, back);
        auto sq = send_bytes(r.t, partner, 7, out);
        wait(r.t, *sq);
        wait(r.t, *rq);
        CHECK_RANK(rq->bytes() == bytes);
        CHECK_RANK(!rq->truncated());
        CHECK_RANK((back == payload(partner, r.rank, round, bytes)));
      } else {
        std::vector<unsigned char> in(bytes);
        auto rq = recv_bytes(r.t, partner, 7, in);
        wait(r.t, *rq);
        CHECK_RANK((in == payload(partner, r.rank, round, bytes)));
        auto out = payload(r.rank, partner, round, bytes);
        auto sq = send_bytes(r.t, partner, 7, out);
        wait(r.t, *sq);
      }
    }
  });
}

BOOST_DATA_TEST_CASE(all_to_all_delivers_every_pair_including_self, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const size_t bytes = 3000 + 17 * r.rank;  // sizes differ by sender
    std::vector<std::vector<unsigned char>> out(r.size), in(r.size);
    std::vector<std::unique_ptr<Request>> reqs;
    for (int p = 0; p < r.size; ++p) {
      in[p].resize(3000 + 17 * p);
      reqs.push_back(recv_bytes(r.t, p, 11, in[p]));
    }
    for (int p = 0; p < r.size; ++p) {
      out[p] = payload(r.rank, p, 0, bytes);
      reqs.push_back(send_bytes(r.t, p, 11, out[p]));
    }
    wait_all(r.t, reqs);
    for (int p = 0; p < r.size; ++p) {
      CHECK_RANK(reqs[p]->bytes() == in[p].size());
      CHECK_RANK((in[p] == payload(p, r.rank, 0, in[p].size())), "rank " << r.rank << " from " << p);
    }
  });
}

BOOST_DATA_TEST_CASE(many_tags_in_flight_match_by_tag, kTransports* kWorlds, name, n) {
  constexpr int kTags = 64;
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    std::vector<std::vector<unsigned char>> out(kTags), in(kTags);
    std::vector<std::unique_ptr<Request>> recvs(kTags), sends;
    for (int i = kTags - 1; i >= 0; --i) {  // posted in the reverse of the sending order
      in[i].resize(100 + i * 1000);
      recvs[i] = recv_bytes(r.t, prev, 1000 + i, in[i]);
    }
    for (int i = 0; i < kTags; ++i) {
      out[i] = payload(r.rank, next, i, 100 + i * 1000);
      sends.push_back(send_bytes(r.t, next, 1000 + i, out[i]));
    }
    wait_all(r.t, sends);
    for (int i = 0; i < kTags; ++i) {
      wait(r.t, *recvs[i]);
      CHECK_RANK((in[i] == payload(prev, r.rank, i, in[i].size())), "tag " << 1000 + i);
    }
  });
}

BOOST_DATA_TEST_CASE(messages_with_one_peer_and_tag_arrive_in_send_order, kTransports* kWorlds, name, n) {
  constexpr int kMessages = 40;
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    std::vector<std::vector<unsigned char>> out(kMessages);
    std::vector<std::unique_ptr<Request>> sends;
    // Alternate small (eager) and large (rendezvous on transports that have one) messages.
    for (int i = 0; i < kMessages; ++i) {
      out[i] = payload(r.rank, next, i, i % 2 ? 200000 : 64);
      sends.push_back(send_bytes(r.t, next, 5, out[i]));
    }
    r.sync.arrive_and_wait();  // the sends are queued before any receive is posted
    for (int i = 0; i < kMessages; ++i) {
      std::vector<unsigned char> in(200000);
      auto rq = recv_bytes(r.t, prev, 5, in);
      wait(r.t, *rq);
      const size_t expect = i % 2 ? 200000 : 64;
      CHECK_RANK(rq->bytes() == expect, "message " << i);
      in.resize(expect);
      CHECK_RANK((in == payload(prev, r.rank, i, expect)), "message " << i);
    }
    wait_all(r.t, sends);
  });
}

BOOST_DATA_TEST_CASE(a_later_tag_can_complete_before_an_earlier_one, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    auto a = payload(r.rank, next, 1, 5000), b = payload(r.rank, next, 2, 300000);
    auto sa = send_bytes(r.t, next, 100, a);
    auto sb = send_bytes(r.t, next, 200, b);
    std::vector<unsigned char> ib(300000), ia(5000);
    auto rb = recv_bytes(r.t, prev, 200, ib);
    wait(r.t, *rb);  // tag 200 completes while tag 100 has no receive posted
    CHECK_RANK((ib == payload(prev, r.rank, 2, ib.size())));
    auto ra = recv_bytes(r.t, prev, 100, ia);
    wait(r.t, *ra);
    CHECK_RANK((ia == payload(prev, r.rank, 1, ia.size())));
    wait(r.t, *sa);
    wait(r.t, *sb);
  });
}

BOOST_DATA_TEST_CASE(self_send_works_before_and_after_the_receive_is_posted, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    for (size_t bytes : {size_t{16}, size_t{1} << 20}) {
      auto out = payload(r.rank, r.rank, 3, bytes);
      std::vector<unsigned char> in1(bytes), in2(bytes);
      auto early = recv_bytes(r.t, r.rank, 9, in1);  // posted first
      auto s1 = send_bytes(r.t, r.rank, 9, out);
      auto s2 = send_bytes(r.t, r.rank, 9, out);     // sent first
      auto late = recv_bytes(r.t, r.rank, 9, in2);
      wait(r.t, *early);
      wait(r.t, *late);
      wait(r.t, *s1);
      wait(r.t, *s2);
      CHECK_RANK((in1 == out));
      CHECK_RANK((in2 == out));
    }
  });
}

BOOST_DATA_TEST_CASE(multi_part_messages_scatter_across_part_boundaries, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    // Send parts 1 + 0 + 1000 + 70000 bytes; receive into 3 parts with other boundaries.
    auto whole = payload(r.rank, next, 4, 71001);
    std::array<ConstPart, 4> sp{ConstPart{whole.data(), 1}, ConstPart{whole.data() + 1, 0},
                                ConstPart{whole.data() + 1, 1000}, ConstPart{whole.data() + 1001, 70000}};
    std::vector<unsigned char> a(40000), b(1), c(31000);
    std::array<MutPart, 3> rp{MutPart{a.data(), a.size()}, MutPart{b.data(), b.size()}, MutPart{c.data(), c.size()}};
    auto rq = r.t.irecv(prev, 21, rp);
    auto sq = r.t.isend(next, 21, sp);
    wait(r.t, *sq);
    wait(r.t, *rq);
    CHECK_RANK(rq->bytes() == 71001u);
    CHECK_RANK(!rq->truncated());
    std::vector<unsigned char> got(a);
    got.insert(got.end(), b.begin(), b.end());
    got.insert(got.end(), c.begin(), c.end());
    CHECK_RANK((got == payload(prev, r.rank, 4, 71001)));
  });
}

BOOST_DATA_TEST_CASE(a_short_receive_reports_truncation_and_keeps_the_prefix, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    for (size_t bytes : {size_t{1000}, size_t{500000}}) {
      auto out = payload(r.rank, next, 6, bytes);
      const size_t room = bytes * 6 / 10;
      std::vector<unsigned char> in(room + 64, 0xAB);  // the last 64 bytes are a canary
      MutPart p{in.data(), room};
      auto rq = r.t.irecv(prev, 33, std::span<const MutPart>(&p, 1));
      auto sq = send_bytes(r.t, next, 33, out);
      wait(r.t, *sq);
      wait(r.t, *rq);
      CHECK_RANK(rq->truncated());
      CHECK_RANK(rq->bytes() == bytes);
      const auto expect = payload(prev, r.rank, 6, bytes);
      CHECK_RANK(std::equal(in.begin(), in.begin() + room, expect.begin()));
      CHECK_RANK(std::all_of(in.begin() + room, in.end(), [](unsigned char c) { return c == 0xAB; }));
      // The next message with the same tag is unaffected.
      auto out2 = payload(r.rank, next, 7, 10);
      std::vector<unsigned char> in2(10);
      auto rq2 = recv_bytes(r.t, prev, 33, in2);
      auto sq2 = send_bytes(r.t, next, 33, out2);
      wait(r.t, *sq2);
      wait(r.t, *rq2);
      CHECK_RANK(!rq2->truncated());
      CHECK_RANK((in2 == payload(prev, r.rank, 7, 10)));
    }
  });
}

BOOST_DATA_TEST_CASE(zero_byte_messages_complete, kTransports* kWorlds, name, n) {
  run_ranks(name, n, [](Rank& r) {
    const int next = (r.rank + 1) % r.size, prev = (r.rank + r.size - 1) % r.size;
    // No parts at all, then one empty part; then a zero-capacity receive of a 5-byte message.
    auto s1 = r.t.isend(next, 40, {});
    ConstPart empty{nullptr, 0};
    auto s2 = r.t.isend(next, 40, std::span<const ConstPart>(&empty, 1));
    auto r1 = r.t.irecv(prev, 40, {});
    MutPart none{nullptr, 0};
    auto r2 = r.t.irecv(prev, 40, std::span<const MutPart>(&none, 1));
    std::vector<unsigned char> five = payload(r.rank, next, 0, 5);
    auto s3 = send_bytes(r.t, next, 41, five);
    auto r3 = r.t.irecv(prev, 41, {});
    for (auto* q : {&s1, &s2, &r1, &r2, &s3, &r3}) wait(r.t, **q);
    CHECK_RANK(r1->bytes() == 0u);
    CHECK_RANK(!r1->truncated());
    CHECK_RANK(r2->bytes() == 0u);
    CHECK_RANK(!r2->truncated());
    CHECK_RANK(r3->bytes() == 5u);
    CHECK_RANK(r3->truncated());
  });
}

BOOST_DATA_TEST_CASE(a_64_mib_message_arrives_intact, kTransports* bdata::make({2}), name, n) {
  run_ranks(name, n, [](Rank& r) {
    constexpr size_t kBytes = size_t{64} << 20;
    std::vector<uint64_t> buf(kBytes / 8);
    if (r.rank == 0) {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
      ConstPart p{buf.data(), kBytes};
      auto sq = r.t.isend(1, 77, std::span<const ConstPart>(&p, 1));
      wait(r.t, *sq);
    } else {
      MutPart p{buf.data(), kBytes};
      auto rq = r.t.irecv(0, 77, std::span<const MutPart>(&p, 1));
      wait(r.t, *rq);
      CHECK_RANK(rq->bytes() == kBytes);
      size_t wrong = 0;
      for (size_t i = 0; i < buf.size(); ++i) wrong += buf[i] != i * 0x9E3779B97F4A7C15ull;
      CHECK_RANK(wrong == 0u);
    }
  });
}

BOOST_DATA_TEST_CASE(dead_peers_lists_a_peer_that_closed_and_no_live_one, kTransports, name) {
  // Transport::dead_peers: nobody while all are up; once rank 0 destroys its transport, ranks 1 and 2 each list it
  // (within the wait's deadline) and only it -- not each other, although rank 2 stays silent, driving no progress,
  // for a while first (a live, slow rank is never listed).
  const VariantEnv env(name);
  MemoryStore store;
  const std::string prefix = unique_prefix(name + "-dead");
  std::barrier<> sync(3);
  std::vector<std::string> before(3), after(3), failure(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto t = create_transport(options_for(name, r, 3, store, prefix));
        sync.arrive_and_wait();
        before[r] = fmt::format("{}", fmt::join(t->dead_peers(), ","));
        sync.arrive_and_wait();
        if (r == 0) {
          t.reset();
          sync.arrive_and_wait();
          sync.arrive_and_wait();
          return;
        }
        sync.arrive_and_wait();  // rank 0 is gone
        if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        after[r] = fmt::format("{}", fmt::join(dead_peers_once_listed(*t, 0), ","));
        sync.arrive_and_wait();  // nobody closes before both have looked
      } catch (const std::exception& e) {
        failure[r] = e.what();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST_INFO("rank " << r);
    BOOST_TEST(failure[r].empty(), failure[r]);
    BOOST_TEST(before[r] == "");
    if (r > 0) BOOST_TEST(after[r] == "0");
  }
}

BOOST_DATA_TEST_CASE(a_receive_from_a_peer_that_closes_fails_naming_it, kTransports* kWorlds, name, n) {
  // Guarantee (transport.hpp): a receive pending on a peer whose transport is destroyed fails with
  // kPeerFailure naming that rank, and so does a later one; a message the peer finished sending
  // before is still delivered, even to a receive posted after the peer closed.
  const VariantEnv env(name);
  MemoryStore store;
  const std::string prefix = unique_prefix(name + "-close");
  std::barrier<> sync(n);
  std::vector<std::string> pending_error(n), later_error(n);
  std::vector<int> delivered(n, -1);
  std::vector<std::thread> threads;
  auto describe = [](Transport& t, Request& rq) -> std::string {
    try {
      return poll_for(t, rq, std::chrono::milliseconds(15000)) ? "completed without a message" : "still pending after 15 s";
    } catch (const Error& e) {
      return std::string(status_name(e.status())) + ": " + e.what();
    }
  };
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto t = create_transport(options_for(name, r, n, store, prefix));
        if (r == 0) {
          std::vector<std::vector<unsigned char>> last(n);
          for (int p = 1; p < n; ++p) {
            last[p] = payload(0, p, 9, 100);
            auto sq = send_bytes(*t, p, 3, last[p]);
            wait(*t, *sq);
          }
          sync.arrive_and_wait();  // the others have posted their receives of tag 4
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          t.reset();
          sync.arrive_and_wait();
          return;
        }
        std::vector<unsigned char> never(10);
        auto pending = recv_bytes(*t, 0, 4, never);
        sync.arrive_and_wait();
        pending_error[r] = describe(*t, *pending);
        sync.arrive_and_wait();  // rank 0 is gone
        std::vector<unsigned char> in(100);
        auto got = recv_bytes(*t, 0, 3, in);
        wait(*t, *got);
        delivered[r] = in == payload(0, r, 9, 100);
        auto later = recv_bytes(*t, 0, 4, never);
        later_error[r] = describe(*t, *later);
      } catch (const std::exception& e) {
        pending_error[r] = std::string("unexpected: ") + e.what();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 1; r < n; ++r) {
    BOOST_TEST_INFO("rank " << r << ": " << pending_error[r] << " / later: " << later_error[r]);
    BOOST_TEST(delivered[r] == 1);
    for (const auto* e : {&pending_error[r], &later_error[r]}) {
      BOOST_TEST(e->find(status_name(Status::kPeerFailure)) == 0);
      BOOST_TEST(e->find("rank 0") != std::string::npos);
    }
  }
}

BOOST_DATA_TEST_CASE(destruction_does_not_wait_for_sends_nobody_can_receive, kTransports* bdata::make({1, 2}), name, n) {
  // Large (rendezvous) sends to this rank itself and to a peer that already closed can never be
  // received: destroying the transport must drop them at once rather than wait out its flush
  // deadline (ucx waited its full 2 s and warned, on every single-rank or early-closing job).
  const VariantEnv env(name);
  MemoryStore store;
  const std::string prefix = unique_prefix(name + "-orphans");
  std::barrier<> sync(n);
  std::string error;
  long long destroy_ms = -1;
  std::vector<std::thread> threads;
  const std::vector<unsigned char> big = payload(0, 0, 1, 4 << 20);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto t = create_transport(options_for(name, r, n, store, prefix));
        if (r == 1) {
          sync.arrive_and_wait();
          t.reset();  // closes without receiving anything
          sync.arrive_and_wait();
          return;
        }
        std::vector<std::unique_ptr<Request>> sends;
        sends.push_back(send_bytes(*t, 0, 5, big));  // to itself, never received
        for (int i = 0; i < 20; ++i) t->progress();
        if (n == 2) {
          sync.arrive_and_wait();
          sync.arrive_and_wait();  // rank 1 is gone
          sends.push_back(send_bytes(*t, 1, 5, big));
          try {
            poll_for(*t, *sends.back(), std::chrono::milliseconds(300));
          } catch (const Error&) {  // a send to a closed peer may fail: that is the point
          }
        }
        const auto t0 = std::chrono::steady_clock::now();
        t.reset();
        destroy_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        for (auto& q : sends) {
          try {
            q->test();  // the requests outlive the transport: cancelled or failed, never a crash
          } catch (const Error&) {
          }
        }
      } catch (const std::exception& e) {
        error = e.what();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& th : threads) th.join();
  BOOST_TEST(error.empty(), error);
  BOOST_TEST(destroy_ms >= 0);
  BOOST_TEST(destroy_ms < 1000, name << " with " << n << " ranks took " << destroy_ms << " ms to destroy");
}

BOOST_DATA_TEST_CASE(a_long_wait_leaves_the_cpu_to_others, kTransports* bdata::make({2}), name, n) {
  // A rank whose receive stays pending for a long time (a pipeline stage waiting for activations)
  // must not keep a core busy polling: over a 400 ms wait its thread uses well under a third of
  // the wall time (a poll-and-yield loop uses all of it on a quiet machine), and the message still
  // arrives.
  run_ranks(name, n, [](Rank& r) {
    const int peer = 1 - r.rank;
    auto out = payload(r.rank, peer, 0, 1000);
    std::vector<unsigned char> in(out.size());
    auto rq = recv_bytes(r.t, peer, 11, in);
    r.sync.arrive_and_wait();
    if (r.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      auto sq = send_bytes(r.t, peer, 11, out);
      wait(r.t, *sq);
      wait(r.t, *rq);
      return;
    }
    auto thread_cpu = [] {
      rusage u{};
      getrusage(RUSAGE_THREAD, &u);
      return std::chrono::microseconds(u.ru_utime.tv_sec * 1000000 + u.ru_utime.tv_usec + u.ru_stime.tv_sec * 1000000 +
                                       u.ru_stime.tv_usec);
    };
    const auto cpu0 = thread_cpu();
    const auto t0 = std::chrono::steady_clock::now();
    while (!rq->test()) r.t.wait_for_progress(std::chrono::milliseconds(1));
    const auto wall = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    const auto cpu = thread_cpu() - cpu0;
    CHECK_RANK(in == payload(peer, r.rank, 0, in.size()), "wrong data");
    CHECK_RANK(wall > std::chrono::milliseconds(300), "the message came early: " << wall.count() << " us");
    CHECK_RANK(cpu * 3 < wall, "the waiting thread used " << cpu.count() << " us of CPU in " << wall.count() << " us");
    auto sq = send_bytes(r.t, peer, 11, out);
    wait(r.t, *sq);
  });
}

BOOST_DATA_TEST_CASE(wait_for_progress_wakes_when_a_message_arrives, kTransports* bdata::make({2}), name, n) {
  // Waits with a long timeout: a wake-up the transport forgets shows as a wait of the full 500 ms
  // (a message that is already there must not cost a wait at all).
  run_ranks(name, n, [](Rank& r) {
    const int peer = 1 - r.rank;
    std::chrono::milliseconds longest{0};
    for (int round = 0; round < 20; ++round) {
      const size_t bytes = round % 2 ? 200000 : 64;
      auto out = payload(r.rank, peer, round, bytes);
      std::vector<unsigned char> in(bytes);
      auto rq = recv_bytes(r.t, peer, 8, in);
      if (r.rank == 1) {
        auto sq = send_bytes(r.t, peer, 8, out);
        for (auto* q : {&rq, &sq}) {
          while (!(*q)->test()) {
            const auto t0 = std::chrono::steady_clock::now();
            r.t.wait_for_progress(std::chrono::milliseconds(500));
            longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0));
          }
        }
      } else {
        while (!rq->test()) {
          const auto t0 = std::chrono::steady_clock::now();
          r.t.wait_for_progress(std::chrono::milliseconds(500));
          longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0));
        }
        auto sq = send_bytes(r.t, peer, 8, out);
        wait(r.t, *sq);
      }
      CHECK_RANK(in == payload(peer, r.rank, round, bytes), "round " << round);
    }
    CHECK_RANK(longest < std::chrono::milliseconds(400), "a wait took " << longest.count() << " ms");
  });
}

BOOST_AUTO_TEST_CASE(an_unknown_transport_name_lists_the_known_ones) {
  MemoryStore store;
  try {
    create_transport(options_for("carrier-pigeon", 0, 1, store, unique_prefix("unknown")));
    BOOST_FAIL("create_transport accepted an unknown name");
  } catch (const Error& e) {
    // Unsupported, as tandem.h documents for tandem_comm_create (issue #17).
    BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(Status::kUnsupported));
    const std::string msg = e.what();
    BOOST_TEST(msg.find("carrier-pigeon") != std::string::npos);
    for (const auto& known : available_transports()) BOOST_TEST(msg.find(known) != std::string::npos, msg);
  }
}

BOOST_AUTO_TEST_CASE(available_transports_always_include_inproc_and_zmq) {
  auto names = available_transports();
  BOOST_TEST((std::find(names.begin(), names.end(), "inproc") != names.end()));
}

BOOST_AUTO_TEST_SUITE_END()
