#include "transports/inproc/inproc_transport.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "transports/completion.hpp"
#include "transports/match_key.hpp"
#include "transports/parts.hpp"

namespace tandem::transports::inproc {
namespace {

using Key = MatchKey;
using KeyHash = MatchKeyHash;

struct RecvOp {
  std::vector<MutPart> parts;
  size_t capacity = 0;
  Completion done;
};

struct SendOp {
  std::vector<ConstPart> parts;  // the sender's buffers (rendezvous) or one part over `owned`
  std::vector<char> owned;       // eager copy
  size_t bytes = 0;
  Completion done;
};

// One receiving rank's matching queues; guarded by `mu`.
struct Mailbox {
  std::mutex mu;
  std::unordered_map<Key, std::deque<std::shared_ptr<RecvOp>>, KeyHash> posted;      // key.peer = source
  std::unordered_map<Key, std::deque<std::shared_ptr<SendOp>>, KeyHash> unexpected;  // key.peer = source
};

// Delivers `send` into `recv` (caller holds the receiver's mailbox lock).
void deliver(SendOp& send, RecvOp& recv) {
  const size_t copied = scatter_copy(send.parts, recv.parts);
  (void)copied;
  recv.done.complete(send.bytes, send.bytes > recv.capacity);
  send.done.complete(send.bytes, false);
}

template <typename Map, typename Pred>
void erase_if_in(Map& map, Pred pred) {
  for (auto it = map.begin(); it != map.end();) {
    auto& q = it->second;
    for (auto qi = q.begin(); qi != q.end();) qi = pred(it->first, **qi) ? q.erase(qi) : qi + 1;
    it = q.empty() ? map.erase(it) : std::next(it);
  }
}

enum class RankState : int { kAbsent = 0, kAlive = 1, kClosed = 2 };

struct Fabric {
  Fabric(std::string k, int n) : key(std::move(k)), size(n), boxes(n), states(n, RankState::kAbsent) {
    for (auto& b : boxes) b = std::make_unique<Mailbox>();
  }
  const std::string key;
  const int size;
  std::vector<std::unique_ptr<Mailbox>> boxes;

  // Wakes rank r's wait_for_progress when another thread completes one of its requests.
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t seq = 0;
  };
  std::vector<Signal> signals = std::vector<Signal>(static_cast<size_t>(size));
  void notify(int r) {
    {
      std::lock_guard l(signals[r].mu);
      ++signals[r].seq;
    }
    signals[r].cv.notify_all();
  }

  // Membership, guarded by members_mu (mailbox locks are taken after it, never before).
  std::mutex members_mu;
  std::condition_variable members_cv;
  std::vector<RankState> states;
  int joined = 0;
  std::vector<std::atomic<bool>> closed_flags = std::vector<std::atomic<bool>>(static_cast<size_t>(size));

  bool closed(int r) const noexcept { return closed_flags[r].load(std::memory_order_acquire); }
};

std::mutex g_fabrics_mu;
std::map<std::string, std::weak_ptr<Fabric>>& fabrics() {
  static std::map<std::string, std::weak_ptr<Fabric>> m;
  return m;
}

std::shared_ptr<Fabric> find_or_make_fabric(const TransportOptions& o) {
  // The ranks of one job share their store: its identity keeps two jobs of one process apart even
  // where their key prefixes agree (every job's first communicator is "tandem/comm0/").
  const std::string key = fmt::format("{}@{}", o.key_prefix, static_cast<const void*>(o.store));
  std::lock_guard lock(g_fabrics_mu);
  auto& map = fabrics();
  std::shared_ptr<Fabric> f = map[key].lock();
  if (!f) {
    // The deleter unregisters the key, unless a newer fabric has taken it meanwhile.
    f = std::shared_ptr<Fabric>(new Fabric(key, o.size), [key](Fabric* p) {
      {
        std::lock_guard l(g_fabrics_mu);
        auto it = fabrics().find(key);
        if (it != fabrics().end() && it->second.expired()) fabrics().erase(it);
      }
      std::default_delete<Fabric>()(p);
    });
    map[key] = f;
  }
  return f;
}

std::shared_ptr<Fabric> join_fabric(const TransportOptions& o) {
  // Checked outside g_fabrics_mu: if a throw drops the last reference, the deleter takes that lock.
  std::shared_ptr<Fabric> f = find_or_make_fabric(o);
  TANDEM_CHECK(f->size == o.size, Status::kMismatch,
               "inproc: rank {} joins fabric '{}' with size {}, but it was created with size {}", o.rank,
               o.key_prefix, o.size, f->size);
  std::lock_guard m(f->members_mu);
  TANDEM_REQUIRE(f->states[o.rank] == RankState::kAbsent,
                 "inproc: rank {} already joined fabric '{}' (key_prefix must be unique per communicator)", o.rank,
                 o.key_prefix);
  f->states[o.rank] = RankState::kAlive;
  ++f->joined;
  f->members_cv.notify_all();
  return f;
}

class InprocRecv final : public Request {
 public:
  InprocRecv(std::shared_ptr<Fabric> f, int me, int peer, uint64_t tag, std::shared_ptr<RecvOp> op)
      : fabric_(std::move(f)), me_(me), key_{peer, tag}, op_(std::move(op)) {}
  ~InprocRecv() override { cancel(); }
  bool test() override { return op_->done.test(); }
  size_t bytes() const override { return op_->done.bytes(); }
  bool truncated() const override { return op_->done.truncated(); }
  void cancel() override {
    if (!op_->done.pending()) return;
    Mailbox& box = *fabric_->boxes[me_];
    std::lock_guard lock(box.mu);  // after this, no sender is copying into our parts
    auto it = box.posted.find(key_);
    if (it != box.posted.end()) {
      std::erase(it->second, op_);
      if (it->second.empty()) box.posted.erase(it);
    }
    op_->done.fail(Status::kTransport, fmt::format("inproc: receive from rank {} tag {} was cancelled", key_.peer, key_.tag));
  }

