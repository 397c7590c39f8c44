#include "transports/tcp/shm_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace tandem::transports::tcp {
namespace {

constexpr size_t kDataOffset = (sizeof(ShmSegmentHeader) + 4095) & ~size_t{4095};
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

bool valid_ring_bytes(uint64_t n) { return n >= kShmMinRing && n <= kShmMaxRing && (n & (n - 1)) == 0; }

// Copies `n` bytes between the ring (at byte `pos` of a ring of `size`) and `buf`, across its end.
void ring_copy_out(const unsigned char* ring, size_t size, uint64_t pos, unsigned char* buf, size_t n) {
  const size_t at = static_cast<size_t>(pos & (size - 1));
  const size_t first = std::min(n, size - at);
  std::memcpy(buf, ring + at, first);
  if (first < n) std::memcpy(buf + first, ring, n - first);
}
void ring_copy_in(unsigned char* ring, size_t size, uint64_t pos, const unsigned char* buf, size_t n) {
  const size_t at = static_cast<size_t>(pos & (size - 1));
  const size_t first = std::min(n, size - at);
  std::memcpy(ring + at, buf, first);
  if (first < n) std::memcpy(ring, buf + first, n - first);
}

}  // namespace

size_t shm_segment_bytes(size_t ring_bytes) { return kDataOffset + 2 * ring_bytes; }

int shm_create_segment(size_t ring_bytes, std::string& why) {
  if (!valid_ring_bytes(ring_bytes)) {
    why = "ring size is not a power of two in [4 KiB, 1 GiB]";
    return -1;
  }
  const int fd = ::memfd_create("tandem-tcp-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    why = std::string("memfd_create: ") + std::strerror(errno);
    return -1;
  }
  const size_t bytes = shm_segment_bytes(ring_bytes);
  void* base = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::fcntl(fd, F_ADD_SEALS, kSeals) != 0 ||
      (base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    why = std::string("sizing the segment: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  auto* h = new (base) ShmSegmentHeader;
  h->ring_bytes = ring_bytes;
  ::munmap(base, bytes);
  return fd;
}

std::unique_ptr<ShmChannel> ShmChannel::map(int fd, bool connector, std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(kDataOffset)) {
    why = "the segment is not a file of at least its header's size";
    return nullptr;
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals) {
    why = "the segment is not sealed against resizing";
    return nullptr;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    why = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  const auto* h = static_cast<const ShmSegmentHeader*>(base);
  const uint64_t ring_bytes = h->ring_bytes;  // read once: the peer may change it later
  if (h->magic != kShmMagic || h->version != kShmVersion || !valid_ring_bytes(ring_bytes) ||
      shm_segment_bytes(ring_bytes) != bytes) {
    why = "the segment's header is not that of a tcp shared-memory segment of its size";
    ::munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmChannel>(new ShmChannel(base, bytes, ring_bytes, connector));
}

ShmChannel::ShmChannel(void* base, size_t bytes, size_t ring_bytes, bool connector)
    : base_(base), bytes_(bytes), ring_bytes_(ring_bytes) {
  auto* h = static_cast<ShmSegmentHeader*>(base);
  auto* data = static_cast<unsigned char*>(base) + kDataOffset;
  const int w = connector ? 0 : 1;
  out_ = &h->ring[w];
  in_ = &h->ring[1 - w];
  out_data_ = data + w * ring_bytes;
  in_data_ = data + (1 - w) * ring_bytes;
}

ShmChannel::~ShmChannel() { ::munmap(base_, bytes_); }

bool ShmChannel::peer_head(uint64_t& head) {
  head = in_->head.load(std::memory_order_acquire);
  if (head - in_tail_ <= ring_bytes_) return true;
  error_ = "its ring's head index " + std::to_string(head) + " lies outside [" + std::to_string(in_tail_) + ", " +
           std::to_string(in_tail_ + ring_bytes_) + "]";
  return false;
}

bool ShmChannel::peer_tail(uint64_t& tail) {
  tail = out_->tail.load(std::memory_order_acquire);
  if (out_head_ - tail <= ring_bytes_) return true;
  error_ = "its ring's tail index " + std::to_string(tail) + " lies outside [" +
           std::to_string(out_head_ >= ring_bytes_ ? out_head_ - ring_bytes_ : 0) + ", " + std::to_string(out_head_) +
           "]";
  return false;
}

ptrdiff_t ShmChannel::write(const iovec* iov, size_t count) {
  uint64_t tail = 0;
  if (!error_.empty() || !peer_tail(tail)) return -1;
  size_t space = ring_bytes_ - static_cast<size_t>(out_head_ - tail);
  size_t done = 0;
  for (size_t k = 0; k < count && space > 0; ++k) {
    const size_t n = std::min(space, iov[k].iov_len);
    ring_copy_in(out_data_, ring_bytes_, out_head_ + done, static_cast<const unsigned char*>(iov[k].iov_base), n);
    done += n;
    space -= n;
  }
  if (done > 0) {
    out_head_ += done;
    out_->head.store(out_head_, std::memory_order_release);
  }
  return static_cast<ptrdiff_t>(done);
}

ptrdiff_t ShmChannel::read(const iovec* iov, size_t count) {
  uint64_t head = 0;
  if (!error_.empty() || !peer_head(head)) return -1;
  size_t avail = static_cast<size_t>(head - in_tail_);
  size_t done = 0;
  for (size_t k = 0; k < count && avail > 0; ++k) {
    const size_t n = std::min(avail, iov[k].iov_len);
    ring_copy_out(in_data_, ring_bytes_, in_tail_ + done, static_cast<unsigned char*>(iov[k].iov_base), n);
    done += n;
    avail -= n;
  }
  if (done > 0) {
    in_tail_ += done;
    in_->tail.store(in_tail_, std::memory_order_release);
  }
  return static_cast<ptrdiff_t>(done);
}

// The waker stores its index, then reads the flag; the sleeper stores the flag, then reads the
// index: with a full fence between on each side, at least one of them sees the other's store.
bool ShmChannel::take_reader_wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return out_->reader_waiting.load(std::memory_order_relaxed) != 0 &&
         out_->reader_waiting.exchange(0, std::memory_order_relaxed) != 0;
}

bool ShmChannel::take_writer_wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return in_->writer_waiting.load(std::memory_order_relaxed) != 0 &&
         in_->writer_waiting.exchange(0, std::memory_order_relaxed) != 0;
}

bool ShmChannel::arm(bool want_space) {
  in_->reader_waiting.store(1, std::memory_order_relaxed);
  if (want_space) out_->writer_waiting.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!error_.empty()) return true;
  uint64_t head = 0, tail = 0;
  if (!peer_head(head) || head != in_tail_) return true;  // data, or an error to report
  if (want_space && (!peer_tail(tail) || out_head_ - tail < ring_bytes_)) return true;
  return false;
}

}  // namespace tandem::transports::tcp
