#pragma once
// A 64-byte aligned, growable byte buffer (a communicator's scratch and staging).
#include <cstddef>
#include <memory>

namespace tandem::engine::comm {

class AlignedBuffer {
 public:
  // At least `bytes` (rounded up to 64, at least 64); the old contents are lost when it grows.
  unsigned char* reserve(size_t bytes);
  unsigned char* data() const { return data_.get(); }
  size_t capacity() const { return size_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const noexcept;
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t size_ = 0;
};

}  // namespace tandem::engine::comm
