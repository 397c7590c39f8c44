// Communicators over every built transport, ranks as threads: every collective, dtype, op and
// allreduce algorithm against values computed here; in place; deterministic mode; non-blocking
// overlap; point-to-point with tags; split.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdlib>
#include <random>

#include "engine/comm/comm_options_env.hpp"
#include "tests/comm/comm_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using engine::comm::Algorithm;
using engine::comm::algorithm_name;

namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};

// Small integers, exact in every dtype; products stay small.
double value(int rank, size_t i, ReduceOp op) {
  return op == ReduceOp::kProd ? 1.0 + static_cast<double>((rank + i) % 2) : 1.0 + static_cast<double>((3 * rank + i) % 5);
}

double expected(DType t, ReduceOp op, int n, size_t i, size_t offset = 0) {
  double acc = value(0, i + offset, op);
  for (int r = 1; r < n; ++r) {
    const double v = value(r, i + offset, op);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::kAvg ? avg_of(t, acc, n) : acc;
}

std::vector<unsigned char> filled(DType t, int rank, size_t count, ReduceOp op, size_t offset = 0) {
  std::vector<unsigned char> buf(std::max<size_t>(count * dtype_size(t), 1));
  for (size_t i = 0; i < count; ++i) encode(t, buf.data(), i, value(rank, i + offset, op));
  return buf;
}

std::string name_of(DType t, ReduceOp op) { return fmt::format("{}/{}", dtype_name(t), reduce_op_name(op)); }

// Checks out[0..count) against the reduction of every rank's elements offset..offset+count.
void check_reduced(const std::vector<unsigned char>& out, DType t, ReduceOp op, int n, size_t count, size_t offset,
                   const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const double got = decode(t, out.data(), i), want = expected(t, op, n, i, offset);
    EXPECT(got == want, "{} {}: element {} is {}, expected {}", what, name_of(t, op), i, got, want);
  }
}

CommOptions with_algorithm(Algorithm a) {
  CommOptions o;
  o.allreduce_algorithm = a;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE(allreduce_every_dtype_op_and_algorithm) {
  for (const auto& tr : transports_under_test())
    for (int n : {2, 3})
      for (Algorithm algo : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                             Algorithm::kHierarchical, Algorithm::kDeterministic}) {
        BOOST_TEST_CONTEXT(tr << " world " << n << " " << algorithm_name(algo)) {
          run_ranks_on(tr, n, with_algorithm(algo), [](int r) { return fmt::format("host{}", r / 2); },
                       [&](int r, Communicator& c) {
                         if (algo != Algorithm::kAuto) EXPECT(c.allreduce_algorithm_for(1000, DType::kF32) == algo, "");
                         for (DType t : kDTypes)
                           for (ReduceOp op : kOps)
                             for (size_t count : {size_t{0}, size_t{1}, size_t{1000}}) {
                               auto in = filled(t, r, count, op);
                               std::vector<unsigned char> out(in.size(), 0xee);
                               c.allreduce(in.data(), out.data(), count, t, op)->wait();
                               check_reduced(out, t, op, n, count, 0, fmt::format("allreduce({})", count));
                               // In place.
                               c.allreduce(in.data(), in.data(), count, t, op)->wait();
                               check_reduced(in, t, op, n, count, 0, fmt::format("in-place allreduce({})", count));
                             }
                       });
        }
      }
}

