// Plans checked without a transport: each plan runs in the in-memory interpreter and the results are
// compared with what the collective must compute, for every algorithm, world sizes 1..9, counts
// including 0, 1 and sizes that do not divide evenly, chunked and unchunked, in place and not.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/comm/executor.hpp"
#include "engine/comm/plan.hpp"
#include "engine/core/error.hpp"
#include "tests/comm/plan_interpreter.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using tandem::testing::interpret;
using tandem::testing::make_memory;
using tandem::testing::RankMemory;

namespace {

const std::vector<uint64_t> kCounts = {0, 1, 5, 13, 97, 1000};
// 24 bytes = 3 i64 elements per chunk forces many chunks; 0 takes the default (no chunking here).
const std::vector<uint64_t> kChunks = {0, 24};

int64_t value(int rank, uint64_t i) { return static_cast<int64_t>(rank + 1) * 1000003 + static_cast<int64_t>(i * 7 % 101); }

template <typename T>
T* at(RankMemory& m, Buffer b) {
  return reinterpret_cast<T*>(m.arena.data() + m.base[static_cast<int>(b)]);
}

std::string label(const PlanRequest& r) {
  return fmt::format("{} {} world={} count={} chunk={} root={} in_place={}", collective_name(r.collective),
                     algorithm_name(r.algorithm), r.world, r.count, r.chunk_bytes, r.root, r.in_place);
}

// Builds, validates and runs an i64 sum plan; inputs are value(rank, i) laid out as the collective expects.
std::vector<RankMemory> run_i64(const PlanRequest& req, Plan* out_plan = nullptr) {
  Plan plan = make_plan(req);
  BOOST_TEST_CONTEXT(label(req) << " -> " << plan.describe()) {
    validate_plan(plan);
  }
  std::vector<RankMemory> mem;
  for (int r = 0; r < req.world; ++r) {
    mem.push_back(make_memory(plan, r, 8));
    // Garbage in the output first, so a plan that forgets to write a result is caught.
    const uint64_t out_n = plan_buffer_count(plan, Buffer::kOutput, r);
    for (uint64_t i = 0; i < out_n; ++i) at<int64_t>(mem[r], Buffer::kOutput)[i] = -777;
    const uint64_t in_n = plan_buffer_count(plan, Buffer::kInput, r);
    int64_t* in = req.collective == Collective::kBroadcast ? at<int64_t>(mem[r], Buffer::kOutput)
                                                           : at<int64_t>(mem[r], Buffer::kInput);
    const uint64_t fill = req.collective == Collective::kBroadcast ? (r == req.root ? out_n : 0) : in_n;
    for (uint64_t i = 0; i < fill; ++i) in[i] = value(r, i);
  }
  interpret(plan, mem, DType::kI64, ReduceOp::kSum);
  if (out_plan) *out_plan = plan;
  return mem;
}

int64_t sum_over_ranks(int n, uint64_t i) {
  int64_t s = 0;
  for (int r = 0; r < n; ++r) s += value(r, i);
  return s;
}

std::vector<Topology> topologies(int n) {
  std::vector<Topology> t(4);
  for (int r = 0; r < n; ++r) {
    t[1].host_of.push_back(r / 2);
    t[2].host_of.push_back(r / 3);
    t[3].host_of.push_back(r < 3 ? 0 : (r < 4 ? 1 : 2));  // uneven hosts: 3, 1, rest
  }
  return t;
}

// For each rank of `plan` (world <= 64), the ranks it has heard from when its last op completes: a bit mask,
// following nothing but what orders ops when an executor runs the plan -- the dependencies compile_plan finds
// (the runtime's and the simulator's one analysis) and a receive completing after its sender posted the
// matching send (the k-th send from a to b is the k-th receive on b from a). Every op starts after its rank
// entered the collective, so a rank's own bit is in all of them.
std::vector<uint64_t> heard_on_leaving(const Plan& plan) {
  const int n = plan.world;
  BOOST_REQUIRE(n <= 64);
  std::vector<std::shared_ptr<const CompiledPlan>> cp;
  std::vector<std::vector<std::vector<uint32_t>>> preds(n);
  std::vector<std::vector<std::pair<int, uint32_t>>> sender(n);  // receive -> (rank, send op)
  for (int r = 0; r < n; ++r) {
    cp.push_back(compile_plan(plan, r));
    preds[r].resize(cp[r]->ops.size());
    sender[r].resize(cp[r]->ops.size(), {-1, 0});
    for (uint32_t i = 0; i < cp[r]->ops.size(); ++i)
      for (uint32_t k = cp[r]->ops[i].succ_begin; k < cp[r]->ops[i].succ_end; ++k) preds[r][cp[r]->succs[k]].push_back(i);
  }
  for (int a = 0; a < n; ++a)
    for (const PeerQueue& q : cp[a]->queues)
      for (const PeerQueue& back : cp[q.peer]->queues)
        if (back.peer == a) {
          BOOST_REQUIRE(q.sends.size() == back.recvs.size());
          for (size_t k = 0; k < q.sends.size(); ++k) sender[q.peer][back.recvs[k]] = {a, q.sends[k]};
        }
  std::vector<std::vector<uint64_t>> heard(n);
  for (int r = 0; r < n; ++r) heard[r].assign(cp[r]->ops.size(), uint64_t{1} << r);
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < n; ++r)
      for (uint32_t i = 0; i < cp[r]->ops.size(); ++i) {
        uint64_t h = heard[r][i];
        for (uint32_t p : preds[r][i]) h |= heard[r][p];
        if (sender[r][i].first >= 0) h |= heard[sender[r][i].first][sender[r][i].second];
        if (h != heard[r][i]) heard[r][i] = h, changed = true;
      }
  }
  std::vector<uint64_t> out(n);
  for (int r = 0; r < n; ++r) {
    out[r] = uint64_t{1} << r;
    for (uint64_t h : heard[r]) out[r] |= h;
  }
  return out;
}