 private:
  std::shared_ptr<Fabric> fabric_;
  int me_;
  Key key_;
  std::shared_ptr<RecvOp> op_;
};

class InprocSend final : public Request {
 public:
  InprocSend(std::shared_ptr<Fabric> f, int me, int peer, uint64_t tag, std::shared_ptr<SendOp> op)
      : fabric_(std::move(f)), me_(me), peer_(peer), tag_(tag), op_(std::move(op)) {}
  ~InprocSend() override { cancel(); }
  bool test() override { return op_->done.test(); }
  size_t bytes() const override { return op_->bytes; }
  bool truncated() const override { return false; }
  void cancel() override {
    if (!op_->done.pending()) return;
    Mailbox& box = *fabric_->boxes[peer_];
    std::lock_guard lock(box.mu);  // after this, no receiver is copying from our parts
    auto it = box.unexpected.find(Key{me_, tag_});
    if (it != box.unexpected.end()) {
      std::erase(it->second, op_);
      if (it->second.empty()) box.unexpected.erase(it);
    }
    op_->done.fail(Status::kTransport, fmt::format("inproc: send to rank {} tag {} was cancelled", peer_, tag_));
  }

 private:
  std::shared_ptr<Fabric> fabric_;
  int me_, peer_;
  uint64_t tag_;
  std::shared_ptr<SendOp> op_;
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(const TransportOptions& o) : rank_(o.rank), size_(o.size) {
    fabric_ = join_fabric(o);
    std::unique_lock m(fabric_->members_mu);
    const bool all = fabric_->members_cv.wait_for(m, o.connect_timeout, [&] { return fabric_->joined == size_; });
    if (!all) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (fabric_->states[r] == RankState::kAbsent) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      m.unlock();
      close();
      TANDEM_THROW(Status::kTimeout, "inproc: rank {} waited {} ms on fabric '{}' for rank(s) {} to join", rank_,
                   o.connect_timeout.count(), o.key_prefix, missing);
    }
  }
  ~InprocTransport() override { close(); }