BOOST_AUTO_TEST_CASE(large_allreduce_pipelines_many_chunks) {
  // 300,001 floats with 16 KiB chunks: dozens of chunks per segment in flight.
  for (const auto& tr : transports_under_test())
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kHierarchical,
                           Algorithm::kDeterministic, Algorithm::kTree}) {
      CommOptions o = with_algorithm(algo);
      o.chunk_bytes = 16 * 1024;
      BOOST_TEST_CONTEXT(tr << " " << algorithm_name(algo)) {
        run_ranks_on(tr, 3, o, [](int r) { return fmt::format("host{}", r / 2); }, [&](int r, Communicator& c) {
          const size_t count = 300001;
          auto in = filled(DType::kF32, r, count, ReduceOp::kSum);
          std::vector<unsigned char> out(in.size());
          c.allreduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum)->wait();
          check_reduced(out, DType::kF32, ReduceOp::kSum, 3, count, 0, "allreduce");
          c.allreduce(in.data(), in.data(), count, DType::kF32, ReduceOp::kMax)->wait();
          check_reduced(in, DType::kF32, ReduceOp::kMax, 3, count, 0, "in-place allreduce");
        });
      }
    }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_allgather_broadcast_reduce_barrier) {
  for (const auto& tr : transports_under_test())
    for (int n : {1, 2, 3, 4})
      for (bool det : {false, true}) {
        CommOptions o;
        o.deterministic = det;
        o.timeout = std::chrono::milliseconds(20000);
        BOOST_TEST_CONTEXT(tr << " world " << n << (det ? " deterministic" : "")) {
          run_ranks(tr, n, o, [&](int r, Communicator& c) {
            for (DType t : {DType::kF32, DType::kI64, DType::kBF16})
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
                for (size_t per : {size_t{0}, size_t{1}, size_t{333}}) {
                  const size_t es = dtype_size(t);
                  // reduce-scatter: rank r gets elements [r*per, (r+1)*per) reduced.
                  auto in = filled(t, r, per * n, op);
                  std::vector<unsigned char> out(std::max<size_t>(per * es, 1));
                  c.reduce_scatter(in.data(), out.data(), per, t, op)->wait();
                  check_reduced(out, t, op, n, per, r * per, "reduce_scatter");
                  // In place: the output is the rank's own block of the input.
                  c.reduce_scatter(in.data(), in.data() + r * per * es, per, t, op)->wait();
                  std::vector<unsigned char> block(in.begin() + static_cast<long>(r * per * es), in.end());
                  check_reduced(block, t, op, n, per, r * per, "in-place reduce_scatter");
                  // reduce at every root, also in place at the root.
                  for (int root = 0; root < n; ++root) {
                    auto rin = filled(t, r, per, op);
                    std::vector<unsigned char> rout(rin.size(), 0);
                    c.reduce(rin.data(), r == root ? rout.data() : nullptr, per, t, op, root)->wait();
                    if (r == root) check_reduced(rout, t, op, n, per, 0, fmt::format("reduce(root {})", root));
                    c.reduce(rin.data(), rin.data(), per, t, op, root)->wait();
                    if (r == root) check_reduced(rin, t, op, n, per, 0, fmt::format("in-place reduce(root {})", root));
                  }
                }
            for (size_t per : {size_t{0}, size_t{1}, size_t{1000}}) {
              // allgather, out of place and in place (input = output + rank * per).
              auto mine = filled(DType::kI32, r, per, ReduceOp::kSum);
              std::vector<unsigned char> all(std::max<size_t>(per * n * 4, 1));
              c.allgather(mine.data(), all.data(), per, DType::kI32)->wait();
              std::vector<unsigned char> all2(all.size());
              std::memcpy(all2.data() + r * per * 4, mine.data(), per * 4);
              c.allgather(all2.data() + r * per * 4, all2.data(), per, DType::kI32)->wait();
              for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < per; ++i) {
                  EXPECT(decode(DType::kI32, all.data(), q * per + i) == value(q, i, ReduceOp::kSum),
                         "allgather block {} element {}", q, i);
                  EXPECT(decode(DType::kI32, all2.data(), q * per + i) == value(q, i, ReduceOp::kSum),
                         "in-place allgather block {} element {}", q, i);
                }
              // broadcast from every root.
              for (int root = 0; root < n; ++root) {
                auto buf = r == root ? filled(DType::kF64, root, per, ReduceOp::kSum)
                                     : std::vector<unsigned char>(std::max<size_t>(per * 8, 1), 0);
                c.broadcast(buf.data(), per, DType::kF64, root)->wait();
                for (size_t i = 0; i < per; ++i)
                  EXPECT(decode(DType::kF64, buf.data(), i) == value(root, i, ReduceOp::kSum),
                         "broadcast root {} element {}", root, i);
              }
              c.barrier()->wait();
            }
          });
        }
      }
}