uint64_t all_ranks(int n) { return n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

BOOST_AUTO_TEST_SUITE(plans)

BOOST_AUTO_TEST_CASE(allreduce_every_algorithm_sums_exactly) {
  for (Algorithm algo : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                         Algorithm::kHierarchical, Algorithm::kDeterministic})
    for (int n = 1; n <= 9; ++n)
      for (uint64_t count : kCounts)
        for (uint64_t chunk : kChunks)
          for (bool in_place : {false, true}) {
            auto topos = algo == Algorithm::kHierarchical ? topologies(n) : std::vector<Topology>{Topology{}};
            for (const Topology& topo : topos) {
              PlanRequest req{Collective::kAllreduce, algo, n, 0, count, 8, chunk, topo};
              req.in_place = in_place;
              auto mem = run_i64(req);
              for (int r = 0; r < n; ++r)
                for (uint64_t i = 0; i < count; ++i)
                  if (at<int64_t>(mem[r], Buffer::kOutput)[i] != sum_over_ranks(n, i)) {
                    BOOST_ERROR(label(req) << ": rank " << r << " element " << i << " = "
                                           << at<int64_t>(mem[r], Buffer::kOutput)[i] << ", expected "
                                           << sum_over_ranks(n, i));
                    return;
                  }
            }
          }
}

BOOST_AUTO_TEST_CASE(allreduce_large_buffers_pipeline_in_default_chunks) {
  // 300,007 i64 elements = 2.3 MiB: several default (512 KiB) chunks per ring segment.
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kHierarchical,
                         Algorithm::kDeterministic})
    for (int n : {2, 3, 5}) {
      PlanRequest req{Collective::kAllreduce, algo, n, 0, 300007, 8, 0, topologies(n)[1]};
      Plan plan;
      auto mem = run_i64(req, &plan);
      BOOST_TEST(plan.chunk_count == kDefaultChunkBytes / 8);
      if (algo == Algorithm::kRing && n <= 3)  // segments of more than one chunk
        BOOST_TEST(plan.message_count() > static_cast<uint64_t>(2 * n * (n - 1)));
      for (int r = 0; r < n; ++r)
        for (uint64_t i = 0; i < req.count; i += 997)
          BOOST_REQUIRE_EQUAL(at<int64_t>(mem[r], Buffer::kOutput)[i], sum_over_ranks(n, i));
    }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_gives_each_rank_its_segment) {
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kDeterministic})
    for (int n = 1; n <= 9; ++n)
      for (uint64_t per : {0, 1, 5, 97})
        for (uint64_t chunk : kChunks)
          for (bool in_place : {false, true}) {
            PlanRequest req{Collective::kReduceScatter, algo, n, 0, per * static_cast<uint64_t>(n), 8, chunk, {}};
            req.in_place = in_place;
            auto mem = run_i64(req);
            for (int r = 0; r < n; ++r)
              for (uint64_t i = 0; i < per; ++i)
                BOOST_REQUIRE_MESSAGE(at<int64_t>(mem[r], Buffer::kOutput)[i] == sum_over_ranks(n, r * per + i),
                                      label(req) << ": rank " << r << " element " << i);
          }
}

