#include "engine/comm/aligned_buffer.hpp"

#include <algorithm>
#include <cstdlib>

#include "engine/core/error.hpp"

namespace tandem::engine::comm {

void AlignedBuffer::Free::operator()(unsigned char* p) const noexcept { std::free(p); }

unsigned char* AlignedBuffer::reserve(size_t bytes) {
  if (bytes > size_ || !data_) {
    const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
    TANDEM_CHECK(p != nullptr, Status::kOutOfMemory, "communicator: cannot allocate {} bytes of scratch", rounded);
    data_.reset(p);
    size_ = rounded;
  }
  return data_.get();
}

}  // namespace tandem::engine::comm
