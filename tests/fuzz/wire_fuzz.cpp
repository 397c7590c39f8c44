// The transports' and the communicator's wire decoders: what a peer (or anything that reaches the port) sends.
#include <algorithm>
#include <cstring>

#include "engine/comm/peer_table.hpp"
#include "engine/comm/wire.hpp"
#include "tests/fuzz/fuzz_target.hpp"
#include "transports/tcp/wire.hpp"
#include "transports/zmq/wire.hpp"

namespace {

// The next sizeof(T) bytes as a T (zero-padded at the end of the input).
template <typename T>
T take(const uint8_t*& data, size_t& size) {
  T v{};
  const size_t n = std::min(size, sizeof(T));
  std::memcpy(&v, data, n);
  data += n;
  size -= n;
  return v;
}

}  // namespace

// [self i8][world u8][max_bytes u32][FrameHeader][Hello]: a frame header and a hello, read by rank `self`.
TANDEM_FUZZ_TARGET(tcp_wire) {
  const int self = take<int8_t>(data, size);
  const int world = take<uint8_t>(data, size);
  const uint64_t max_bytes = take<uint32_t>(data, size);
  const auto frame = take<tandem::transports::tcp::FrameHeader>(data, size);
  const auto hello = take<tandem::transports::tcp::Hello>(data, size);
  (void)tandem::transports::tcp::check_frame(frame, self, max_bytes);
  (void)tandem::transports::tcp::check_hello(hello, self, world, take<uint64_t>(data, size));
}

// [world u8][header frame...]: a header frame of any length, as a ZeroMQ message delivers it.
TANDEM_FUZZ_TARGET(zmq_wire) {
  const int world = take<uint8_t>(data, size);
  tandem::transports::zmq::WireHeader h;
  if (tandem::transports::zmq::check_header(data, size, world, h).empty()) {
    // A valid header keeps its promise: the segment lies inside the message.
    if (h.offset + h.seg_bytes > h.total || h.offset > h.total) __builtin_trap();
  }
}

// [WireHeader (received)][WireHeader (this rank's)][ControlMessage]: how a communicator describes a foreign
// header in a mismatch error, and the rank list of a timeout notice's text.
TANDEM_FUZZ_TARGET(comm_wire) {
  namespace comm = tandem::engine::comm;
  const auto got = take<comm::WireHeader>(data, size);
  const auto own = take<comm::WireHeader>(data, size);
  (void)comm::same_operation(got, own);
  (void)comm::describe_header(got, own);
  (void)comm::describe_call(static_cast<comm::WireKind>(got.kind), static_cast<tandem::DType>(got.dtype),
                            static_cast<tandem::ReduceOp>(got.op), got.count, got.root);
  const auto msg = take<comm::ControlMessage>(data, size);
  const std::string text(msg.text, strnlen(msg.text, sizeof(msg.text)));
  try {
    (void)comm::parse_rank_list(text);
  } catch (const tandem::Error&) {
  }
}