BOOST_AUTO_TEST_CASE(allgather_concatenates_in_rank_order) {
  for (int n = 1; n <= 9; ++n)
    for (uint64_t per : {0, 1, 5, 97})
      for (uint64_t chunk : kChunks)
        for (bool in_place : {false, true}) {
          PlanRequest req{Collective::kAllgather, Algorithm::kAuto, n, 0, per * static_cast<uint64_t>(n), 8, chunk, {}};
          req.in_place = in_place;
          // The interpreter fills input[i] = value(rank, i); in place that input sits at output + rank*per.
          auto mem = run_i64(req);
          for (int r = 0; r < n; ++r)
            for (int q = 0; q < n; ++q)
              for (uint64_t i = 0; i < per; ++i)
                BOOST_REQUIRE_MESSAGE(at<int64_t>(mem[r], Buffer::kOutput)[q * per + i] == value(q, i),
                                      label(req) << ": rank " << r << " block " << q << " element " << i);
        }
}

BOOST_AUTO_TEST_CASE(broadcast_copies_the_root_buffer_everywhere) {
  for (Algorithm algo : {Algorithm::kAuto, Algorithm::kTree, Algorithm::kRing})
    for (int n = 1; n <= 9; ++n)
      for (int root : {0, n - 1, n / 2})
        for (uint64_t count : kCounts)
          for (uint64_t chunk : kChunks) {
            PlanRequest req{Collective::kBroadcast, algo, n, root, count, 8, chunk, {}};
            auto mem = run_i64(req);
            for (int r = 0; r < n; ++r)
              for (uint64_t i = 0; i < count; ++i)
                BOOST_REQUIRE_MESSAGE(at<int64_t>(mem[r], Buffer::kOutput)[i] == value(root, i),
                                      label(req) << ": rank " << r << " element " << i);
          }
}

BOOST_AUTO_TEST_CASE(reduce_leaves_the_sum_at_the_root_only) {
  for (Algorithm algo : {Algorithm::kTree, Algorithm::kRing, Algorithm::kDeterministic})
    for (int n = 1; n <= 9; ++n)
      for (int root : {0, n - 1, n / 2})
        for (uint64_t count : kCounts)
          for (uint64_t chunk : kChunks)
            for (bool in_place : {false, true}) {
              PlanRequest req{Collective::kReduce, algo, n, root, count, 8, chunk, {}};
              req.in_place = in_place;
              Plan plan;
              auto mem = run_i64(req, &plan);
              for (int r = 0; r < n; ++r)
                if (r != root) BOOST_TEST(plan_buffer_count(plan, Buffer::kOutput, r) == 0u);
              for (uint64_t i = 0; i < count; ++i)
                BOOST_REQUIRE_MESSAGE(at<int64_t>(mem[root], Buffer::kOutput)[i] == sum_over_ranks(n, i),
                                      label(req) << ": element " << i);
            }
}

BOOST_AUTO_TEST_CASE(barrier_is_dissemination_and_send_recv_moves_data) {
  for (int n = 1; n <= 9; ++n) {
    PlanRequest req{Collective::kBarrier, Algorithm::kAuto, n, 0, 0, 8, 0, {}};
    Plan plan;
    run_i64(req, &plan);
    int rounds = 0;
    while ((1 << rounds) < n) ++rounds;
    BOOST_TEST(plan.message_count() == static_cast<uint64_t>(n * rounds));  // ceil(log2 n) rounds, one send each
    BOOST_TEST(plan.payload_count() == static_cast<uint64_t>(n * rounds));   // of one element (the token)
    BOOST_TEST((plan.algorithm == Algorithm::kDirect));
  }
  for (uint64_t count : {0, 1, 1000}) {
    PlanRequest req{Collective::kSend, Algorithm::kAuto, 4, 3, count, 8, 24, {}};
    req.peer = 1;
    auto mem = run_i64(req);
    for (uint64_t i = 0; i < count; ++i) BOOST_REQUIRE(at<int64_t>(mem[1], Buffer::kOutput)[i] == value(3, i));
  }
}

