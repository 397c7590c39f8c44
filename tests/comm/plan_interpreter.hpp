#pragma once
// Runs a Plan in memory, without a transport: every rank's buffers live in one arena per rank, a
// transfer copies bytes once both sides have reached the rounds that hold it (the k-th send from a to
// b meets the k-th receive on b from a), and a round's local ops run after all its transfers. Used
// to check what plans compute, independently of the executor.
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/comm/plan.hpp"
#include "engine/core/dtype.hpp"

namespace tandem::testing {

struct RankMemory {
  std::vector<unsigned char> arena;
  // Byte offsets of the caller's input, output and the scratch inside the arena.
  size_t base[3] = {0, 0, 0};
};

// Memory for `rank`: input and output as the caller would pass them (aliased when plan.in_place),
// scratch after them. Element size `esize`.
inline RankMemory make_memory(const engine::comm::Plan& plan, int rank, size_t esize) {
  using engine::comm::Buffer;
  using engine::comm::Collective;
  const uint64_t in = plan_buffer_count(plan, Buffer::kInput, rank);
  const uint64_t out = plan_buffer_count(plan, Buffer::kOutput, rank);
  const uint64_t per = plan.count / static_cast<uint64_t>(plan.world);
  RankMemory m;
  size_t size = 0;
  if (plan.in_place) {
    switch (plan.collective) {
      case Collective::kReduceScatter:  // output = input + rank * per
        m.base[0] = 0;
        m.base[1] = static_cast<size_t>(rank) * per * esize;
        size = in * esize;
        break;
      case Collective::kAllgather:  // input = output + rank * per
        m.base[1] = 0;
        m.base[0] = static_cast<size_t>(rank) * per * esize;
        size = out * esize;
        break;
      default:
        m.base[0] = m.base[1] = 0;
        size = std::max(in, out) * esize;
        break;
    }
  } else {
    m.base[0] = 0;
    m.base[1] = in * esize;
    size = (in + out) * esize;
  }
  m.base[2] = size;
  m.arena.assign(size + plan.scratch_count * esize, 0);
  return m;
}

// Executes the plan; throws std::runtime_error on a deadlock or a size mismatch.
inline void interpret(const engine::comm::Plan& plan, std::vector<RankMemory>& mem, DType dtype, ReduceOp op) {
  using namespace engine::comm;
  const size_t esize = dtype_size(dtype);
  const int n = plan.world;
  auto ptr = [&](int r, const Region& reg) {
    return mem[r].arena.data() + mem[r].base[static_cast<int>(reg.buffer)] + reg.offset * esize;
  };
  struct Pending {
    int rank;
    size_t round;
    const Op* op;
  };
  std::map<std::pair<int, int>, std::vector<Pending>> sends, recvs;
  for (int r = 0; r < n; ++r)
    for (size_t t = 0; t < plan.ranks[r].rounds.size(); ++t)
      for (const Op& o : plan.ranks[r].rounds[t].ops) {
        if (o.kind == OpKind::kSend) sends[{r, o.peer}].push_back({r, t, &o});
        if (o.kind == OpKind::kRecv) recvs[{o.peer, r}].push_back({r, t, &o});
      }
  struct Match {
    Pending send, recv;
    bool done = false;
  };
  std::vector<Match> matches;
  std::map<const Op*, size_t> match_of;
  for (auto& [key, list] : sends) {
    auto& rl = recvs[key];
    if (rl.size() != list.size()) throw std::runtime_error("send/receive counts differ");
    for (size_t k = 0; k < list.size(); ++k) {
      match_of[list[k].op] = matches.size();
      match_of[rl[k].op] = matches.size();
      matches.push_back({list[k], rl[k]});
    }
  }
  std::vector<size_t> cur(n, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      while (cur[r] < plan.ranks[r].rounds.size()) {
        const Round& round = plan.ranks[r].rounds[cur[r]];
        bool all = true;
        for (const Op& o : round.ops) {
          if (o.kind != OpKind::kSend && o.kind != OpKind::kRecv) continue;
          Match& m = matches.at(match_of.at(&o));
          if (!m.done && cur[m.send.rank] == m.send.round && cur[m.recv.rank] == m.recv.round) {
            if (m.send.op->src.count != m.recv.op->dst.count) throw std::runtime_error("message size mismatch");
            if (m.send.op->src.count)
              std::memmove(ptr(m.recv.rank, m.recv.op->dst), ptr(m.send.rank, m.send.op->src),
                           m.send.op->src.count * esize);
            m.done = true;
          }
          all &= m.done;
        }
        if (!all) break;
        for (const Op& o : round.ops) {
          if (o.kind == OpKind::kCopy) std::memmove(ptr(r, o.dst), ptr(r, o.src), o.src.count * esize);
          if (o.kind == OpKind::kReduce) reduce_into(ptr(r, o.dst), ptr(r, o.src), o.src.count, dtype, op);
        }
        ++cur[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r)
    if (cur[r] != plan.ranks[r].rounds.size())
      throw std::runtime_error("rank " + std::to_string(r) + " stuck in round " + std::to_string(cur[r]));
}

}  // namespace tandem::testing
