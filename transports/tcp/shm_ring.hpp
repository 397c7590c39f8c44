#pragma once
// Shared memory between two ranks of one host, for the tcp transport: one segment per pair, two
// single-producer/single-consumer byte rings in it (connector -> acceptor, acceptor -> connector).
// The rings carry the same byte stream as the socket would (frame headers and payloads, wire.hpp),
// so framing, matching and every check on a frame stay the same; a large payload streams through
// the ring, the receiver copying out what the sender wrote while the sender writes the next bytes.
//
// The segment is a sealed memfd: the connector creates it, sizes it, seals its size and passes it
// over the pair's local socket with its hello (SCM_RIGHTS). Nothing is ever named in /dev/shm, so
// nothing is left behind when a rank dies. The socket stays: it carries the hello, the wake-ups of
// a side that blocks (one byte, sent only when the other side said it is about to sleep) and the
// end of stream that tells a dead peer.
//
// The peer is trusted no more than a socket peer: every index read from the segment is checked
// against what this side knows (a reader's head must lie in [tail, tail + ring size], a writer's
// tail in [head - ring size, head]); the segment's size is checked against the fd and must be
// sealed against shrinking, so that a peer cannot turn our accesses into SIGBUS.
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tandem::transports::tcp {

inline constexpr uint32_t kShmMagic = 0x4d485354;  // "TSHM"
inline constexpr uint32_t kShmVersion = 1;
inline constexpr size_t kShmRingBytes = size_t{1} << 20;  // per direction; see bench/allreduce/README.md
inline constexpr size_t kShmMinRing = size_t{4} << 10, kShmMaxRing = size_t{1} << 30;

// One direction's indices, each on its own cache line (the writer stores head, the reader tail).
struct ShmRingControl {
  alignas(64) std::atomic<uint64_t> head{0};  // bytes written since the start
  alignas(64) std::atomic<uint64_t> tail{0};  // bytes consumed since the start
  alignas(64) std::atomic<uint32_t> reader_waiting{0};  // the reader may block: wake it after writing
  std::atomic<uint32_t> writer_waiting{0};              // the writer may block: wake it after reading
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the rings need lock-free 64-bit atomics");

// The segment: this header, the control of ring 0 (connector -> acceptor) and ring 1, then ring 0's
// bytes and ring 1's bytes.
struct ShmSegmentHeader {
  alignas(64) uint32_t magic = kShmMagic;
  uint32_t version = kShmVersion;
  uint64_t ring_bytes = 0;
  ShmRingControl ring[2];
};

// Bytes of a segment with rings of `ring_bytes`.
size_t shm_segment_bytes(size_t ring_bytes);

// Creates a sealed memfd holding a fresh segment with rings of `ring_bytes` (a power of two in
// [kShmMinRing, kShmMaxRing]); -1 with `why` set when it cannot.
int shm_create_segment(size_t ring_bytes, std::string& why);

// One side's view of a pair's segment.
class ShmChannel {
 public:
  // Maps the segment in `fd` (not taken); `connector` picks the ring this side writes (0) or reads
  // (1). nullptr with `why` set when the segment is not one (size, seals, magic, version, ring size).
  static std::unique_ptr<ShmChannel> map(int fd, bool connector, std::string& why);
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Copies the first bytes of `iov` (up to the free space) into the outbound ring: the count
  // written (0: full), or -1 when the peer corrupted the ring (error() says how).
  ptrdiff_t write(const iovec* iov, size_t count);
  // Copies up to the bytes waiting in the inbound ring into `iov`: the count read (0: empty), or -1.
  ptrdiff_t read(const iovec* iov, size_t count);
  // After writing (reading): whether the peer said it may block waiting for data (space) and must
  // be woken; the flag is cleared.
  bool take_reader_wake();
  bool take_writer_wake();
  // Before blocking: tells the peer to wake us for data, and for space too when `want_space`;
  // returns whether there is already something to do (data waiting, or space when wanted).
  bool arm(bool want_space);
  // How the peer corrupted the ring ("" while it has not).
  const std::string& error() const { return error_; }
  size_t ring_bytes() const { return ring_bytes_; }

 private:
  ShmChannel(void* base, size_t bytes, size_t ring_bytes, bool connector);
  // The peer's index, checked against ours; false (error_ set) when it is out of range.
  bool peer_head(uint64_t& head);
  bool peer_tail(uint64_t& tail);

  void* base_;
  size_t bytes_;
  size_t ring_bytes_;
  ShmRingControl* out_;
  ShmRingControl* in_;
  unsigned char* out_data_;
  unsigned char* in_data_;
  uint64_t out_head_ = 0;  // ours: what we wrote
  uint64_t in_tail_ = 0;   // ours: what we consumed
  std::string error_;
};

}  // namespace tandem::transports::tcp
