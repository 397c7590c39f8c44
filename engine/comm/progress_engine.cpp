#include "engine/comm/progress_engine.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

using Clock = std::chrono::steady_clock;

namespace {

// Idle progress threads look at the control tag this often (aborts from peers).
constexpr auto kIdlePoll = std::chrono::milliseconds(20);
// How long a new operation is left to its caller's wait() before the progress thread starts it.
constexpr auto kClaimWindow = std::chrono::microseconds(50);
// A communicator that completed something this recently counts as busy: its progress thread polls
// the queue every kActivePoll instead of being woken per operation.
constexpr auto kActiveWindow = std::chrono::milliseconds(50);
constexpr auto kActivePoll = std::chrono::microseconds(500);

bool recently_active(const std::atomic<int64_t>& activity) {
  return steady_now_ns() - activity.load(std::memory_order_relaxed) <
         std::chrono::duration_cast<std::chrono::nanoseconds>(kActiveWindow).count();
}

class WorkImpl final : public Work {
 public:
  WorkImpl(std::shared_ptr<OpState> op, ProgressEngine* engine) : op_(std::move(op)), engine_(engine) {}
  bool test() override {
    const int s = op_->state.load(std::memory_order_acquire);
    if (s == 2) throw Error(op_->status, op_->message);
    return s == 1;
  }
  void wait() override {
    // When the progress thread is idle, this thread runs the queue itself up to its operation:
    // no hand-off between threads on the latency path. Otherwise it sleeps until completion.
    if (op_->state.load(std::memory_order_acquire) == 0 && engine_->drive_until_done(*op_)) {
      test();
      return;
    }
    std::unique_lock lock(op_->mu);
    while (op_->state.load(std::memory_order_acquire) == 0) {
      op_->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (op_->state.load(std::memory_order_acquire) != 0) break;
      // The progress thread enforces deadlines; this only guards against it being stuck itself.
      const auto stalled = std::chrono::nanoseconds(steady_now_ns() - op_->activity->load(std::memory_order_relaxed));
      const auto limit = 2 * op_->timeout + std::chrono::seconds(5);
      if (stalled > limit)
        TANDEM_THROW(Status::kTimeout, "operation did not complete: the communicator made no progress for {} ms",
                     std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count());
    }
    lock.unlock();
    test();
  }

 private:
  std::shared_ptr<OpState> op_;
  ProgressEngine* engine_;  // valid while the operation is pending (the engine drains its queue on destruction)
};

}  // namespace

// ------------------------------------------------------------------------------- construction

ProgressEngine::ProgressEngine(SharedTransport& shared, PeerTable& peers, std::vector<int> members, uint32_t comm_id,
                               CommOptions options, Topology topology)
    : shared_(shared),
      transport_(shared.transport()),
      peers_(peers),
      rank_(peers.rank()),
      size_(static_cast<int>(members.size())),
      members_(std::move(members)),
      comm_id_(comm_id),
      options_(std::move(options)),
      grace_(std::clamp(options_.timeout / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(2000))),
      settings_(settings::current()),
      activity_(std::make_shared<std::atomic<int64_t>>(steady_now_ns())),
      plans_(rank_, std::move(topology)) {
  thread_ = std::thread([this] { progress_main(); });
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& op : p2p_) shared_.bury(op);  // buffered sends not yet delivered: request, header and payload
  if (peers_.is_failed()) {  // abandoned sends may still read the header and scratch until the transport goes
    shared_.bury(send_header_);
    shared_.bury(std::make_shared<AlignedBuffer>(std::move(scratch_)));
    shared_.bury(std::make_shared<AlignedBuffer>(std::move(staging_)));
  }
}

// -------------------------------------------------------------------------------------- calls