// A barrier's rounds must not run at once: an executor starts every op whose dependencies are done, so a
// send of round k that depended on nothing would go out as soon as the barrier began, and a rank could leave
// having heard from rank - 1, - 2, - 4, ... alone (issue #17: empty messages did exactly that). Each rank's
// send of round k waits, through the ops' regions, for its receives of rounds 0..k-1, its receives wait for
// nothing, and so every rank leaves having heard from every rank.
BOOST_AUTO_TEST_CASE(barrier_rounds_wait_for_every_earlier_receive_so_no_rank_leaves_early) {
  std::vector<int> worlds = {47, 64};
  for (int n = 1; n <= 17; ++n) worlds.push_back(n);
  for (int n : worlds) {
    const Plan plan = make_plan({Collective::kBarrier, Algorithm::kAuto, n, 0, 0, 1, 0, {}});
    validate_plan(plan);
    const auto heard = heard_on_leaving(plan);
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(heard[r] == all_ranks(n), "world " << n << ": rank " << r << " leaves having heard from mask "
                                                    << std::hex << heard[r]);
      // The dependency itself: transitively, round k's send needs every receive of the rounds before it.
      const auto cp = compile_plan(plan, r);
      std::vector<uint64_t> recvs_before(cp->ops.size(), 0);  // bit j: the receive of round j
      int sends = 0, recvs = 0;
      for (uint32_t i = 0; i < cp->ops.size(); ++i) {
        const CompiledOp& o = cp->ops[i];
        if (o.kind == OpKind::kRecv) {
          BOOST_TEST(o.deps == 0u, "world " << n << " rank " << r << ": a receive waits");  // posted at once
          recvs_before[i] |= uint64_t{1} << recvs++;
        } else if (o.kind == OpKind::kSend) {
          BOOST_TEST(recvs_before[i] == (uint64_t{1} << sends) - 1,
                     "world " << n << " rank " << r << ": the send of round " << sends << " waits for receives "
                              << std::hex << recvs_before[i]);
          ++sends;
        }
        for (uint32_t k = o.succ_begin; k < o.succ_end; ++k) recvs_before[cp->succs[k]] |= recvs_before[i];
      }
    }
  }
  // The analysis sees the flaw: the same rounds with empty messages (as before issue #17) let ranks leave early.
  Plan empty = make_plan({Collective::kBarrier, Algorithm::kAuto, 4, 0, 0, 1, 0, {}});
  for (RankPlan& rp : empty.ranks)
    for (Round& round : rp.rounds) {
      std::erase_if(round.ops, [](const Op& op) { return op.kind == OpKind::kCopy; });
      for (Op& op : round.ops) op.src.count = op.dst.count = 0;
    }
  const auto early = heard_on_leaving(empty);
  for (int r = 0; r < 4; ++r)
    BOOST_TEST(early[r] == all_ranks(4) - (uint64_t{1} << (r + 1) % 4));  // rank r - 3 = r + 1 is not heard
  // And all-reduce, which cannot finish without every rank's contribution, hears from every rank.
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree})
    for (int n : {3, 5, 8}) {
      const auto all = heard_on_leaving(make_plan({Collective::kAllreduce, algo, n, 0, 100, 8, 0, {}}));
      for (int r = 0; r < n; ++r) BOOST_TEST(all[r] == all_ranks(n), algorithm_name(algo) << " world " << n);
    }
}

BOOST_AUTO_TEST_CASE(deterministic_reductions_fold_in_rank_order_bit_for_bit) {
  // Values of very different magnitudes, so that the association order changes the f64 result.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-30, 30);
  for (int n = 2; n <= 7; ++n)
    for (uint64_t count : {1, 13, 1000})
      for (uint64_t chunk : kChunks)
        for (bool in_place : {false, true})
          for (Collective coll : {Collective::kAllreduce, Collective::kReduceScatter, Collective::kReduce}) {
            const uint64_t full = coll == Collective::kReduceScatter ? count * n : count;
            std::vector<std::vector<double>> data(n, std::vector<double>(full));
            for (auto& v : data)
              for (double& x : v) x = std::ldexp(mant(rng), expo(rng));
            std::vector<double> expect(full);
            for (uint64_t i = 0; i < full; ++i) {
              double acc = data[0][i];
              for (int r = 1; r < n; ++r) acc += data[r][i];
              expect[i] = acc;
            }
            PlanRequest req{coll, Algorithm::kDeterministic, n, n - 1, full, 8, chunk, {}};
            req.in_place = in_place;
            Plan plan = make_plan(req);
            validate_plan(plan);
            std::vector<RankMemory> mem;
            for (int r = 0; r < n; ++r) {
              mem.push_back(make_memory(plan, r, 8));
              std::memcpy(at<double>(mem[r], Buffer::kInput), data[r].data(), full * 8);
            }
            interpret(plan, mem, DType::kF64, ReduceOp::kSum);
            for (int r = 0; r < n; ++r) {
              if (coll == Collective::kReduce && r != n - 1) continue;
              const uint64_t off = coll == Collective::kReduceScatter ? r * count : 0;
              const uint64_t len = coll == Collective::kReduceScatter ? count : full;
              BOOST_REQUIRE_MESSAGE(
                  std::memcmp(at<double>(mem[r], Buffer::kOutput), expect.data() + off, len * 8) == 0,
                  label(req) << ": rank " << r << " differs from the rank-order fold");
            }
          }
}

