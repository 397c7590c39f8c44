#pragma once
// Anonymous pages of their own, for the tests that a transport no longer reads a buffer once it let go of it: once
// unmapped, a later read by the transport faults (EFAULT from a socket write, SIGSEGV from a copy) instead of silently
// reading memory that was reused.
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>

#include <cstddef>

namespace tandem::transports::testing {

struct Pages {
  explicit Pages(size_t n) : bytes(n), data(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {
    BOOST_REQUIRE(data != MAP_FAILED);
  }
  ~Pages() { unmap(); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  void unmap() {
    if (data != MAP_FAILED) ::munmap(data, bytes);
    data = MAP_FAILED;
  }
  unsigned char* begin() const { return static_cast<unsigned char*>(data); }
  size_t bytes;
  void* data;
};

}  // namespace tandem::transports::testing