std::unique_ptr<Work> ProgressEngine::enqueue(std::shared_ptr<OpState> op) {
  op->activity = activity_;
  op->timeout = options_.timeout;
  op->enqueued = Clock::now();
  {
    std::lock_guard lock(mu_);
    peers_.check_usable();
    TANDEM_CHECK(!stopping_, Status::kInvalidArgument, "communicator is being destroyed");
    if (op->kind != WireKind::kSend && op->kind != WireKind::kRecv) op->seq = next_seq_++;
    queue_.push_back(op);
    // An idle progress thread sleeps long: wake it. A busy one polls the queue on its own.
    if (recently_active(*activity_)) return std::make_unique<WorkImpl>(std::move(op), this);
    wake_ = true;
  }
  cv_.notify_one();
  return std::make_unique<WorkImpl>(std::move(op), this);
}

void ProgressEngine::request_abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted by the application" : reason;
    abort_requested_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------- progress thread

void ProgressEngine::progress_main() {
  const settings::Scope scope(settings_);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto abort_pending = [&] { return abort_requested_.load() && !peers_.is_failed(); };
      auto p2p_pending = [&] { return p2p_count_.load(std::memory_order_acquire) > 0; };
      // While the communicator is busy, look at the queue every kActivePoll without being woken:
      // callers then enqueue without waking this thread (a wake-up per operation costs a
      // caller-driven 4 KiB exchange several times its duration on a small machine).
      cv_.wait_for(lock, recently_active(*activity_) ? kActivePoll : kIdlePoll,
                   [&] { return stopping_ || abort_pending() || wake_ || (p2p_pending() && !caller_driving_.load()); });
      wake_ = false;
      // Buffered sends still in flight are left to the transport (buried below), which delivers them
      // or, being destroyed, flushes them within its deadline.
      if (stopping_ && queue_.empty() && p2p_awaited_.load(std::memory_order_acquire) == 0) break;
      if (caller_driving_.load(std::memory_order_acquire) && !stopping_) continue;
      // A fresh operation is left a moment to its caller: one that waits at once runs it on its
      // own thread (no hand-off); one that does not is started once the claim window is over.
      if (!queue_.empty() && !stopping_ && !abort_pending()) {
        const auto claim_until = queue_.front()->enqueued + kClaimWindow;
        if (Clock::now() < claim_until) {
          cv_.wait_until(lock, claim_until, [&] { return caller_driving_.load() || stopping_ || abort_pending(); });
          continue;
        }
      }
    }
    // Idle as well: poll the control tag (aborts from peers) and point-to-point operations.
    std::unique_lock engine(engine_mu_, std::try_to_lock);
    if (engine.owns_lock()) step();
  }
}

int ProgressEngine::at_fault(int peer) const {
  const int t = members_[static_cast<size_t>(peer)];
  return transport_.at_fault(t) == t ? peer : rank_;
}

void ProgressEngine::throw_abort(const std::string& reason) {
  peers_.blame(rank_, true, {});
  TANDEM_THROW(Status::kPeerFailure, "rank {} aborted the communicator: {}", rank_, reason);
}

void ProgressEngine::step() {
  std::shared_ptr<OpState> op;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) {
      op = std::move(queue_.front());
      queue_.pop_front();
    }
  }
  try {
    if (abort_requested_.load(std::memory_order_acquire) && !peers_.is_failed()) {
      std::string reason;
      {
        std::lock_guard lock(mu_);
        reason = abort_reason_;
      }
      throw_abort(reason);
    }
    if (op) {
      if (peers_.is_failed()) {
        fail(Status::kOk, "", false, op.get());
      } else if (op->kind == WireKind::kSend || op->kind == WireKind::kRecv) {
        post_p2p(op);
      } else {
        current_ = op.get();
        run_collective(*op);
        current_ = nullptr;
      }
    } else if (!peers_.is_failed()) {
      peers_.poll();
      if (!p2p_.empty()) {
        const auto before = p2p_.size();
        poll_p2p();
        if (p2p_.size() == before) transport_.wait_for_progress(std::chrono::microseconds(200));
      }
    } else {
      peers_.poll();  // the other ranks' reports of the failure: every rank settles on the same blame
      drop_unexpected();
    }
  } catch (const Error& e) {
    if (!peers_.blamed() && executor_.failed_peer() >= 0)
      peers_.blame(rank_, false, {at_fault(executor_.failed_peer())});
    Status st = e.status();
    std::string msg = e.what();
    // A peer that failed first and left: its abort (sent before it closed) says why.
    if (st == Status::kPeerFailure || st == Status::kTransport) {
      const auto until = Clock::now() + std::chrono::milliseconds(50);
      try {
        while (Clock::now() < until) {
          peers_.poll();
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      } catch (const Error& why) {
        st = why.status();
        msg = why.what();
      }
    }
    fail(st, msg, true, op.get());
    current_ = nullptr;
  } catch (const std::exception& e) {
    fail(Status::kInternal, e.what(), true, op.get());
    current_ = nullptr;
  }
}