BOOST_AUTO_TEST_CASE(every_rank_gets_identical_bits) {
  // Non-deterministic algorithms still give all ranks the same f64 result (DDP replicas stay equal).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree, Algorithm::kHierarchical})
    for (int n : {3, 6, 8}) {
      PlanRequest req{Collective::kAllreduce, algo, n, 0, 5000, 8, 800, topologies(n)[2]};
      Plan plan = make_plan(req);
      std::vector<RankMemory> mem;
      for (int r = 0; r < n; ++r) {
        mem.push_back(make_memory(plan, r, 8));
        for (uint64_t i = 0; i < req.count; ++i) at<double>(mem[r], Buffer::kInput)[i] = u(rng);
      }
      interpret(plan, mem, DType::kF64, ReduceOp::kSum);
      for (int r = 1; r < n; ++r)
        BOOST_REQUIRE(std::memcmp(at<double>(mem[r], Buffer::kOutput), at<double>(mem[0], Buffer::kOutput),
                                  req.count * 8) == 0);
    }
}

BOOST_AUTO_TEST_CASE(auto_picks_by_size_world_and_topology) {
  PlanRequest small{Collective::kAllreduce, Algorithm::kAuto, 4, 0, 1024, 4, 0, {}};
  BOOST_TEST(algorithm_name(choose_algorithm(small)) == std::string("hd"));
  PlanRequest large{Collective::kAllreduce, Algorithm::kAuto, 4, 0, 4u << 20, 4, 0, {}};
  BOOST_TEST(algorithm_name(choose_algorithm(large)) == std::string("ring"));
  large.topology.host_of = {0, 0, 1, 1};
  BOOST_TEST(algorithm_name(choose_algorithm(large)) == std::string("hier"));
  large.topology.host_of = {0, 0, 0, 0};  // one host: nothing to gain from a hierarchy
  BOOST_TEST(algorithm_name(choose_algorithm(large)) == std::string("ring"));
  PlanRequest det{Collective::kBroadcast, Algorithm::kDeterministic, 4, 0, 10, 4, 0, {}};
  BOOST_TEST(algorithm_name(choose_algorithm(det)) == std::string("tree"));  // nothing to reduce
  for (const char* name : {"auto", "ring", "hd", "tree", "hier", "direct", "det"})
    BOOST_TEST(algorithm_name(parse_algorithm(name)) == std::string(name));
  BOOST_TEST((parse_algorithm("halving-doubling") == Algorithm::kHalvingDoubling));
  BOOST_CHECK_THROW(parse_algorithm("bogus"), Error);
  // Chunks grow for huge buffers so that a plan has at most 512 per buffer.
  BOOST_TEST(effective_chunk_bytes(0, 1u << 20) == kDefaultChunkBytes);
  BOOST_TEST(effective_chunk_bytes(4096, 1u << 20) == 4096u);
  BOOST_TEST(effective_chunk_bytes(0, uint64_t{1} << 30) == (uint64_t{1} << 30) / 512);
  const std::string d = make_plan(large).describe();
  BOOST_TEST(d.find("allreduce ring world=4") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(impossible_requests_are_refused) {
  auto status_of = [](PlanRequest r) {
    try {
      make_plan(r);
    } catch (const Error& e) {
      return e.status();
    }
    return Status::kOk;
  };
  BOOST_TEST((status_of({Collective::kBroadcast, Algorithm::kAuto, 4, 4, 10, 4, 0, {}}) == Status::kInvalidArgument));
  BOOST_TEST((status_of({Collective::kReduce, Algorithm::kAuto, 4, -1, 10, 4, 0, {}}) == Status::kInvalidArgument));
  BOOST_TEST((status_of({Collective::kReduceScatter, Algorithm::kAuto, 4, 0, 10, 4, 0, {}}) ==
              Status::kInvalidArgument));
  BOOST_TEST((status_of({Collective::kAllreduce, Algorithm::kAuto, 0, 0, 10, 4, 0, {}}) == Status::kInvalidArgument));
  BOOST_TEST((status_of({Collective::kBroadcast, Algorithm::kHalvingDoubling, 4, 0, 10, 4, 0, {}}) ==
              Status::kUnsupported));
  PlanRequest topo{Collective::kAllreduce, Algorithm::kHierarchical, 4, 0, 10, 4, 0, {}};
  topo.topology.host_of = {0, 1};
  BOOST_TEST((status_of(topo) == Status::kInvalidArgument));
  PlanRequest self{Collective::kSend, Algorithm::kAuto, 4, 2, 10, 4, 0, {}};
  self.peer = 2;
  BOOST_TEST((status_of(self) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(plan_validation)

namespace {
Plan ring4() { return make_plan({Collective::kAllreduce, Algorithm::kRing, 4, 0, 100, 4, 0, {}}); }
Op* first(Plan& p, int rank, OpKind kind) {
  for (auto& round : p.ranks[rank].rounds)
    for (auto& op : round.ops)
      if (op.kind == kind) return &op;
  return nullptr;
}
void expect_flaw(const Plan& p, const std::string& words) {
  try {
    validate_plan(p);
    BOOST_ERROR("validate_plan accepted a plan that should fail with '" << words << "'");
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kInternal));
    BOOST_TEST(std::string(e.what()).find(words) != std::string::npos, e.what());
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(accepts_what_make_plan_builds) { BOOST_CHECK_NO_THROW(validate_plan(ring4())); }

BOOST_AUTO_TEST_CASE(catches_a_missing_receive) {
  Plan p = ring4();
  auto& ops = p.ranks[2].rounds[0].ops;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == OpKind::kRecv) {
      ops.erase(ops.begin() + static_cast<long>(i));
      break;
    }
  expect_flaw(p, "which receives");
}

BOOST_AUTO_TEST_CASE(catches_a_size_mismatch) {
  Plan p = ring4();
  first(p, 1, OpKind::kSend)->src.count -= 1;
  expect_flaw(p, "elements sent");
}

BOOST_AUTO_TEST_CASE(catches_an_out_of_bounds_region) {
  Plan p = ring4();
  first(p, 3, OpKind::kRecv)->dst.offset = 99;
  expect_flaw(p, "outside the output buffer");
}

BOOST_AUTO_TEST_CASE(catches_a_deadlock) {
  // Two ranks that each receive before they send, in separate rounds.
  Plan p = make_plan({Collective::kBarrier, Algorithm::kAuto, 2, 0, 0, 4, 0, {}});
  for (auto& rp : p.ranks) {
    Round send_round, recv_round;
    for (const Op& op : rp.rounds[0].ops) (op.kind == OpKind::kSend ? send_round : recv_round).ops.push_back(op);
    rp.rounds = {recv_round, send_round};
  }
  expect_flaw(p, "deadlocks");
}

BOOST_AUTO_TEST_CASE(catches_concurrent_writes_to_one_region) {
  Plan p = make_plan({Collective::kAllgather, Algorithm::kRing, 3, 0, 30, 4, 0, {}});
  // Make a later receive of rank 0 land in the same round and region as its first one.
  Op* r0 = first(p, 0, OpKind::kRecv);
  Op moved = p.ranks[0].rounds[1].ops.back();
  BOOST_REQUIRE(moved.kind == OpKind::kRecv);
  moved.dst = r0->dst;
  p.ranks[0].rounds[1].ops.pop_back();
  p.ranks[0].rounds[0].ops.push_back(moved);
  expect_flaw(p, "overlaps");
}

BOOST_AUTO_TEST_CASE(catches_an_invalid_peer) {
  Plan p = ring4();
  first(p, 0, OpKind::kSend)->peer = 0;
  expect_flaw(p, "invalid peer");
}

BOOST_AUTO_TEST_SUITE_END()