BOOST_AUTO_TEST_CASE(deterministic_mode_is_bit_identical_across_algorithms) {
  // Floats of wildly different magnitudes: any other association order changes the bits. With
  // deterministic mode on, every algorithm setting gives the rank-order fold ((x0 + x1) + x2) + ...
  for (const auto& tr : transports_under_test())
    for (int n = 2; n <= 5; ++n) {
      const size_t count = 4099;
      std::vector<std::vector<float>> data(n, std::vector<float>(count));
      std::mt19937 rng(1234 + n);
      std::uniform_real_distribution<float> mant(-1.f, 1.f);
      std::uniform_int_distribution<int> expo(-20, 20);
      for (auto& v : data)
        for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
      std::vector<float> fold(count);
      for (size_t i = 0; i < count; ++i) {
        float acc = data[0][i];
        for (int r = 1; r < n; ++r) acc += data[r][i];
        fold[i] = acc;
      }
      for (Algorithm algo : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                             Algorithm::kHierarchical}) {
        CommOptions o = with_algorithm(algo);
        o.deterministic = true;
        o.chunk_bytes = 4096;
        BOOST_TEST_CONTEXT(tr << " world " << n << " " << algorithm_name(algo)) {
          run_ranks_on(tr, n, o, [](int r) { return fmt::format("host{}", r / 2); }, [&](int r, Communicator& c) {
            EXPECT(c.allreduce_algorithm_for(count, DType::kF32) == Algorithm::kDeterministic, "");
            std::vector<float> out(count);
            c.allreduce(data[r].data(), out.data(), count, DType::kF32, ReduceOp::kSum)->wait();
            EXPECT(std::memcmp(out.data(), fold.data(), count * 4) == 0, "allreduce differs from the rank-order fold");
            std::vector<float> root_out(count);
            c.reduce(data[r].data(), root_out.data(), count, DType::kF32, ReduceOp::kSum, n - 1)->wait();
            if (r == n - 1)
              EXPECT(std::memcmp(root_out.data(), fold.data(), count * 4) == 0, "reduce differs from the fold");
          });
        }
      }
    }
}

BOOST_AUTO_TEST_CASE(non_blocking_operations_overlap) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_algorithm(Algorithm::kAuto), [&](int r, Communicator& c) {
      const size_t count = 200000;
      auto a = filled(DType::kF32, r, count, ReduceOp::kSum);
      auto b = filled(DType::kI64, r, count, ReduceOp::kMax);
      std::vector<unsigned char> ao(a.size()), bo(b.size());
      auto wa = c.allreduce(a.data(), ao.data(), count, DType::kF32, ReduceOp::kSum);
      auto wb = c.allreduce(b.data(), bo.data(), count, DType::kI64, ReduceOp::kMax);
      // The caller keeps computing while both run; test() polls without blocking.
      double busy = 0;
      while (!wa->test()) busy += std::sqrt(busy + 1.0);
      wb->wait();
      wa->wait();
      check_reduced(ao, DType::kF32, ReduceOp::kSum, 3, count, 0, "first");
      check_reduced(bo, DType::kI64, ReduceOp::kMax, 3, count, 0, "second");
    });
  }
}

BOOST_AUTO_TEST_CASE(point_to_point_matches_by_tag) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 3, with_algorithm(Algorithm::kAuto), [&](int r, Communicator& c) {
      // Ring: each rank sends two tagged messages right; the receiver takes them in the other order.
      const int right = (r + 1) % 3, left = (r + 2) % 3;
      std::vector<int32_t> s1(100, r * 10 + 1), s2(50000, r * 10 + 2), r1(100), r2(50000);
      auto w1 = c.send(s1.data(), s1.size(), DType::kI32, right, 7);
      auto w2 = c.send(s2.data(), s2.size(), DType::kI32, right, 9);
      auto v2 = c.recv(r2.data(), r2.size(), DType::kI32, left, 9);
      auto v1 = c.recv(r1.data(), r1.size(), DType::kI32, left, 7);
      // A collective may run while point-to-point operations are in flight.
      int32_t x = 1, sum = 0;
      c.allreduce(&x, &sum, 1, DType::kI32, ReduceOp::kSum)->wait();
      EXPECT(sum == 3, "allreduce between point-to-point operations gave {}", sum);
      v1->wait();
      v2->wait();
      w1->wait();
      w2->wait();
      EXPECT(r1[0] == left * 10 + 1 && r1[99] == left * 10 + 1, "tag 7 payload {}", r1[0]);
      EXPECT(r2[0] == left * 10 + 2 && r2[49999] == left * 10 + 2, "tag 9 payload {}", r2[0]);
      // Zero-length and self messages.
      auto ws = c.send(nullptr, 0, DType::kF32, r, 3);
      c.recv(nullptr, 0, DType::kF32, r, 3)->wait();
      ws->wait();
    });
  }
}