bool ProgressEngine::drive_until_done(const OpState& op) {
  std::unique_lock engine(engine_mu_, std::try_to_lock);
  if (!engine.owns_lock()) return false;
  caller_driving_.store(true, std::memory_order_release);
  while (op.state.load(std::memory_order_acquire) == 0) step();
  caller_driving_.store(false, std::memory_order_release);
  engine.unlock();
  bool left;
  {
    std::lock_guard lock(mu_);
    left = !queue_.empty() || p2p_count_.load(std::memory_order_acquire) > 0;
  }
  if (left) {  // the progress thread takes over what is left
    {
      std::lock_guard lock(mu_);
      wake_ = true;
    }
    cv_.notify_all();
  }
  return true;
}

// -------------------------------------------------------------------------------- collectives

void ProgressEngine::run_collective(OpState& op) {
  const PlanRequest req = plan_request_for(op, rank_, size_, options_);
  const CompiledPlan* cached = plans_.find(req);
  if (!cached) {
    cached = &plans_.build(req);
    log::debug("comm {} rank {}: {} -> {}", comm_id_, rank_, describe_op(op), cached->description);
  }
  const CompiledPlan& plan = *cached;
  const size_t es = dtype_size(op.dtype);
  ExecBuffers buf;
  buf.dtype = op.dtype;
  buf.op = op.op;
  buf.base[0] = static_cast<unsigned char*>(const_cast<void*>(op.send));
  buf.base[1] = static_cast<unsigned char*>(op.recv);
  buf.base[2] = plan.scratch_count ? scratch_.reserve(plan.scratch_count * es) : nullptr;
  // Input and output that overlap other than in the in-place layout: work on a copy of the input.
  Plan shape;
  shape.collective = req.collective;
  shape.world = size_;
  shape.root = req.root;
  shape.count = req.count;
  const size_t in_bytes = plan_buffer_count(shape, Buffer::kInput, rank_) * es;
  const size_t out_bytes = plan_buffer_count(shape, Buffer::kOutput, rank_) * es;
  if (!req.in_place && in_bytes && out_bytes && buf.base[0] < buf.base[1] + out_bytes &&
      buf.base[1] < buf.base[0] + in_bytes) {
    unsigned char* copy = staging_.reserve(in_bytes);
    std::memcpy(copy, buf.base[0], in_bytes);
    buf.base[0] = copy;
  }
  *send_header_ = WireHeader{};
  send_header_->comm_id = comm_id_;
  send_header_->seq = op.seq;
  send_header_->count = op.count;
  send_header_->chunk = plan.chunk_count;
  send_header_->root = req.collective == Collective::kBroadcast || req.collective == Collective::kReduce ? op.root : 0;
  send_header_->sender = rank_;
  send_header_->kind = static_cast<uint8_t>(op.kind);
  send_header_->algorithm = static_cast<uint8_t>(plan.algorithm);
  send_header_->dtype = static_cast<uint8_t>(op.dtype);
  const bool reduces = op.kind == WireKind::kAllreduce || op.kind == WireKind::kReduceScatter ||
                       op.kind == WireKind::kReduce;
  send_header_->op = reduces ? static_cast<uint8_t>(op.op) : 0;
  grace_started_ = false;
  if ((op.kind == WireKind::kBroadcast || op.kind == WireKind::kReduce) && size_ > 1) agree_on_root(op);
  executor_.run(plan, buf, transport_, members_, collective_tag(comm_id_), *send_header_, *this);
  if (reduces && op.op == ReduceOp::kAvg && out_bytes) divide_by(buf.base[1], out_bytes / es, op.dtype, size_);
  activity_->store(steady_now_ns(), std::memory_order_relaxed);
  op.complete(Status::kOk, "");
}

