#pragma once
// The zmq transport's wire format. A message travels as one or more segments; a segment is one
// ZeroMQ multipart message [header][data frame]... whose data frames cover the message bytes
// [offset, offset + seg_bytes). Segments of one message are consecutive on their connection.
// Integers are little-endian (the build supports little-endian hosts only).
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::transports::zmq {

inline constexpr uint32_t kWireMagic = 0x544e445a;  // "ZDNT"
inline constexpr uint16_t kWireVersion = 1;

enum class Kind : uint16_t { kHello = 1, kData = 2, kGoodbye = 3 };

struct WireHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kWireVersion;
  uint16_t kind = 0;
  int32_t src = 0;
  uint32_t reserved = 0;
  uint64_t tag = 0;
  uint64_t total = 0;      // bytes of the whole message
  uint64_t offset = 0;     // first byte of this segment
  uint64_t seg_bytes = 0;  // bytes in this segment's data frames
};
static_assert(sizeof(WireHeader) == 48, "the wire header has a fixed size");

// Checks a received header frame: size, magic, version, kind, source rank in [0, world), and
// offset + seg_bytes <= total without overflow. Returns an empty string when valid, else why not.
std::string check_header(const void* frame, size_t frame_bytes, int world, WireHeader& out);

}  // namespace tandem::transports::zmq
