#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/tensor.hpp"
#include "tests/compute/test_util.hpp"

using namespace tandem;
using tandem::engine::compute::testing::status_of;

namespace {

// Counts raw allocations so tests can see when the cache served a request.
struct CountingRaw final : RawAllocator {
  int* allocs;
  int* frees;
  CountingRaw(int* a, int* f) : allocs(a), frees(f) {}
  void* allocate(size_t bytes) override {
    ++*allocs;
    return std::aligned_alloc(kTensorAlignment, bytes);
  }
  void deallocate(void* p, size_t) noexcept override {
    ++*frees;
    std::free(p);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(shape)

BOOST_AUTO_TEST_CASE(reports_dims_numel_and_text) {
  Shape s{64, 3, 32, 32};
  BOOST_TEST(s.rank() == 4);
  BOOST_TEST(s.numel() == 64 * 3 * 32 * 32);
  BOOST_TEST(s[-1] == 32);
  BOOST_TEST(s.str() == "[64, 3, 32, 32]");
  BOOST_TEST(Shape{}.numel() == 1);
  BOOST_TEST((Shape{2, 3} == Shape{2, 3}));
  BOOST_TEST(!(Shape{2, 3} == Shape{3, 2}));
}

BOOST_AUTO_TEST_CASE(rejects_bad_dims_and_indices) {
  BOOST_TEST((status_of([] { Shape s{2, -5}; }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([] { Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}; }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([] { (void)Shape{2, 3}.dim(2); }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([] { (void)Shape{2, 3}.dim(-3); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(storage_is_64_byte_aligned) {
  for (int64_t n : {1, 3, 17, 1000, 12345}) {
    Tensor t = Tensor::empty({n}, DType::kU8);
    BOOST_TEST(reinterpret_cast<uintptr_t>(t.raw_data()) % 64 == 0);
  }
}

BOOST_AUTO_TEST_CASE(copies_share_storage_and_clone_does_not) {
  Tensor a = Tensor::full({2, 3}, 1.5);
  Tensor b = a;
  b.data<float>()[4] = 7.0f;
  BOOST_TEST(a.data<float>()[4] == 7.0f);
  Tensor c = a.clone();
  c.data<float>()[4] = 0.0f;
  BOOST_TEST(a.data<float>()[4] == 7.0f);
  BOOST_TEST(a.shares_storage_with(b));
  BOOST_TEST(!a.shares_storage_with(c));
}

BOOST_AUTO_TEST_CASE(view_infers_one_dim_and_checks_counts) {
  Tensor a = Tensor::zeros({4, 2, 3, 3});
  Tensor v = a.view({4, -1});
  BOOST_TEST(v.shape().str() == "[4, 18]");
  BOOST_TEST(v.shares_storage_with(a));
  BOOST_TEST((status_of([&] { (void)a.view({5, -1}); }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([&] { (void)a.view({4, 17}); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_CASE(slice_views_a_flat_buffer) {
  std::vector<float> vals(10);
  for (int i = 0; i < 10; ++i) vals[i] = static_cast<float>(i);
  Tensor flat = Tensor::from_vector({10}, vals);
  Tensor w = flat.slice(4, {2, 3});
  BOOST_TEST(w.data<float>()[0] == 4.0f);
  BOOST_TEST(w.data<float>()[5] == 9.0f);
  w.fill(-1.0);
  BOOST_TEST(flat.data<float>()[3] == 3.0f);
  BOOST_TEST(flat.data<float>()[4] == -1.0f);
  BOOST_TEST((status_of([&] { (void)flat.slice(5, {2, 3}); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_CASE(typed_access_checks_dtype_device_and_definedness) {
  Tensor t = Tensor::zeros({3}, DType::kI32);
  BOOST_TEST((status_of([&] { (void)t.data<float>(); }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([&] { (void)t.data<int32_t>(); }) == Status::kOk));
  BOOST_TEST((status_of([] { (void)Tensor().data<float>(); }) == Status::kInvalidArgument));
  float dummy[4];
  Tensor dev = Tensor::wrap(dummy, {4}, DType::kF32, Device::cuda(0));
  BOOST_TEST((status_of([&] { (void)dev.data<float>(); }) == Status::kInvalidArgument));
  try {
    (void)t.data<float>();
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("i32[3] cpu") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(check_shape_names_expected_and_got) {
  Tensor t = Tensor::zeros({2, 3});
  try {
    check_shape(t, Shape{3, 2}, "bias");
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "bias: expected shape [3, 2], got [2, 3]");
  }
  BOOST_TEST((status_of([&] { check_dtype(t, DType::kI64, "labels"); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_CASE(wrap_does_not_free_caller_memory) {
  std::vector<float> buf(6, 2.0f);
  {
    Tensor t = Tensor::wrap(buf.data(), {2, 3}, DType::kF32);
    t.data<float>()[0] = 5.0f;
  }
  BOOST_TEST(buf[0] == 5.0f);
}

BOOST_AUTO_TEST_CASE(devices_parse_and_print) {
  BOOST_TEST(parse_device("cpu").str() == "cpu");
  BOOST_TEST(parse_device("cuda:3").str() == "cuda:3");
  BOOST_TEST((parse_device("cuda") == Device::cuda(0)));
  BOOST_TEST((status_of([] { parse_device("gpu0"); }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([] { parse_device("cuda:x"); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(caching_allocator)

BOOST_AUTO_TEST_CASE(reuses_freed_blocks_of_the_same_class) {
  int allocs = 0, frees = 0;
  CachingAllocator a(Device::cpu(), std::make_unique<CountingRaw>(&allocs, &frees));
  void* p = a.allocate(1000);
  a.deallocate(p, 1000);
  void* q = a.allocate(990);  // same 1024-byte class
  BOOST_TEST(q == p);
  BOOST_TEST(allocs == 1);
  void* r = a.allocate(1000);  // p is in use: a new block
  BOOST_TEST(r != q);
  BOOST_TEST(allocs == 2);
  a.deallocate(q, 990);
  a.deallocate(r, 1000);
  const AllocatorStats s = a.stats();
  BOOST_TEST(s.allocations == 3u);
  BOOST_TEST(s.cache_hits == 1u);
  BOOST_TEST(s.bytes_in_use == 0u);
  BOOST_TEST(s.bytes_cached == 2048u);
  BOOST_TEST(s.peak_bytes_in_use == 2048u);
  a.empty_cache();
  BOOST_TEST(frees == 2);
  BOOST_TEST(a.stats().bytes_cached == 0u);
}

// A smaller batch's tensors (an epoch's partial last batch) reuse the full batch's free blocks instead of taking new
// ones beside them, and those blocks serve the full batch again afterwards (issue #16).
BOOST_AUTO_TEST_CASE(a_request_without_a_free_block_of_its_class_takes_a_larger_one) {
  int allocs = 0, frees = 0;
  CachingAllocator a(Device::cpu(), std::make_unique<CountingRaw>(&allocs, &frees));
  const size_t full = 128 * 512 * 4, part = 104 * 512 * 4;  // one layer's output at batch 128 and 104
  BOOST_REQUIRE(CachingAllocator::size_class(part) < CachingAllocator::size_class(full));
  void* p = a.allocate(full);
  a.deallocate(p, full);
  void* q = a.allocate(part);
  BOOST_TEST(q == p);
  BOOST_TEST(allocs == 1);
  BOOST_TEST(a.stats().bytes_in_use == CachingAllocator::size_class(full));  // the block's own class
  void* r = a.allocate(part);  // no free block left: a new one of its class
  BOOST_TEST(allocs == 2);
  a.deallocate(q, part);
  a.deallocate(r, part);
  BOOST_TEST(a.stats().bytes_in_use == 0u);
  BOOST_TEST(a.stats().bytes_cached == CachingAllocator::size_class(full) + CachingAllocator::size_class(part));
  void* f = a.allocate(full);  // back in the full class's list
  BOOST_TEST(f == p);
  BOOST_TEST(allocs == 2);
  a.deallocate(f, full);
  // the smallest larger block, and not one of twice the request's class or more
  void* half = a.allocate(full / 2);
  BOOST_TEST(half == r);
  BOOST_TEST(allocs == 2);
  void* other = a.allocate(full / 2);  // only p is free, of twice its class
  BOOST_TEST(other != p);
  BOOST_TEST(allocs == 3);
  a.deallocate(half, full / 2);
  a.deallocate(other, full / 2);
  BOOST_TEST(a.stats().bytes_in_use == 0u);
  a.empty_cache();
  BOOST_TEST(frees == 3);
  BOOST_TEST(a.stats().bytes_cached == 0u);
}

BOOST_AUTO_TEST_CASE(size_classes_bound_waste_and_align) {
  for (size_t b : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096}, size_t{4097},
                   size_t{100000}, size_t{1} << 20, (size_t{1} << 20) + 1, size_t{123456789}}) {
    const size_t c = CachingAllocator::size_class(b);
    BOOST_TEST(c >= b);
    BOOST_TEST(c % 64 == 0u);
    BOOST_TEST(static_cast<double>(c) <= std::max<double>(64.0, b * 1.125 + 64));
  }
}

BOOST_AUTO_TEST_CASE(respects_the_cache_limit) {
  int allocs = 0, frees = 0;
  CachingAllocator a(Device::cpu(), std::make_unique<CountingRaw>(&allocs, &frees), 4096);
  void* p = a.allocate(4096);
  void* q = a.allocate(4096);
  a.deallocate(p, 4096);
  a.deallocate(q, 4096);  // would exceed 4 KiB cached: released at once
  BOOST_TEST(frees == 1);
  BOOST_TEST(a.stats().bytes_cached == 4096u);
}

BOOST_AUTO_TEST_CASE(tensors_return_storage_to_the_host_cache) {
  CachingAllocator& h = host_allocator();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({12345}, DType::kF32);
    first = t.raw_data();
  }
  const uint64_t hits = h.stats().cache_hits;
  Tensor u = Tensor::empty({12345}, DType::kF32);
  BOOST_TEST(u.raw_data() == first);
  BOOST_TEST(h.stats().cache_hits == hits + 1);
}

BOOST_AUTO_TEST_CASE(device_without_allocator_is_a_clear_error) {
  try {
    (void)Tensor::empty({4}, DType::kF32, Device::cuda(7));
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kUnsupported));
    BOOST_TEST(std::string(e.what()).find("cuda:7") != std::string::npos);
  }
}

// The per-process device-memory figure goes to the probe the device's backend registered, with the device's index;
// a host device, or a device kind with no probe, reads 0 (unknown).
BOOST_AUTO_TEST_CASE(device_memory_probe_is_asked_for_its_device) {
  static int32_t asked = -1;
  BOOST_TEST(process_device_memory_bytes(Device::cpu()) == 0);
  register_device_memory_probe(Device::Kind::kCuda, nullptr);
  BOOST_TEST(process_device_memory_bytes(Device::cuda(1)) == 0);
  register_device_memory_probe(Device::Kind::kCuda, [](int32_t index) {
    asked = index;
    return 1000.0 + index;
  });
  BOOST_TEST(process_device_memory_bytes(Device::cuda(3)) == 1003.0);
  BOOST_TEST(asked == 3);
  BOOST_TEST(process_device_memory_bytes(Device::cpu()) == 0);  // never the device probe
  register_device_memory_probe(Device::Kind::kCuda, nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