void ProgressEngine::agree_on_root(const OpState& op) {
  // Ranks that disagree on the root may never receive anything from each other (two ranks that both
  // think they are the root only send), so the data plan alone cannot see it. Before any data moves,
  // the ranks allreduce (min) root * 2^32 + rank and -root * 2^32 + rank: every rank learns the
  // smallest and the largest root passed, each with the lowest rank that passed it, and reaches
  // the same verdict. The messages carry this operation's header without its root, so a rank that
  // called something else entirely is still told apart by the header.
  PlanRequest req;
  req.collective = Collective::kAllreduce;
  req.world = size_;
  req.count = 2;
  req.elem_bytes = sizeof(int64_t);
  const CompiledPlan* plan = plans_.find(req);
  if (!plan) plan = &plans_.build(req);
  constexpr int64_t kShift = int64_t{1} << 32;
  root_vote_[0] = op.root * kShift + rank_;
  root_vote_[1] = -op.root * kShift + rank_;
  ExecBuffers buf;
  buf.dtype = DType::kI64;
  buf.op = ReduceOp::kMin;
  buf.base[0] = reinterpret_cast<unsigned char*>(&root_vote_[0]);
  buf.base[1] = reinterpret_cast<unsigned char*>(&root_vote_[2]);
  buf.base[2] = plan->scratch_count ? scratch_.reserve(plan->scratch_count * sizeof(int64_t)) : nullptr;
  send_header_->root = 0;
  executor_.run(*plan, buf, transport_, members_, collective_tag(comm_id_), *send_header_, *this);
  send_header_->root = op.root;
  const auto low_root = static_cast<int>(root_vote_[2] >> 32), low_rank = static_cast<int>(root_vote_[2] & 0xffffffff);
  const auto high_root = static_cast<int>(-(root_vote_[3] >> 32)), high_rank = static_cast<int>(root_vote_[3] & 0xffffffff);
  if (low_root == high_root) return;
  // Every rank found it at once: all of them name rank 0 as the origin and blame the two ranks quoted.
  peers_.blame(0, false, {low_rank, high_rank});
  TANDEM_THROW(Status::kMismatch,
               "rank {}: {} (op #{}): the ranks disagree on the root: rank {} passed root {}, rank {} passed root {}",
               rank_, describe_op(op), op.seq, low_rank, low_root,
               high_rank, high_root);
}

// ----------------------------------------------------------------------------- point-to-point

void ProgressEngine::post_p2p(const std::shared_ptr<OpState>& op) {
  const size_t bytes = op->count * dtype_size(op->dtype);
  WireHeader& h = op->header;
  h.comm_id = comm_id_;
  h.count = op->count;
  h.root = static_cast<int32_t>(op->tag);
  h.sender = rank_;
  h.kind = static_cast<uint8_t>(WireKind::kSend);  // a receive expects a send's header
  h.algorithm = static_cast<uint8_t>(Algorithm::kDirect);
  h.dtype = static_cast<uint8_t>(op->dtype);
  const int peer = members_[static_cast<size_t>(op->peer)];
  const uint64_t tag = p2p_tag(comm_id_, op->tag);
  if (op->kind == WireKind::kSend) {
    // Buffered send, alike on every transport: the transport gets a copy, so the caller's send completes
    // now and its buffer is free at once, whether or not the peer has posted its receive (ucx and inproc
    // would otherwise hold a large send until then: a ring of blocking sends deadlocked there).
    op->payload.assign(static_cast<const unsigned char*>(op->send), static_cast<const unsigned char*>(op->send) + bytes);
    const std::array<transports::ConstPart, 2> parts{transports::ConstPart{&h, sizeof(h)},
                                                     transports::ConstPart{op->payload.data(), bytes}};
    op->request = transport_.isend(peer, tag, std::span(parts.data(), bytes ? 2 : 1));
    op->detached = true;
  } else {
    const std::array<transports::MutPart, 2> parts{transports::MutPart{&op->received, sizeof(WireHeader)},
                                                   transports::MutPart{op->recv, bytes}};
    op->request = transport_.irecv(peer, tag, std::span(parts.data(), bytes ? 2 : 1));
  }
  op->posted = Clock::now();
  p2p_.push_back(op);
  p2p_count_.store(p2p_.size(), std::memory_order_release);
  if (!op->detached) p2p_awaited_.fetch_add(1, std::memory_order_acq_rel);
  if (op->detached) {
    activity_->store(steady_now_ns(), std::memory_order_relaxed);
    op->complete(Status::kOk, "");
  }
  poll_p2p();
}

