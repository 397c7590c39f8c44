#include "transports/parts.hpp"

#include <algorithm>
#include <cstring>

namespace tandem::transports {

size_t total_bytes(std::span<const ConstPart> parts) noexcept {
  size_t n = 0;
  for (const auto& p : parts) n += p.bytes;
  return n;
}

size_t total_bytes(std::span<const MutPart> parts) noexcept {
  size_t n = 0;
  for (const auto& p : parts) n += p.bytes;
  return n;
}

size_t scatter_copy(std::span<const ConstPart> src, std::span<const MutPart> dst) noexcept {
  size_t copied = 0;
  size_t di = 0, doff = 0;
  for (const auto& s : src) {
    size_t soff = 0;
    while (soff < s.bytes) {
      while (di < dst.size() && doff == dst[di].bytes) {
        ++di;
        doff = 0;
      }
      if (di == dst.size()) return copied;
      const size_t n = std::min(s.bytes - soff, dst[di].bytes - doff);
      std::memcpy(static_cast<char*>(dst[di].data) + doff, static_cast<const char*>(s.data) + soff, n);
      soff += n;
      doff += n;
      copied += n;
    }
  }
  return copied;
}

size_t copy_into_at(std::span<const MutPart> dst, size_t offset, const void* data, size_t bytes) noexcept {
  size_t written = 0;
  for (const auto& d : dst) {
    if (written == bytes) break;
    if (offset >= d.bytes) {
      offset -= d.bytes;
      continue;
    }
    const size_t n = std::min(d.bytes - offset, bytes - written);
    std::memcpy(static_cast<char*>(d.data) + offset, static_cast<const char*>(data) + written, n);
    written += n;
    offset = 0;
  }
  return written;
}

size_t copy_out_at(std::span<const ConstPart> src, size_t offset, void* out, size_t bytes) noexcept {
  size_t copied = 0;
  for (const auto& s : src) {
    if (copied == bytes) break;
    if (offset >= s.bytes) {
      offset -= s.bytes;
      continue;
    }
    const size_t n = std::min(s.bytes - offset, bytes - copied);
    std::memcpy(static_cast<char*>(out) + copied, static_cast<const char*>(s.data) + offset, n);
    copied += n;
    offset = 0;
  }
  return copied;
}

}  // namespace tandem::transports
