#include "transports/tcp/wire.hpp"

#include <bit>

#include <fmt/format.h>

namespace tandem::transports::tcp {

static_assert(std::endian::native == std::endian::little, "the tcp wire format is little-endian");

std::string check_frame(const FrameHeader& h, int peer, uint64_t max_bytes) {
  if (h.magic != kFrameMagic) return fmt::format("bad frame magic 0x{:08x}", h.magic);
  if (h.version != kWireVersion) return fmt::format("wire version {}, expected {}", h.version, kWireVersion);
  if (h.kind != static_cast<uint16_t>(Kind::kData) && h.kind != static_cast<uint16_t>(Kind::kGoodbye))
    return fmt::format("unknown frame kind {}", h.kind);
  if (h.src != peer) return fmt::format("frame claims to come from rank {}", h.src);
  if (h.tag >= (uint64_t{1} << 40)) return fmt::format("tag {} is not below 2^40", h.tag);
  if (h.kind == static_cast<uint16_t>(Kind::kGoodbye) && h.bytes != 0)
    return fmt::format("goodbye frame carries {} bytes", h.bytes);
  if (h.bytes > max_bytes) return fmt::format("frame declares {} bytes, above the limit of {}", h.bytes, max_bytes);
  return {};
}

std::string check_hello(const Hello& h, int self, int world, uint64_t own_nonce) {
  if (h.magic != kHelloMagic) return fmt::format("bad hello magic 0x{:08x}", h.magic);
  if (h.version != kWireVersion) return fmt::format("wire version {}, expected {}", h.version, kWireVersion);
  if (h.world != static_cast<uint32_t>(world)) return fmt::format("hello for a world of {}, ours is {}", h.world, world);
  if (h.rank <= self || h.rank >= world)
    return fmt::format("hello from rank {}, expected a rank in ({}, {})", h.rank, self, world);
  if (h.acceptor_nonce != own_nonce) return "hello does not carry this rank's nonce";
  return {};
}

}  // namespace tandem::transports::tcp
