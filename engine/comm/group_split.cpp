#include "engine/comm/group_split.hpp"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "engine/comm/wire.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::comm {

SplitLayout split_layout(const std::vector<int64_t>& all, int rank) {
  const int size = static_cast<int>(all.size() / 3);
  TANDEM_CHECK(all.size() == 3 * static_cast<size_t>(size) && rank >= 0 && rank < size, Status::kInternal,
               "split: {} entries for rank {}", all.size(), rank);
  int64_t base = 0;
  std::set<int64_t> colors;
  for (int r = 0; r < size; ++r) {
    base = std::max(base, all[3 * r + 2]);
    if (all[3 * r] >= 0) colors.insert(all[3 * r]);
  }
  TANDEM_CHECK(base + static_cast<int64_t>(colors.size()) <= kMaxCommId, Status::kUnsupported,
               "split: out of communicator ids ({} in use on some rank, at most {})", base, kMaxCommId);
  SplitLayout out;
  out.reserve_until = static_cast<uint32_t>(base + static_cast<int64_t>(colors.size()));
  const int64_t color = all[3 * static_cast<size_t>(rank)];
  if (color < 0) return out;
  out.child_id = static_cast<uint32_t>(base + std::distance(colors.begin(), colors.find(color)));
  std::vector<std::pair<int64_t, int>> order;  // (key, old rank)
  for (int r = 0; r < size; ++r)
    if (all[3 * r] == color) order.emplace_back(all[3 * r + 1], r);
  std::sort(order.begin(), order.end());
  for (const auto& [k, r] : order) {
    if (r == rank) out.child_rank = static_cast<int>(out.members.size());
    out.members.push_back(r);
  }
  return out;
}

}  // namespace tandem::engine::comm
