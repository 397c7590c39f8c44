#include "transports/zmq/wire.hpp"

#include <bit>
#include <cstring>

#include <fmt/format.h>

namespace tandem::transports::zmq {

static_assert(std::endian::native == std::endian::little, "the zmq wire format is little-endian");

std::string check_header(const void* frame, size_t frame_bytes, int world, WireHeader& out) {
  if (frame_bytes != sizeof(WireHeader))
    return fmt::format("header frame has {} bytes, expected {}", frame_bytes, sizeof(WireHeader));
  WireHeader h;
  std::memcpy(&h, frame, sizeof h);
  if (h.magic != kWireMagic) return fmt::format("bad magic 0x{:08x}", h.magic);
  if (h.version != kWireVersion) return fmt::format("wire version {}, expected {}", h.version, kWireVersion);
  if (h.kind < static_cast<uint16_t>(Kind::kHello) || h.kind > static_cast<uint16_t>(Kind::kGoodbye))
    return fmt::format("unknown segment kind {}", h.kind);
  if (h.src < 0 || h.src >= world) return fmt::format("source rank {} outside [0, {})", h.src, world);
  if (h.tag >= (uint64_t{1} << 40)) return fmt::format("tag {} is not below 2^40", h.tag);
  if (h.offset > h.total || h.seg_bytes > h.total - h.offset)
    return fmt::format("segment [{}, +{}) outside a {}-byte message", h.offset, h.seg_bytes, h.total);
  out = h;
  return {};
}

}  // namespace tandem::transports::zmq
