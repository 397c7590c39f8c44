#pragma once
// The tcp transport's wire format. Each pair of ranks shares one TCP connection; the higher rank
// connects and opens it with a Hello, then both directions carry frames: a FrameHeader followed by
// `bytes` of payload (data) or nothing (goodbye). Integers are little-endian (the build supports
// little-endian hosts only).
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::transports::tcp {

inline constexpr uint32_t kFrameMagic = 0x504354ad;  // data and goodbye frames
inline constexpr uint32_t kHelloMagic = 0x4f4c4548;  // "HELO"
inline constexpr uint16_t kWireVersion = 1;

enum class Kind : uint16_t { kData = 1, kGoodbye = 2 };

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kWireVersion;
  uint16_t kind = 0;
  int32_t src = 0;
  uint32_t reserved = 0;
  uint64_t tag = 0;
  uint64_t bytes = 0;  // payload that follows
};
static_assert(sizeof(FrameHeader) == 32, "the frame header has a fixed size");

// The first bytes a connecting rank writes: who it is, the nonce the accepting rank published in
// the store (proof that the connector read the job's store) and the connector's own nonce (which
// the acceptor checks against the store in turn).
struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kWireVersion;
  uint16_t reserved = 0;
  int32_t rank = 0;
  uint32_t world = 0;
  uint64_t acceptor_nonce = 0;
  uint64_t connector_nonce = 0;
};
static_assert(sizeof(Hello) == 32, "the hello has a fixed size");

// Checks a frame header read from `peer`'s connection: magic, version, kind, source == peer, tag
// below 2^40, payload at most `max_bytes` (goodbyes carry none). Returns "" when valid, else why not.
std::string check_frame(const FrameHeader& h, int peer, uint64_t max_bytes);

// Checks a hello received by rank `self` of `world`: magic, version, world, rank in (self, world),
// and that it names our nonce. Returns "" when valid, else why not (the connector's nonce is
// checked by the caller, which reads it from the store).
std::string check_hello(const Hello& h, int self, int world, uint64_t own_nonce);

}  // namespace tandem::transports::tcp