  const char* name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Capabilities capabilities() const override { return Capabilities{.shared_memory = true}; }
  void progress() override {}
  std::vector<int> dead_peers() override {  // a peer that destroyed its transport: the fabric says so at once
    std::vector<int> out;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && fabric_->closed(r)) out.push_back(r);
    return out;
  }
  void wait_for_progress(std::chrono::microseconds timeout) override {
    auto& sig = fabric_->signals[rank_];
    std::unique_lock l(sig.mu);
    sig.cv.wait_for(l, timeout, [&] { return sig.seq != last_seen_; });
    last_seen_ = sig.seq;
  }

  std::unique_ptr<Request> isend(int peer, uint64_t tag, std::span<const ConstPart> parts) override {
    check_peer(peer, tag, "send to");
    auto op = std::make_shared<SendOp>();
    op->bytes = total_bytes(parts);
    Mailbox& box = *fabric_->boxes[peer];
    {
      std::lock_guard lock(box.mu);
      const Key key{rank_, tag};
      auto it = box.posted.find(key);
      if (fabric_->closed(peer)) {
        op->done.fail(Status::kPeerFailure,
                      fmt::format("inproc: send to rank {} tag {}: rank {} has closed its transport", peer, tag, peer));
      } else if (it != box.posted.end()) {
        std::shared_ptr<RecvOp> recv = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) box.posted.erase(it);
        op->parts.assign(parts.begin(), parts.end());
        deliver(*op, *recv);
        fabric_->notify(peer);
      } else {
        if (op->bytes <= kEagerBytes) {
          op->owned.resize(op->bytes);
          scatter_copy(parts, std::span<const MutPart>(std::array{MutPart{op->owned.data(), op->bytes}}));
          op->parts = {ConstPart{op->owned.data(), op->bytes}};
        } else {
          op->parts.assign(parts.begin(), parts.end());
        }
        box.unexpected[key].push_back(op);
        if (op->bytes <= kEagerBytes) op->done.complete(op->bytes, false);
      }
    }
    return std::make_unique<InprocSend>(fabric_, rank_, peer, tag, std::move(op));
  }

  std::unique_ptr<Request> irecv(int peer, uint64_t tag, std::span<const MutPart> parts) override {
    check_peer(peer, tag, "receive from");
    auto op = std::make_shared<RecvOp>();
    op->parts.assign(parts.begin(), parts.end());
    op->capacity = total_bytes(parts);
    Mailbox& box = *fabric_->boxes[rank_];
    {
      std::lock_guard lock(box.mu);
      const Key key{peer, tag};
      auto it = box.unexpected.find(key);
      if (it != box.unexpected.end()) {
        std::shared_ptr<SendOp> send = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) box.unexpected.erase(it);
        const bool rendezvous = send->done.pending();
        deliver(*send, *op);
        if (rendezvous) fabric_->notify(peer);
      } else if (fabric_->closed(peer)) {
        op->done.fail(Status::kPeerFailure, fmt::format("inproc: receive from rank {} tag {}: rank {} has closed its transport",
                                                        peer, tag, peer));
      } else {
        box.posted[key].push_back(op);
      }
    }
    return std::make_unique<InprocRecv>(fabric_, rank_, peer, tag, std::move(op));
  }

 private:
  void check_peer(int peer, uint64_t tag, const char* what) const {
    TANDEM_REQUIRE(peer >= 0 && peer < size_, "inproc: rank {} cannot {} rank {}: the world has {} ranks", rank_, what,
                   peer, size_);
    TANDEM_REQUIRE(tag < (uint64_t{1} << 40), "inproc: tag {} is not below 2^40", tag);
  }

  // Leaves the fabric: our own pending operations are cancelled, peers' receives from us fail,
  // their rendezvous sends to us fail, and our messages already sent stay deliverable (pending ones are copied).
  void close() noexcept {
    if (!fabric_) return;
    Fabric& f = *fabric_;
    {
      std::lock_guard m(f.members_mu);
      f.states[rank_] = RankState::kClosed;
    }
    f.closed_flags[rank_].store(true, std::memory_order_release);
    try {
      const std::string gone = fmt::format("inproc: rank {} closed its transport", rank_);
      for (int q = 0; q < size_; ++q) {
        Mailbox& box = *f.boxes[q];
        std::lock_guard lock(box.mu);
        if (q == rank_) {
          erase_if_in(box.posted, [&](const Key& k, RecvOp& r) {
            r.done.fail(Status::kTransport, fmt::format("inproc: receive from rank {} tag {} cancelled: transport destroyed",
                                                        k.peer, k.tag));
            return true;
          });
          erase_if_in(box.unexpected, [&](const Key& k, SendOp& s) {
            s.done.fail(Status::kPeerFailure, fmt::format("{} before receiving tag {} from rank {}", gone, k.tag, k.peer));
            return true;
          });
        } else {
          erase_if_in(box.posted, [&](const Key& k, RecvOp& r) {
            if (k.peer != rank_) return false;
            r.done.fail(Status::kPeerFailure, fmt::format("{}; receive of tag {} on rank {} cannot complete", gone, k.tag, q));
            return true;
          });
          erase_if_in(box.unexpected, [&](const Key& k, SendOp& s) {
            if (k.peer != rank_ || !s.done.pending()) return false;  // eager: already a copy, stays deliverable
            // A send still waiting for its receive is flushed into the fabric, as a socket's kernel buffer
            // would: its data is copied now (the sender's buffer goes with the transport) and stays
            // deliverable to the live peer, which may post the receive after we are gone.
            try {
              s.owned.resize(s.bytes);
              scatter_copy(s.parts, std::span<const MutPart>(std::array{MutPart{s.owned.data(), s.bytes}}));
              s.parts = {ConstPart{s.owned.data(), s.bytes}};
              s.done.complete(s.bytes, false);
              return false;
            } catch (const std::exception&) {
              s.done.fail(Status::kTransport, fmt::format("inproc: send to rank {} tag {} of {} bytes could not be "
                                                          "flushed when the transport closed (out of memory)",
                                                          q, k.tag, s.bytes));
              return true;
            }
          });
        }
      }
    } catch (const std::exception& e) {
      log::error("inproc: closing rank {}: {}", rank_, e.what());
    }
    for (int q = 0; q < size_; ++q) f.notify(q);
    fabric_.reset();
  }

  int rank_, size_;
  std::shared_ptr<Fabric> fabric_;
  uint64_t last_seen_ = 0;  // signals[rank_].seq at the last wait_for_progress (guarded by its mutex)
};

}  // namespace

std::unique_ptr<Transport> create(const TransportOptions& options) {
  TANDEM_REQUIRE(options.size >= 1, "inproc: world size must be at least 1, got {}", options.size);
  TANDEM_REQUIRE(options.rank >= 0 && options.rank < options.size, "inproc: rank {} is outside [0, {})", options.rank,
                 options.size);
  return std::make_unique<InprocTransport>(options);
}

}  // namespace tandem::transports::inproc