void ProgressEngine::poll_p2p() {
  if (p2p_.empty()) return;
  const auto now = Clock::now();
  for (size_t k = 0; k < p2p_.size();) {
    OpState& op = *p2p_[k];
    bool done = false;
    try {
      done = op.request->test();
    } catch (const Error&) {
      peers_.blame(rank_, false, {at_fault(op.peer)});
      throw;
    }
    if (!done) {
      // A buffered send has completed for its caller; the transport delivers it when the peer receives.
      if (!op.detached && now - op.posted > options_.timeout) {
        peers_.blame(rank_, false, {op.peer});
        TANDEM_THROW(Status::kTimeout, "rank {}: {} {} rank {} did not complete within {} ms", rank_, describe_op(op),
                     op.kind == WireKind::kSend ? "to" : "from", op.peer, options_.timeout.count());
      }
      ++k;
      continue;
    }
    if (op.kind == WireKind::kRecv) {
      const size_t expected = sizeof(WireHeader) + op.count * dtype_size(op.dtype);
      const size_t got = op.request->bytes();
      if (got < sizeof(WireHeader) || !same_operation(op.received, op.header) || got != expected ||
          op.request->truncated()) {
        WireHeader h = op.received;
        if (got < sizeof(WireHeader)) h.magic = 0;
        peers_.blame(rank_, false, {op.peer});
        TANDEM_THROW(Status::kMismatch, "rank {} called {} from rank {} but rank {} sent {}{}", rank_, describe_op(op),
                     op.peer, op.peer, describe_header(h, op.header),
                     same_operation(h, op.header) ? fmt::format(" ({} bytes where {} were expected)", got, expected)
                                                  : "");
      }
    }
    op.request.reset();
    activity_->store(steady_now_ns(), std::memory_order_relaxed);
    auto finished = std::move(p2p_[k]);
    p2p_.erase(p2p_.begin() + static_cast<long>(k));
    p2p_count_.store(p2p_.size(), std::memory_order_release);
    if (finished->detached) continue;
    p2p_awaited_.fetch_sub(1, std::memory_order_acq_rel);
    finished->complete(Status::kOk, "");
  }
}

void ProgressEngine::drop_unexpected() {
  // Messages of this failed communicator nobody will receive: dropping them lets their senders'
  // transports give back the senders' buffers (ucx holds a large send until the receiver takes it).
  constexpr uint64_t kTagBits = (uint64_t{1} << 40) - 1;
  transport_.drop_unexpected(collective_tag(comm_id_), kTagBits);
  transport_.drop_unexpected(p2p_tag(comm_id_, 0), kTagBits & ~uint64_t{kMaxUserTag});
}

// ------------------------------------------------------------------------------ executor hooks

void ProgressEngine::poll() {
  if (!p2p_.empty()) poll_p2p();
}

void ProgressEngine::backoff(Clock::duration idle_for) {
  // Hand the CPU on at once rather than spin: with more threads than cores (ranks, their progress
  // and I/O threads) a spinning waiter delays the very peer it waits for (measured: a 4 KiB
  // exchange over ucx took 25-30 us with 10 us of spinning first, 6-7 us without).
  transport_.wait_for_progress(idle_for < std::chrono::milliseconds(10) ? std::chrono::microseconds(200)
                                                                         : std::chrono::microseconds(1000));
}