// Issue #17: a blocking send completes without waiting for the matching receive on every transport, at every size
// (a ring of send-then-receive worked on tcp and zmq but deadlocked on ucx from 32 KiB up), and its buffer may be
// reused as soon as it returns.
BOOST_AUTO_TEST_CASE(a_ring_of_blocking_sends_then_receives_completes_on_every_transport) {
  for (const auto& tr : transports_under_test()) {
    CommOptions o;
    o.timeout = std::chrono::milliseconds(5000);
    run_ranks(tr, 3, o, [&](int r, Communicator& c) {
      const int right = (r + 1) % 3, left = (r + 2) % 3;
      for (const size_t bytes : {size_t{1024}, size_t{32} << 10, size_t{64} << 10, size_t{4} << 20}) {
        const size_t n = bytes / sizeof(int32_t);
        std::vector<int32_t> out(n, r + 1), in(n, -1);
        const auto t0 = std::chrono::steady_clock::now();
        c.send(out.data(), n, DType::kI32, right, 5)->wait();
        std::fill(out.begin(), out.end(), -7);  // reused at once: the message already left with the old data
        c.recv(in.data(), n, DType::kI32, left, 5)->wait();
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        EXPECT(in[0] == left + 1 && in[n - 1] == left + 1, "{} bytes: received {} .. {}", bytes, in[0], in[n - 1]);
        EXPECT(ms < 3000, "{} bytes took {} ms", bytes, ms);
      }
      c.barrier()->wait();
    });
  }
}

// A buffered send has completed for its caller, so it must reach a live peer even when the sender destroys its
// communicator before the peer posts the receive (a CI run of FedAvg lost its last reply this way on inproc:
// the closing transport cancelled the rendezvous-sized message instead of keeping it deliverable).
BOOST_AUTO_TEST_CASE(a_buffered_send_reaches_a_peer_that_receives_after_the_sender_is_gone) {
  for (const auto& tr : transports_under_test()) {
    const transports::testing::VariantEnv env(tr);
    auto store = std::make_shared<transports::MemoryStore>();
    CommOptions o;
    o.transport = transports::testing::transport_name(tr);
    o.timeout = std::chrono::milliseconds(5000);
    std::atomic<bool> destroying{false}, sender_gone{false};
    std::string errors[2];
    const size_t n = (size_t{1} << 20) / sizeof(int32_t);  // far above every eager limit
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        try {
          BootstrapInfo info;
          info.rank = r;
          info.size = 2;
          info.host = "localhost";
          auto c = Communicator::create(info, store, o);
          c->barrier()->wait();
          if (r == 0) {
            std::vector<int32_t> big(n);
            for (size_t i = 0; i < n; ++i) big[i] = static_cast<int32_t>(i * 7 + 1);
            const int32_t small = 42;
            c->send(big.data(), n, DType::kI32, 1, 9)->wait();
            c->send(&small, 1, DType::kI32, 1, 10)->wait();
            destroying = true;
            c.reset();  // the sender's communicator and transport go before the peer receives
            sender_gone = true;
            return;
          }
          // ucx's rendezvous needs the sender's worker to pack the data: its shutdown holds (up to 2 s) until the
          // peer receives, so there the receive comes 200 ms into it. Every other transport delivers after the sender
          // is gone.
          const bool hold = o.transport == "ucx";
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!(hold ? destroying.load() : sender_gone.load()) && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          EXPECT(destroying.load(), "rank 0 did not start to destroy its communicator within 10 s");
          EXPECT(hold || sender_gone.load(), "rank 0 did not destroy its communicator within 10 s");
          if (hold) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::vector<int32_t> in(n, -1);
          int32_t small = -1;
          c->recv(in.data(), n, DType::kI32, 0, 9)->wait();
          c->recv(&small, 1, DType::kI32, 0, 10)->wait();
          for (size_t i = 0; i < n; i += 4099)
            EXPECT(in[i] == static_cast<int32_t>(i * 7 + 1), "element {}: {}", i, in[i]);
          EXPECT(in[n - 1] == static_cast<int32_t>((n - 1) * 7 + 1), "last element {}", in[n - 1]);
          EXPECT(small == 42, "small message {}", small);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) BOOST_TEST(errors[r].empty(), tr << " rank " << r << ": " << errors[r]);
  }
}

