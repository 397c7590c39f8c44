// split_layout: groups by color, ranks by (key, old rank), ids by color order above every rank's
// next free id, and opting out with a negative color.
#include <boost/test/unit_test.hpp>

#include <array>

#include "engine/comm/group_split.hpp"
#include "engine/comm/wire.hpp"
#include "engine/core/error.hpp"

using namespace tandem;
using namespace tandem::engine::comm;

namespace {

// (color, key, next id) per old rank, as split's allgather leaves them.
std::vector<int64_t> table(const std::vector<std::array<int64_t, 3>>& rows) {
  std::vector<int64_t> all;
  for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
  return all;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(group_split)

BOOST_AUTO_TEST_CASE(groups_are_ordered_by_key_then_old_rank) {
  // Old ranks 0..5: colors 7, 3, 7, 3, 7, -1; keys reverse some of the order; ties keep old rank order.
  const auto all = table({{7, 2, 1}, {3, 0, 4}, {7, 0, 2}, {3, 0, 1}, {7, 2, 1}, {-1, 0, 1}});
  const SplitLayout l0 = split_layout(all, 0);
  BOOST_TEST((l0.members == std::vector<int>{2, 0, 4}));
  BOOST_TEST(l0.child_rank == 1);
  const SplitLayout l4 = split_layout(all, 4);
  BOOST_TEST(l4.child_rank == 2);
  const SplitLayout l1 = split_layout(all, 1);
  BOOST_TEST((l1.members == std::vector<int>{1, 3}));  // equal keys: old rank order
  BOOST_TEST(l1.child_rank == 0);
  BOOST_TEST(split_layout(all, 3).child_rank == 1);
}

BOOST_AUTO_TEST_CASE(ids_follow_the_colors_above_the_highest_next_id) {
  const auto all = table({{7, 0, 1}, {3, 0, 4}, {7, 0, 2}, {3, 0, 1}, {-1, 0, 9}});
  // base 9 (the highest next id of any rank, the opted-out one's included); colors 3 < 7.
  BOOST_TEST(split_layout(all, 1).child_id == 9u);
  BOOST_TEST(split_layout(all, 0).child_id == 10u);
  for (int r = 0; r < 5; ++r) BOOST_TEST(split_layout(all, r).reserve_until == 11u);
}

BOOST_AUTO_TEST_CASE(a_negative_color_joins_no_group) {
  const auto all = table({{0, 0, 1}, {-1, 5, 1}, {0, 1, 1}});
  const SplitLayout l = split_layout(all, 1);
  BOOST_TEST(l.child_rank == -1);
  BOOST_TEST(l.members.empty());
  BOOST_TEST(l.reserve_until == 2u);  // still reserves the others' ids
  BOOST_TEST((split_layout(all, 2).members == std::vector<int>{0, 2}));
}

BOOST_AUTO_TEST_CASE(running_out_of_ids_is_unsupported) {
  const auto all = table({{0, 0, static_cast<int64_t>(kMaxCommId)}, {1, 0, 1}});
  std::string msg;
  try {
    split_layout(all, 0);
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kUnsupported));
    msg = e.what();
  }
  BOOST_TEST(msg.find("out of communicator ids") != std::string::npos, msg);
  // Exactly at the limit still fits.
  const auto fits = table({{0, 0, static_cast<int64_t>(kMaxCommId) - 1}, {-1, 0, 1}});
  BOOST_TEST(split_layout(fits, 0).child_id == kMaxCommId - 1);
}

BOOST_AUTO_TEST_SUITE_END()