void ProgressEngine::idle(const PlanExecutor& ex) {
  const auto now = Clock::now();
  if (now - peers_.last_poll() > std::chrono::microseconds(500)) {
    peers_.poll();
    if (abort_requested_.load(std::memory_order_acquire)) {
      std::lock_guard lock(mu_);
      throw_abort(abort_reason_);
    }
  }
  const auto idle_for = now - ex.last_event();
  if (idle_for > options_.timeout) {
    const OpState& op = *current_;
    if (!grace_started_) {
      // Tell everyone whom this rank waits for, then give the others a moment to say the same.
      grace_started_ = true;
      grace_until_ = now + grace_;
      waited_ = ex.waiting_peers();
      peers_.announce_wait(op.seq, waited_);
    } else if (now > grace_until_) {
      // A rank that announced a timeout of the previous collective is stuck there (alive, waiting for the same
      // culprit, most likely), not missing from this one.
      std::map<int, std::vector<int>> notices = peers_.notices(op.seq);
      if (op.seq > 0)
        for (const auto& prev : peers_.notices(op.seq - 1)) notices.try_emplace(prev.first);
      const TimeoutVerdict v = timeout_verdict(rank_, waited_, notices);
      const std::string why = v.missing.empty() ? "every rank it waited for is stuck as well"
                                                : fmt::format("{} never took part", ranks_phrase(v.missing));
      peers_.blame(rank_, false, v.missing);
      TANDEM_THROW(Status::kTimeout, "rank {}: {} (op #{}) timed out after {} ms waiting for {}: {}{}", rank_,
                   describe_op(op), op.seq, options_.timeout.count(), ranks_phrase(waited_), why,
                   v.stuck.empty() ? "" : fmt::format(" ({} timed out too)", ranks_phrase(v.stuck)));
    }
  }
  backoff(idle_for);
}

void ProgressEngine::bad_message(int peer, const WireHeader& got, size_t got_bytes, size_t expected_bytes) {
  const OpState& op = *current_;
  const bool same = same_operation(got, *send_header_);
  const std::string theirs = describe_header(got, *send_header_);
  const std::string their_seq = got.magic == kWireMagic && got.seq != op.seq ? fmt::format(" as op #{}", got.seq) : "";
  peers_.blame(rank_, false, {peer});
  TANDEM_THROW(Status::kMismatch, "rank {} called {} as op #{} but rank {} sent {}{}{}", rank_, describe_op(op), op.seq,
               peer, theirs, their_seq,
               same ? fmt::format(" in a message of {} bytes where {} were expected", got_bytes, expected_bytes)
                    : std::string());
}

// ---------------------------------------------------------------------------------- failure

void ProgressEngine::fail(Status status, const std::string& message, bool tell_peers, OpState* current) {
  const auto [st, msg] = peers_.fail(status, message, tell_peers);
  // The peers know now (they drop what they will not receive); the transport lets go of the running
  // plan's buffers and of the point-to-point ones before any caller hears of the failure, so a caller
  // may free its buffers as soon as its operation returns the error.
  drop_unexpected();
  executor_.abandon();
  if (current && current->state.load() == 0) current->complete(st, msg);
  for (auto& op : p2p_) {
    if (op->request) op->request->cancel();
    shared_.bury(op);  // a send's header and payload may still be read
    if (!op->detached) op->complete(st, msg);  // a buffered send completed for its caller already
  }
  p2p_.clear();
  p2p_count_.store(0, std::memory_order_release);
  p2p_awaited_.store(0, std::memory_order_release);
  std::deque<std::shared_ptr<OpState>> queued;
  {
    std::lock_guard lock(mu_);
    queued.swap(queue_);
  }
  for (auto& op : queued) op->complete(st, msg);
}

}  // namespace tandem::engine::comm
