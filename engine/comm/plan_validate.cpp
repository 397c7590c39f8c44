// validate_plan: a plan's internal consistency (matching sends and receives, regions in bounds, progress).
#include "engine/comm/plan.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::comm {

namespace {

const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::kInput: return "input";
    case Buffer::kOutput: return "output";
    case Buffer::kScratch: return "scratch";
  }
  return "?";
}

std::string region_text(const Region& r) {
  return fmt::format("{}[{}, +{})", buffer_name(r.buffer), r.offset, r.count);
}

bool overlaps(const Region& a, const Region& b) {
  return a.buffer == b.buffer && a.count && b.count && a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

}  // namespace

void validate_plan(const Plan& plan) {
  const int n = plan.world;
  TANDEM_CHECK(n >= 1 && plan.ranks.size() == static_cast<size_t>(n), Status::kInternal,
               "plan '{}' has {} rank plans for world size {}", plan.describe(), plan.ranks.size(), n);
  struct Transfer {
    int from, to;
    size_t from_round, to_round;
    uint64_t count;
    bool done = false;
  };
  // sends[a][b] / recvs[b][a]: (round, count) in plan order.
  std::map<std::pair<int, int>, std::vector<std::pair<size_t, uint64_t>>> sends, recvs;
  for (int r = 0; r < n; ++r) {
    const auto& rounds = plan.ranks[r].rounds;
    for (size_t t = 0; t < rounds.size(); ++t) {
      std::vector<const Op*> transfers;
      for (size_t i = 0; i < rounds[t].ops.size(); ++i) {
        const Op& op = rounds[t].ops[i];
        auto where = [&] { return fmt::format("rank {} round {} op {}", r, t, i); };
        auto check_region = [&](const Region& reg) {
          TANDEM_CHECK(static_cast<uint8_t>(reg.buffer) <= 2, Status::kInternal, "{}: unknown buffer {}", where(),
                       static_cast<int>(reg.buffer));
          const uint64_t size = plan_buffer_count(plan, reg.buffer, r);
          TANDEM_CHECK(reg.offset <= size && reg.count <= size - reg.offset, Status::kInternal,
                       "{}: region {} is outside the {} buffer of {} elements", where(), region_text(reg),
                       buffer_name(reg.buffer), size);
        };
        switch (op.kind) {
          case OpKind::kSend:
          case OpKind::kRecv: {
            TANDEM_CHECK(op.peer >= 0 && op.peer < n && op.peer != r, Status::kInternal, "{}: invalid peer {}",
                         where(), op.peer);
            const Region& reg = op.kind == OpKind::kSend ? op.src : op.dst;
            check_region(reg);
            for (const Op* other : transfers) {
              const Region& oreg = other->kind == OpKind::kSend ? other->src : other->dst;
              const bool write = op.kind == OpKind::kRecv || other->kind == OpKind::kRecv;
              TANDEM_CHECK(!(write && overlaps(reg, oreg)), Status::kInternal,
                           "{}: {} overlaps {} of a concurrent transfer that writes", where(), region_text(reg),
                           region_text(oreg));
            }
            transfers.push_back(&op);
            if (op.kind == OpKind::kSend)
              sends[{r, op.peer}].push_back({t, reg.count});
            else
              recvs[{op.peer, r}].push_back({t, reg.count});
            break;
          }
          case OpKind::kCopy:
          case OpKind::kReduce:
            check_region(op.src);
            check_region(op.dst);
            TANDEM_CHECK(op.src.count == op.dst.count, Status::kInternal, "{}: source {} and destination {} differ",
                         where(), region_text(op.src), region_text(op.dst));
            TANDEM_CHECK(!overlaps(op.src, op.dst), Status::kInternal, "{}: source {} overlaps destination {}",
                         where(), region_text(op.src), region_text(op.dst));
            break;
          default: TANDEM_THROW(Status::kInternal, "{}: unknown op kind {}", where(), static_cast<int>(op.kind));
        }
      }
    }
  }
  std::vector<Transfer> transfers;
  // round_transfers[r][t]: indices of transfers in rank r's round t.
  std::vector<std::vector<std::vector<size_t>>> round_transfers(n);
  for (int r = 0; r < n; ++r) round_transfers[r].resize(plan.ranks[r].rounds.size());
  for (const auto& [key, list] : sends) {
    const auto& [a, b] = key;
    const auto it = recvs.find(key);
    const size_t matched = it == recvs.end() ? 0 : it->second.size();
    TANDEM_CHECK(matched == list.size(), Status::kInternal, "rank {} sends {} message(s) to rank {}, which receives {}",
                 a, list.size(), b, matched);
    for (size_t k = 0; k < list.size(); ++k) {
      const auto& rv = it->second[k];
      TANDEM_CHECK(list[k].second == rv.second, Status::kInternal,
                   "message #{} from rank {} to rank {}: {} elements sent, {} expected", k, a, b, list[k].second,
                   rv.second);
      round_transfers[a][list[k].first].push_back(transfers.size());
      round_transfers[b][rv.first].push_back(transfers.size());
      transfers.push_back({a, b, list[k].first, rv.first, list[k].second});
    }
  }
  for (const auto& [key, list] : recvs)
    TANDEM_CHECK(sends.count(key), Status::kInternal, "rank {} expects {} message(s) from rank {}, which sends none",
                 key.second, list.size(), key.first);
  // Run the rounds: a transfer completes once both sides are in the rounds that hold it.
  std::vector<size_t> cur(n, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      while (cur[r] < round_transfers[r].size()) {
        bool all_done = true;
        for (size_t id : round_transfers[r][cur[r]]) {
          Transfer& tr = transfers[id];
          if (!tr.done && cur[tr.from] == tr.from_round && cur[tr.to] == tr.to_round) tr.done = true;
          all_done &= tr.done;
        }
        if (!all_done) break;
        ++cur[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (cur[r] == round_transfers[r].size()) continue;
    std::string waits;
    for (size_t id : round_transfers[r][cur[r]]) {
      const Transfer& tr = transfers[id];
      if (!tr.done)
        waits += fmt::format(" {} rank {} (its round {})", tr.from == r ? "send to" : "receive from",
                             tr.from == r ? tr.to : tr.from, tr.from == r ? tr.to_round : tr.from_round);
    }
    TANDEM_THROW(Status::kInternal, "plan '{}' deadlocks: rank {} waits forever in round {} on{}", plan.describe(), r,
                 cur[r], waits);
  }
}

}  // namespace tandem::engine::comm
