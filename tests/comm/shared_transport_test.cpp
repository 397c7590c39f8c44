// SharedTransport's id reservations and graveyard, and AlignedBuffer's alignment and growth.
#include <boost/test/unit_test.hpp>

#include <cstdint>

#include "engine/comm/aligned_buffer.hpp"
#include "engine/comm/shared_transport.hpp"

using namespace tandem::engine::comm;

BOOST_AUTO_TEST_SUITE(shared_transport)

BOOST_AUTO_TEST_CASE(ids_only_grow_and_start_after_the_world) {
  SharedTransport shared(nullptr);  // ids and the graveyard need no transport
  BOOST_TEST(shared.next_id() == 1u);
  shared.reserve_ids(5);
  BOOST_TEST(shared.next_id() == 5u);
  shared.reserve_ids(3);  // never back
  BOOST_TEST(shared.next_id() == 5u);
}

BOOST_AUTO_TEST_CASE(buried_buffers_live_as_long_as_the_transport) {
  std::weak_ptr<int> watch;
  {
    SharedTransport shared(nullptr);
    auto p = std::make_shared<int>(42);
    watch = p;
    shared.bury(std::move(p));
    BOOST_TEST(shared.buried() == 1u);
    BOOST_TEST(!watch.expired());
  }
  BOOST_TEST(watch.expired());
}

BOOST_AUTO_TEST_CASE(aligned_buffers_are_aligned_and_grow_on_demand) {
  AlignedBuffer b;
  BOOST_TEST(b.data() == nullptr);
  unsigned char* p = b.reserve(0);
  BOOST_TEST(p != nullptr);
  BOOST_TEST(b.capacity() == 64u);
  BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 64 == 0u);
  BOOST_TEST(b.reserve(64) == p);  // fits: no new allocation
  unsigned char* q = b.reserve(65);
  BOOST_TEST(b.capacity() == 128u);
  BOOST_TEST(reinterpret_cast<uintptr_t>(q) % 64 == 0u);
  BOOST_TEST(b.reserve(100) == q);
}

BOOST_AUTO_TEST_SUITE_END()
