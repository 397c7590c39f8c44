#pragma once
// Communicator::split's arithmetic, apart from its exchange: every rank contributes
// (color, key, lowest communicator id free on that rank) in an allgather; from those, each rank
// derives the same ids and its own group.
#include <cstdint>
#include <vector>

namespace tandem::engine::comm {

struct SplitLayout {
  // Every communicator id below this is taken on every rank from now on (SharedTransport::reserve_ids).
  uint32_t reserve_until = 0;
  // The rest is for a rank with color >= 0; a rank with color < 0 joins no group (child_rank -1).
  uint32_t child_id = 0;              // base + index of the color among the colors in use, ascending
  int child_rank = -1;                // this rank's rank in its group
  std::vector<int> members;           // the group's old ranks, ordered by (key, old rank)
};

// `all`: 3 entries per old rank r: color, key, next free id. `rank`: this rank's old rank.
// kUnsupported when the ids would go past kMaxCommId.
SplitLayout split_layout(const std::vector<int64_t>& all, int rank);

}  // namespace tandem::engine::comm