BOOST_AUTO_TEST_CASE(split_into_even_and_odd_groups) {
  for (const auto& tr : transports_under_test()) {
    run_ranks(tr, 5, with_algorithm(Algorithm::kAuto), [&](int r, Communicator& c) {
      // key = -r: ranks within a group are ordered by descending old rank.
      auto child = c.split(r % 2, -r);
      const int group_size = r % 2 == 0 ? 3 : 2;
      EXPECT(child != nullptr, "no child communicator");
      EXPECT(child->size() == group_size, "child size {}", child->size());
      std::vector<int> members;
      for (int q = 4; q >= 0; --q)
        if (q % 2 == r % 2) members.push_back(q);
      const int expect_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
      EXPECT(child->rank() == expect_rank, "child rank {} expected {}", child->rank(), expect_rank);
      int64_t mine = 1 << r, sum = 0;
      child->allreduce(&mine, &sum, 1, DType::kI64, ReduceOp::kSum)->wait();
      const int64_t want = r % 2 == 0 ? (1 + 4 + 16) : (2 + 8);
      EXPECT(sum == want, "group sum {} expected {}", sum, want);
      // Collectives on parent and child interleave; the child's broadcast root is its rank 0.
      int64_t world_sum = 0;
      auto wp = c.allreduce(&mine, &world_sum, 1, DType::kI64, ReduceOp::kSum);
      int64_t b = child->rank() == 0 ? 100 + r : -1;
      child->broadcast(&b, 1, DType::kI64, 0)->wait();
      wp->wait();
      EXPECT(world_sum == 31, "world sum {}", world_sum);
      EXPECT(b == 100 + members[0], "child broadcast gave {}", b);
      // Point-to-point inside the child uses child ranks.
      if (group_size == 2) {
        int32_t v = r, got = -1;
        auto s = child->send(&v, 1, DType::kI32, 1 - child->rank(), 5);
        child->recv(&got, 1, DType::kI32, 1 - child->rank(), 5)->wait();
        s->wait();
        EXPECT(got == members[1 - child->rank()], "child p2p gave {}", got);
      }
      // Nested split, and a rank that opts out (color -1).
      auto grand = child->split(child->rank() == 0 ? -1 : 0, 0);
      EXPECT((grand == nullptr) == (child->rank() == 0), "color -1 must give no communicator");
      if (grand) {
        int32_t one = 1, n = 0;
        grand->allreduce(&one, &n, 1, DType::kI32, ReduceOp::kSum)->wait();
        EXPECT(n == group_size - 1, "grandchild size {}", n);
      }
      c.barrier()->wait();
    });
  }
}

BOOST_AUTO_TEST_CASE(environment_overrides_only_defaults) {
  setenv("TANDEM_TIMEOUT_MS", "1234", 1);
  setenv("TANDEM_ALLREDUCE_ALGO", "tree", 1);
  setenv("TANDEM_DETERMINISTIC", "1", 1);
  const auto from_env = engine::comm::comm_options_from_env(CommOptions{});
  BOOST_TEST(from_env.timeout.count() == 1234);
  BOOST_TEST((from_env.allreduce_algorithm == Algorithm::kTree));
  BOOST_TEST(from_env.deterministic);
  CommOptions set;
  set.timeout = std::chrono::milliseconds(77);
  set.allreduce_algorithm = Algorithm::kRing;
  const auto kept = engine::comm::comm_options_from_env(set);
  BOOST_TEST(kept.timeout.count() == 77);
  BOOST_TEST((kept.allreduce_algorithm == Algorithm::kRing));
  setenv("TANDEM_TIMEOUT_MS", "soon", 1);
  std::string msg;
  BOOST_TEST((status_of([] { engine::comm::comm_options_from_env(CommOptions{}); }, &msg) == Status::kInvalidArgument));
  BOOST_TEST(msg.find("TANDEM_TIMEOUT_MS") != std::string::npos);
  unsetenv("TANDEM_TIMEOUT_MS");
  unsetenv("TANDEM_ALLREDUCE_ALGO");
  unsetenv("TANDEM_DETERMINISTIC");
}

BOOST_AUTO_TEST_SUITE_END()
