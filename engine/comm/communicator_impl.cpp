#include "engine/comm/communicator_impl.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "transports/socket_setup.hpp"
#include "transports/memory_store.hpp"

namespace tandem::engine::comm {

using Clock = std::chrono::steady_clock;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return s;
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", rank_list(ranks));
}

// Idle progress threads look at the control tag this often (aborts from peers).
constexpr auto kIdlePoll = std::chrono::milliseconds(20);
// How long a new operation is left to its caller's wait() before the progress thread starts it.
constexpr auto kClaimWindow = std::chrono::microseconds(50);
// A communicator that completed something this recently counts as busy: its progress thread polls
// the queue every kActivePoll instead of being woken per operation.
constexpr auto kActiveWindow = std::chrono::milliseconds(50);
constexpr auto kActivePoll = std::chrono::microseconds(500);

}  // namespace

// ------------------------------------------------------------------------------------ helpers

void SharedTransport::bury(std::shared_ptr<void> p) {
  std::lock_guard lock(mu_);
  graveyard_.push_back(std::move(p));
}

uint32_t SharedTransport::next_id() {
  std::lock_guard lock(mu_);
  return next_id_;
}

void SharedTransport::reserve_ids(uint32_t next) {
  std::lock_guard lock(mu_);
  next_id_ = std::max(next_id_, next);
}

void AlignedBuffer::Free::operator()(unsigned char* p) const noexcept { std::free(p); }

unsigned char* AlignedBuffer::reserve(size_t bytes) {
  if (bytes > size_ || !data_) {
    const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
    TANDEM_CHECK(p != nullptr, Status::kOutOfMemory, "communicator: cannot allocate {} bytes of scratch", rounded);
    data_.reset(p);
    size_ = rounded;
  }
  return data_.get();
}

struct CommunicatorImpl::OpState {
  WireKind kind = WireKind::kAllreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int peer = -1;
  uint32_t tag = 0;
  uint64_t seq = 0;
  Clock::time_point enqueued{};

  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed
  Status status = Status::kOk;
  std::string message;
  std::mutex mu;
  std::condition_variable cv;

  // Point-to-point in flight (progress thread only).
  std::unique_ptr<transports::Request> request;
  WireHeader header, received;
  Clock::time_point posted{};
  // Split's own buffers.
  std::vector<int64_t> split_in, split_out;

  // For Work::wait's stall backstop.
  std::shared_ptr<std::atomic<int64_t>> activity;
  std::chrono::milliseconds timeout{0};

  void complete(Status s, std::string msg) {
    {
      std::lock_guard lock(mu);
      status = s;
      message = std::move(msg);
      state.store(s == Status::kOk ? 1 : 2, std::memory_order_release);
    }
    cv.notify_all();
  }
};

namespace {

class WorkImpl final : public Work {
 public:
  WorkImpl(std::shared_ptr<CommunicatorImpl::OpState> op, CommunicatorImpl* comm) : op_(std::move(op)), comm_(comm) {}
  bool test() override {
    const int s = op_->state.load(std::memory_order_acquire);
    if (s == 2) throw Error(op_->status, op_->message);
    return s == 1;
  }
  void wait() override {
    // When the progress thread is idle, this thread runs the queue itself up to its operation:
    // no hand-off between threads on the latency path. Otherwise it sleeps until completion.
    if (op_->state.load(std::memory_order_acquire) == 0 && comm_->drive_until_done(*op_)) return test_and_return();
    std::unique_lock lock(op_->mu);
    while (op_->state.load(std::memory_order_acquire) == 0) {
      op_->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (op_->state.load(std::memory_order_acquire) != 0) break;
      // The progress thread enforces deadlines; this only guards against it being stuck itself.
      const auto stalled = std::chrono::nanoseconds(now_ns() - op_->activity->load(std::memory_order_relaxed));
      const auto limit = 2 * op_->timeout + std::chrono::seconds(5);
      if (stalled > limit)
        TANDEM_THROW(Status::kTimeout, "operation did not complete: the communicator made no progress for {} ms",
                     std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count());
    }
    lock.unlock();
    test();
  }

 private:
  void test_and_return() { test(); }
  std::shared_ptr<CommunicatorImpl::OpState> op_;
  CommunicatorImpl* comm_;  // valid while the operation is pending (the communicator drains its queue on destruction)
};

}  // namespace

// ------------------------------------------------------------------------------- construction

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<SharedTransport> transport, int rank, std::vector<int> members,
                                   uint32_t comm_id, CommOptions options, std::vector<std::string> hosts)
    : shared_(std::move(transport)),
      transport_(shared_->transport()),
      rank_(rank),
      size_(static_cast<int>(members.size())),
      members_(std::move(members)),
      comm_id_(comm_id),
      options_(std::move(options)),
      hosts_(std::move(hosts)),
      activity_(std::make_shared<std::atomic<int64_t>>(now_ns())) {
  std::map<std::string, int32_t> host_index;
  for (const auto& h : hosts_) {
    auto [it, fresh] = host_index.emplace(h, static_cast<int32_t>(host_index.size()));
    topology_.host_of.push_back(it->second);
  }
  transport_name_ = transport_.name();
  grace_ = std::clamp(options_.timeout / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(2000));
  control_recvs_.resize(static_cast<size_t>(size_));
  control_bufs_.resize(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p)
    if (p != rank_) post_control_recv(p);
  log::debug("comm {}: rank {}/{} over {} ({} host(s)), allreduce {}{}", comm_id_, rank_, size_, transport_name_,
             host_index.size(), algorithm_name(options_.allreduce_algorithm),
             options_.deterministic ? ", deterministic" : "");
  thread_ = std::thread([this] { progress_main(); });
}

CommunicatorImpl::~CommunicatorImpl() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& r : control_recvs_)
    if (r) r->cancel();
  control_recvs_.clear();
  // Give abort messages a moment to leave; their buffers stay with the transport regardless.
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  for (auto& r : control_sends_) {
    try {
      while (!r->test() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
    } catch (const Error&) {
    }
  }
  control_sends_.clear();
  for (auto& b : control_bufs_)
    if (b) shared_->bury(b);
  if (is_failed()) {  // abandoned sends may still read the header and scratch until the transport goes
    shared_->bury(send_header_);
    shared_->bury(std::make_shared<AlignedBuffer>(std::move(scratch_)));
    shared_->bury(std::make_shared<AlignedBuffer>(std::move(staging_)));
  }
}

CommOptions apply_comm_env(const CommOptions& in) {
  CommOptions o = in;
  const CommOptions defaults;
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  auto parse_u64 = [](const char* name, const char* v) {
    uint64_t out = 0;
    const char* end = v + std::strlen(v);
    auto [p, ec] = std::from_chars(v, end, out);
    TANDEM_REQUIRE(ec == std::errc() && p == end && out > 0, "{}='{}' is not a positive integer", name, v);
    return out;
  };
  if (const char* v = env("TANDEM_TRANSPORT"); v && o.transport == defaults.transport) o.transport = v;
  if (const char* v = env("TANDEM_TIMEOUT_MS"); v && o.timeout == defaults.timeout)
    o.timeout = std::chrono::milliseconds(parse_u64("TANDEM_TIMEOUT_MS", v));
  if (const char* v = env("TANDEM_ALLREDUCE_ALGO"); v && o.allreduce_algorithm == Algorithm::kAuto)
    o.allreduce_algorithm = parse_algorithm(v);
  if (const char* v = env("TANDEM_DETERMINISTIC"); v && !o.deterministic) {
    const std::string s = v;
    TANDEM_REQUIRE(s == "0" || s == "1" || s == "true" || s == "false",
                   "TANDEM_DETERMINISTIC='{}' must be 0, 1, true or false", s);
    o.deterministic = s == "1" || s == "true";
  }
  if (const char* v = env("TANDEM_CHUNK_BYTES"); v && o.chunk_bytes == 0)
    o.chunk_bytes = parse_u64("TANDEM_CHUNK_BYTES", v);
  return o;
}

std::unique_ptr<Communicator> Communicator::create(const BootstrapInfo& info,
                                                   std::shared_ptr<transports::KvStore> store,
                                                   const CommOptions& options_in) {
  TANDEM_REQUIRE(info.size >= 1, "communicator: world size must be at least 1 (got {})", info.size);
  TANDEM_REQUIRE(info.rank >= 0 && info.rank < info.size, "communicator: rank {} is outside [0, {})", info.rank,
                 info.size);
  TANDEM_REQUIRE(info.size <= static_cast<int>(std::numeric_limits<int32_t>::max() / 2),
                 "communicator: world size {} is too large", info.size);
  if (!store) {
    TANDEM_REQUIRE(info.size == 1, "communicator: a store is required for {} ranks", info.size);
    store = std::make_shared<transports::MemoryStore>();
  }
  const CommOptions options = apply_comm_env(options_in);
  TANDEM_REQUIRE(options.timeout.count() > 0, "communicator: timeout must be positive (got {} ms)",
                 options.timeout.count());
  TANDEM_REQUIRE(static_cast<uint8_t>(options.allreduce_algorithm) <= static_cast<uint8_t>(Algorithm::kDeterministic) &&
                     options.allreduce_algorithm != Algorithm::kDirect,
                 "communicator: allreduce algorithm {} is not one of auto, ring, hd, tree, hier, det",
                 static_cast<int>(options.allreduce_algorithm));

  // Every world communicator built on one store gets its own key namespace. Ranks create them
  // collectively, so the k-th creation on a store is the same on every rank. Stores are told apart
  // by their control block (kept alive by the weak_ptr, so a new store never looks like an old one).
  static std::mutex gen_mu;
  static std::map<std::weak_ptr<transports::KvStore>, std::map<int, uint64_t>, std::owner_less<>> generations;
  uint64_t gen = 0;
  {
    std::lock_guard lock(gen_mu);
    for (auto it = generations.begin(); it != generations.end();)
      it = it->first.expired() ? generations.erase(it) : std::next(it);
    gen = generations[std::weak_ptr<transports::KvStore>(store)][info.rank]++;
  }
  const std::string prefix = fmt::format("tandem/comm{}/", gen);

  // Host names and the settings ranks must agree on. Ranks group by host name *and* by kernel boot
  // and network namespace (local_host_id): machines that share a name (containers all called
  // "localhost") and the emulated hosts of one machine (bench/emu: a namespace each) are apart.
  std::string host = info.host;
  if (host.empty()) {
    char buf[256] = {};
    host = gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "localhost";
  }
  host += "@" + transports::local_host_id();
  const std::string config = fmt::format("algo={} det={} chunk={}", algorithm_name(options.allreduce_algorithm),
                                         options.deterministic ? 1 : 0, options.chunk_bytes);
  store->set(fmt::format("{}host/{}", prefix, info.rank), host + "\n" + config);
  std::vector<std::string> hosts(static_cast<size_t>(info.size));
  for (int r = 0; r < info.size; ++r) {
    const std::string v = store->get(fmt::format("{}host/{}", prefix, r), options.timeout);
    const size_t nl = v.find('\n');
    hosts[r] = v.substr(0, nl);
    const std::string theirs = nl == std::string::npos ? "" : v.substr(nl + 1);
    TANDEM_CHECK(theirs == config, Status::kMismatch,
                 "communicator: rank {} was created with {} but rank {} with {} (TANDEM_ALLREDUCE_ALGO, "
                 "TANDEM_DETERMINISTIC and TANDEM_CHUNK_BYTES must agree on every rank)",
                 info.rank, config, r, theirs);
  }

  transports::TransportOptions to;
  to.name = options.transport;
  to.rank = info.rank;
  to.size = info.size;
  to.store = store.get();
  to.key_prefix = prefix + "transport/";
  to.connect_timeout = std::max(options.timeout, std::chrono::milliseconds(1000));
  auto shared = std::make_shared<SharedTransport>(transports::create_transport(to));
  std::vector<int> members(static_cast<size_t>(info.size));
  for (int r = 0; r < info.size; ++r) members[r] = r;
  auto comm = std::make_unique<CommunicatorImpl>(std::move(shared), info.rank, std::move(members), 0, options,
                                                 std::move(hosts));
  log::info("comm: rank {}/{} connected over {} (allreduce {}{}, timeout {} ms)", info.rank, info.size,
            comm->transport_name(), algorithm_name(options.allreduce_algorithm),
            options.deterministic ? ", deterministic" : "", options.timeout.count());
  return comm;
}

// ---------------------------------------------------------------------------------- calls

void CommunicatorImpl::check_usable() const {
  if (!is_failed()) return;
  std::lock_guard lock(fail_mu_);
  throw Error(fail_status_, fmt::format("communicator already failed: {}", fail_message_));
}

std::string CommunicatorImpl::failure_message() const {
  std::lock_guard lock(fail_mu_);
  return fail_message_;
}

FailureStatus CommunicatorImpl::failure_status() const {
  FailureStatus f;
  std::lock_guard lock(fail_mu_);
  if (!failed_.load(std::memory_order_acquire)) return f;
  f.failed = true;
  f.status = fail_status_;
  f.origin = fail_origin_;
  f.aborted = fail_aborted_;
  f.ranks = fail_ranks_;
  f.message = fail_message_;
  return f;
}

namespace {

size_t checked_bytes(const char* what, size_t count, size_t factor, DType dtype) {
  TANDEM_REQUIRE(dtype_valid(static_cast<int32_t>(dtype)), "{}: dtype value {} is not a valid dtype", what,
                 static_cast<int>(dtype));
  const size_t es = dtype_size(dtype);
  TANDEM_REQUIRE(factor == 0 || count <= std::numeric_limits<size_t>::max() / factor / es / 2,
                 "{}: count {} overflows the buffer size ({} x {} bytes)", what, count, factor, es);
  return count * factor * es;
}

void check_op(const char* what, ReduceOp op) {
  TANDEM_REQUIRE(reduce_op_valid(static_cast<int32_t>(op)), "{}: reduction op value {} is not valid", what,
                 static_cast<int>(op));
}

void check_ptr(const char* what, const char* name, const void* p, size_t bytes) {
  TANDEM_REQUIRE(p != nullptr || bytes == 0, "{}: {} buffer is null for {} bytes", what, name, bytes);
}

}  // namespace

std::unique_ptr<Work> CommunicatorImpl::enqueue(std::shared_ptr<OpState> op) {
  op->activity = activity_;
  op->timeout = options_.timeout;
  op->enqueued = Clock::now();
  {
    std::lock_guard lock(mu_);
    check_usable();
    TANDEM_CHECK(!stopping_, Status::kInvalidArgument, "communicator is being destroyed");
    if (op->kind != WireKind::kSend && op->kind != WireKind::kRecv) op->seq = next_seq_++;
    queue_.push_back(op);
    // An idle progress thread sleeps long: wake it. A busy one polls the queue on its own.
    const bool active = now_ns() - activity_->load(std::memory_order_relaxed) <
                        std::chrono::duration_cast<std::chrono::nanoseconds>(kActiveWindow).count();
    if (active) return std::make_unique<WorkImpl>(std::move(op), this);
    wake_ = true;
  }
  cv_.notify_one();
  return std::make_unique<WorkImpl>(std::move(op), this);
}

namespace {
std::shared_ptr<CommunicatorImpl::OpState> new_op(WireKind kind, const void* send, void* recv, size_t count,
                                                  DType dtype, ReduceOp op = ReduceOp::kSum, int root = 0) {
  auto s = std::make_shared<CommunicatorImpl::OpState>();
  s->kind = kind;
  s->send = send;
  s->recv = recv;
  s->count = count;
  s->dtype = dtype;
  s->op = op;
  s->root = root;
  return s;
}
}  // namespace

std::unique_ptr<Work> CommunicatorImpl::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = checked_bytes("allreduce", count, 1, dtype);
  check_op("allreduce", op);
  check_ptr("allreduce", "send", send, bytes);
  check_ptr("allreduce", "recv", recv, bytes);
  return enqueue(new_op(WireKind::kAllreduce, send, recv, count, dtype, op));
}

std::unique_ptr<Work> CommunicatorImpl::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                                       ReduceOp op) {
  const size_t in_bytes = checked_bytes("reduce_scatter", count, static_cast<size_t>(size_), dtype);
  check_op("reduce_scatter", op);
  check_ptr("reduce_scatter", "send", send, in_bytes);
  check_ptr("reduce_scatter", "recv", recv, in_bytes / static_cast<size_t>(size_));
  return enqueue(new_op(WireKind::kReduceScatter, send, recv, count, dtype, op));
}

std::unique_ptr<Work> CommunicatorImpl::allgather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t out_bytes = checked_bytes("allgather", count, static_cast<size_t>(size_), dtype);
  check_ptr("allgather", "send", send, out_bytes / static_cast<size_t>(size_));
  check_ptr("allgather", "recv", recv, out_bytes);
  return enqueue(new_op(WireKind::kAllgather, send, recv, count, dtype));
}

std::unique_ptr<Work> CommunicatorImpl::broadcast(void* buf, size_t count, DType dtype, int root) {
  const size_t bytes = checked_bytes("broadcast", count, 1, dtype);
  TANDEM_REQUIRE(root >= 0 && root < size_, "broadcast: root {} is outside [0, {})", root, size_);
  check_ptr("broadcast", "buf", buf, bytes);
  return enqueue(new_op(WireKind::kBroadcast, buf, buf, count, dtype, ReduceOp::kSum, root));
}

std::unique_ptr<Work> CommunicatorImpl::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                               int root) {
  const size_t bytes = checked_bytes("reduce", count, 1, dtype);
  check_op("reduce", op);
  TANDEM_REQUIRE(root >= 0 && root < size_, "reduce: root {} is outside [0, {})", root, size_);
  check_ptr("reduce", "send", send, bytes);
  if (root == rank_) check_ptr("reduce", "recv (on the root)", recv, bytes);
  return enqueue(new_op(WireKind::kReduce, send, recv, count, dtype, op, root));
}

std::unique_ptr<Work> CommunicatorImpl::barrier() {
  return enqueue(new_op(WireKind::kBarrier, nullptr, nullptr, 0, DType::kU8));
}

std::unique_ptr<Work> CommunicatorImpl::point_to_point(WireKind kind, const void* send, void* recv, size_t count,
                                                       DType dtype, int peer, uint32_t tag) {
  const char* what = kind == WireKind::kSend ? "send" : "recv";
  const size_t bytes = checked_bytes(what, count, 1, dtype);
  TANDEM_REQUIRE(peer >= 0 && peer < size_, "{}: peer {} is outside [0, {})", what, peer, size_);
  TANDEM_REQUIRE(tag <= kMaxUserTag, "{}: tag {} is above the largest tag {}", what, tag, kMaxUserTag);
  check_ptr(what, "buf", kind == WireKind::kSend ? send : recv, bytes);
  auto s = new_op(kind, send, recv, count, dtype);
  s->peer = peer;
  s->tag = tag;
  return enqueue(std::move(s));
}

std::unique_ptr<Work> CommunicatorImpl::send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  return point_to_point(WireKind::kSend, buf, nullptr, count, dtype, peer, tag);
}

std::unique_ptr<Work> CommunicatorImpl::recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  return point_to_point(WireKind::kRecv, nullptr, buf, count, dtype, peer, tag);
}

void CommunicatorImpl::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted by the application" : reason;
    abort_requested_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  // The progress thread fails everything and tells the peers; wait (bounded) until it has.
  std::unique_lock lock(fail_mu_);
  fail_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return failed_.load(std::memory_order_acquire); });
}

PlanRequest CommunicatorImpl::request_for(const OpState& op) const {
  PlanRequest r;
  const auto n = static_cast<uint64_t>(size_);
  r.world = size_;
  r.elem_bytes = dtype_size(op.dtype);
  r.root = op.root;
  r.count = op.count;  // r.topology stays empty here (no copy per call); plan_for adds it on a cache miss
  switch (op.kind) {
    case WireKind::kAllreduce:
      r.collective = Collective::kAllreduce;
      r.algorithm = options_.deterministic ? Algorithm::kDeterministic : options_.allreduce_algorithm;
      r.in_place = op.send == op.recv;
      break;
    case WireKind::kReduceScatter:
      r.collective = Collective::kReduceScatter;
      r.algorithm = options_.deterministic ? Algorithm::kDeterministic : Algorithm::kAuto;
      r.count = op.count * n;
      r.in_place = static_cast<const unsigned char*>(op.send) + op.count * r.elem_bytes * static_cast<size_t>(rank_) ==
                   static_cast<const unsigned char*>(op.recv);
      break;
    case WireKind::kAllgather:
    case WireKind::kSplit:
      r.collective = Collective::kAllgather;
      r.count = op.count * n;
      r.in_place = static_cast<const unsigned char*>(op.recv) + op.count * r.elem_bytes * static_cast<size_t>(rank_) ==
                   static_cast<const unsigned char*>(op.send);
      break;
    case WireKind::kBroadcast: r.collective = Collective::kBroadcast; break;
    case WireKind::kReduce:
      r.collective = Collective::kReduce;
      r.algorithm = options_.deterministic ? Algorithm::kDeterministic : Algorithm::kAuto;
      r.in_place = op.send == op.recv;
      break;
    case WireKind::kBarrier: r.collective = Collective::kBarrier; break;
    case WireKind::kSend:
    case WireKind::kRecv: TANDEM_THROW(Status::kInternal, "point-to-point operations have no plan");
  }
  if (op.count == 0) r.in_place = false;
  r.chunk_bytes = effective_chunk_bytes(options_.chunk_bytes, r.count * r.elem_bytes);
  return r;
}

Algorithm CommunicatorImpl::allreduce_algorithm_for(size_t count, DType dtype) const {
  TANDEM_REQUIRE(dtype_valid(static_cast<int32_t>(dtype)), "dtype value {} is not a valid dtype",
                 static_cast<int>(dtype));
  OpState op;
  op.kind = WireKind::kAllreduce;
  op.count = count;
  op.dtype = dtype;
  PlanRequest r = request_for(op);
  r.topology = topology_;
  return choose_algorithm(r);
}

size_t CommunicatorImpl::PlanKeyHash::operator()(const PlanKey& k) const noexcept {
  size_t h = std::hash<uint64_t>()(k.count);
  auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(k.collective | (uint64_t{k.algorithm} << 8) | (uint64_t{k.in_place} << 16));
  mix(static_cast<uint64_t>(static_cast<uint32_t>(k.root)));
  mix(k.elem_bytes);
  mix(k.chunk_bytes);
  return h;
}

const CompiledPlan& CommunicatorImpl::plan_for(const OpState& op, const PlanRequest& request) {
  const PlanKey key{static_cast<uint8_t>(request.collective), static_cast<uint8_t>(request.algorithm),
                    request.in_place, request.root, request.count, request.elem_bytes, request.chunk_bytes};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  PlanRequest r = request;
  r.topology = topology_;
  const Plan plan = make_plan(r);
#ifndef NDEBUG
  validate_plan(plan);
#endif
  if (plans_.size() >= 256) plans_.clear();
  auto compiled = compile_plan(plan, rank_);
  log::debug("comm {} rank {}: {} -> {}", comm_id_, rank_, describe(op), compiled->description);
  return *plans_.emplace(key, std::move(compiled)).first->second;
}

std::string CommunicatorImpl::describe(const OpState& op) const {
  return describe_call(op.kind, op.dtype, op.op, op.count, op.kind == WireKind::kSend || op.kind == WireKind::kRecv
                                                                 ? static_cast<int32_t>(op.tag)
                                                                 : op.root);
}

// ---------------------------------------------------------------------------- progress thread

void CommunicatorImpl::progress_main() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto abort_pending = [&] { return abort_requested_.load() && !is_failed(); };
      auto p2p_pending = [&] { return p2p_count_.load(std::memory_order_acquire) > 0; };
      // While the communicator is busy, look at the queue every kActivePoll without being woken:
      // callers then enqueue without waking this thread (a wake-up per operation costs a
      // caller-driven 4 KiB exchange several times its duration on a small machine).
      const bool active = now_ns() - activity_->load(std::memory_order_relaxed) <
                          std::chrono::duration_cast<std::chrono::nanoseconds>(kActiveWindow).count();
      cv_.wait_for(lock, active ? kActivePoll : kIdlePoll,
                   [&] { return stopping_ || abort_pending() || wake_ || (p2p_pending() && !caller_driving_.load()); });
      wake_ = false;
      if (stopping_ && queue_.empty() && !p2p_pending()) break;
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

void CommunicatorImpl::step() {
  std::shared_ptr<OpState> op;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) {
      op = std::move(queue_.front());
      queue_.pop_front();
    }
  }
  try {
    if (abort_requested_.load(std::memory_order_acquire) && !is_failed()) {
      std::string reason;
      {
        std::lock_guard lock(mu_);
        reason = abort_reason_;
      }
      blame(rank_, true, {});
      TANDEM_THROW(Status::kPeerFailure, "rank {} aborted the communicator: {}", rank_, reason);
    }
    if (op) {
      if (is_failed()) {
        fail(Status::kOk, "", false, op.get());
      } else if (op->kind == WireKind::kSend || op->kind == WireKind::kRecv) {
        post_p2p(op);
      } else {
        current_ = op.get();
        run_collective(*op);
        current_ = nullptr;
      }
    } else if (!is_failed()) {
      poll_control();
      if (!p2p_.empty()) {
        const auto before = p2p_.size();
        poll_p2p();
        if (p2p_.size() == before) transport_.wait_for_progress(std::chrono::microseconds(200));
      }
    }
  } catch (const Error& e) {
    if (!blame_.set && executor_.failed_peer() >= 0) blame(rank_, false, {executor_.failed_peer()});
    executor_.abandon();
    Status st = e.status();
    std::string msg = e.what();
    // A peer that failed first and left: its abort (sent before it closed) says why.
    if (st == Status::kPeerFailure || st == Status::kTransport) {
      const auto until = Clock::now() + std::chrono::milliseconds(50);
      try {
        while (Clock::now() < until) {
          poll_control();
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
    executor_.abandon();
    fail(Status::kInternal, e.what(), true, op.get());
    current_ = nullptr;
  }
}

bool CommunicatorImpl::drive_until_done(const OpState& op) {
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

void CommunicatorImpl::run_collective(OpState& op) {
  const PlanRequest req = request_for(op);
  const CompiledPlan& plan = plan_for(op, req);
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
  executor_.run(plan, buf, transport_, members_, collective_tag(comm_id_), *send_header_, *this);
  if (reduces && op.op == ReduceOp::kAvg && out_bytes) divide_by(buf.base[1], out_bytes / es, op.dtype, size_);
  activity_->store(now_ns(), std::memory_order_relaxed);
  op.complete(Status::kOk, "");
}

void CommunicatorImpl::post_p2p(const std::shared_ptr<OpState>& op) {
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
    const std::array<transports::ConstPart, 2> parts{transports::ConstPart{&h, sizeof(h)},
                                                     transports::ConstPart{op->send, bytes}};
    op->request = transport_.isend(peer, tag, std::span(parts.data(), bytes ? 2 : 1));
  } else {
    const std::array<transports::MutPart, 2> parts{transports::MutPart{&op->received, sizeof(WireHeader)},
                                                   transports::MutPart{op->recv, bytes}};
    op->request = transport_.irecv(peer, tag, std::span(parts.data(), bytes ? 2 : 1));
  }
  op->posted = Clock::now();
  p2p_.push_back(op);
  p2p_count_.store(p2p_.size(), std::memory_order_release);
  poll_p2p();
}

void CommunicatorImpl::poll_p2p() {
  if (p2p_.empty()) return;
  const auto now = Clock::now();
  for (size_t k = 0; k < p2p_.size();) {
    OpState& op = *p2p_[k];
    bool done = false;
    try {
      done = op.request->test();
    } catch (const Error&) {
      blame(rank_, false, {op.peer});
      throw;
    }
    if (!done) {
      if (now - op.posted > options_.timeout) {
        blame(rank_, false, {op.peer});
        TANDEM_THROW(Status::kTimeout, "rank {}: {} {} rank {} did not complete within {} ms", rank_, describe(op),
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
        blame(rank_, false, {op.peer});
        TANDEM_THROW(Status::kMismatch, "rank {} called {} from rank {} but rank {} sent {}{}", rank_, describe(op),
                     op.peer, op.peer, describe_header(h, op.header),
                     same_operation(h, op.header) ? fmt::format(" ({} bytes where {} were expected)", got, expected)
                                                  : "");
      }
    }
    op.request.reset();
    activity_->store(now_ns(), std::memory_order_relaxed);
    auto finished = std::move(p2p_[k]);
    p2p_.erase(p2p_.begin() + static_cast<long>(k));
    p2p_count_.store(p2p_.size(), std::memory_order_release);
    finished->complete(Status::kOk, "");
  }
}

// ------------------------------------------------------------------------------- control tag

void CommunicatorImpl::post_control_recv(int peer) {
  if (!control_bufs_[peer]) control_bufs_[peer] = std::make_shared<ControlMessage>();
  const transports::MutPart part{control_bufs_[peer].get(), sizeof(ControlMessage)};
  control_recvs_[peer] = transport_.irecv(members_[static_cast<size_t>(peer)], control_tag(comm_id_),
                                          std::span(&part, 1));
}

void CommunicatorImpl::send_control(const ControlMessage& msg) {
  auto buf = std::make_shared<ControlMessage>(msg);
  shared_->bury(buf);  // sends may outlive this communicator
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    try {
      const transports::ConstPart part{buf.get(), sizeof(ControlMessage)};
      control_sends_.push_back(transport_.isend(members_[static_cast<size_t>(p)], control_tag(comm_id_),
                                                std::span(&part, 1)));
    } catch (const Error& e) {
      log::debug("comm {} rank {}: control message to rank {} not sent: {}", comm_id_, rank_, p, e.what());
    }
  }
}

void CommunicatorImpl::poll_control() {
  last_control_poll_ = Clock::now();
  for (int p = 0; p < size_; ++p) {
    auto& req = control_recvs_[static_cast<size_t>(p)];
    if (!req) continue;
    bool done = false;
    try {
      done = req->test();
    } catch (const Error&) {
      req.reset();  // the peer is gone; its data receives report that
      continue;
    }
    if (!done) continue;
    const ControlMessage msg = *control_bufs_[p];
    const bool ok = req->bytes() == sizeof(ControlMessage) && msg.magic == kWireMagic;
    post_control_recv(p);
    if (!ok) {
      log::warn("comm {} rank {}: ignored a malformed control message from rank {}", comm_id_, rank_, p);
      continue;
    }
    const std::string text(msg.text, strnlen(msg.text, sizeof(msg.text)));
    if (msg.type == static_cast<uint32_t>(ControlType::kTimeoutNotice)) {
      std::vector<int> waited;
      for (size_t pos = 0; pos < text.size();) {
        const size_t comma = text.find(',', pos);
        const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        int v = 0;
        if (std::from_chars(item.data(), item.data() + item.size(), v).ec == std::errc()) waited.push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      notices_[msg.seq][p] = std::move(waited);
      while (notices_.size() > 16) notices_.erase(notices_.begin());
    } else if (msg.type == static_cast<uint32_t>(ControlType::kAbort)) {
      const auto st = static_cast<Status>(msg.status);
      std::vector<int> blamed;
      for (int k = 0; k < std::min<int>(msg.blamed_count, kMaxBlamedRanks); ++k)
        if (msg.blamed[k] >= 0 && msg.blamed[k] < size_) blamed.push_back(msg.blamed[k]);
      const bool known_origin = msg.first_origin >= 0 && msg.first_origin < size_;
      blame(known_origin ? msg.first_origin : p, known_origin && msg.aborted != 0, std::move(blamed));
      if (st == Status::kMismatch || st == Status::kTimeout)
        throw Error(st, fmt::format("{} (reported by rank {})", text, p));
      const std::string origin = fmt::format("rank {} ", p);
      throw Error(Status::kPeerFailure, text.rfind(origin, 0) == 0 ? text : fmt::format("rank {} failed: {}", p, text));
    }
  }
}

// ------------------------------------------------------------------------------ executor hooks

void CommunicatorImpl::poll() {
  if (!p2p_.empty()) poll_p2p();
}

void CommunicatorImpl::backoff(Clock::duration idle_for) {
  // Hand the CPU on at once rather than spin: with more threads than cores (ranks, their progress
  // and I/O threads) a spinning waiter delays the very peer it waits for (measured: a 4 KiB
  // exchange over ucx took 25-30 us with 10 us of spinning first, 6-7 us without).
  transport_.wait_for_progress(idle_for < std::chrono::milliseconds(10) ? std::chrono::microseconds(200)
                                                                         : std::chrono::microseconds(1000));
}

void CommunicatorImpl::idle(const PlanExecutor& ex) {
  const auto now = Clock::now();
  if (now - last_control_poll_ > std::chrono::microseconds(500)) {
    poll_control();
    if (abort_requested_.load(std::memory_order_acquire)) {
      std::lock_guard lock(mu_);
      blame(rank_, true, {});
      TANDEM_THROW(Status::kPeerFailure, "rank {} aborted the communicator: {}", rank_, abort_reason_);
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
      std::string list;
      for (int r : waited_) list += fmt::format("{}{}", list.empty() ? "" : ",", r);
      send_control(make_control(ControlType::kTimeoutNotice, rank_, 0, op.seq, list));
    } else if (now > grace_until_) {
      // Nobody heard from: waited for by some rank, and not itself stuck waiting (no notice).
      std::set<int> waited(waited_.begin(), waited_.end());
      std::set<int> stuck{rank_};
      for (const auto& [origin, list] : notices_[op.seq]) {
        stuck.insert(origin);
        waited.insert(list.begin(), list.end());
      }
      std::vector<int> missing;
      for (int r : waited)
        if (!stuck.count(r)) missing.push_back(r);
      std::vector<int> others(stuck.begin(), stuck.end());
      others.erase(std::remove(others.begin(), others.end(), rank_), others.end());
      std::string why = missing.empty()
                            ? fmt::format("every rank it waited for is stuck as well")
                            : fmt::format("{} never took part", ranks_phrase(missing));
      blame(rank_, false, missing);
      TANDEM_THROW(Status::kTimeout, "rank {}: {} (op #{}) timed out after {} ms waiting for {}: {}{}", rank_,
                   describe(op), op.seq, options_.timeout.count(), ranks_phrase(waited_), why,
                   others.empty() ? "" : fmt::format(" ({} timed out too)", ranks_phrase(others)));
    }
  }
  backoff(idle_for);
}

void CommunicatorImpl::bad_message(int peer, const WireHeader& got, size_t got_bytes, size_t expected_bytes) {
  const OpState& op = *current_;
  const bool same = same_operation(got, *send_header_);
  const std::string theirs = describe_header(got, *send_header_);
  const std::string their_seq = got.magic == kWireMagic && got.seq != op.seq ? fmt::format(" as op #{}", got.seq) : "";
  blame(rank_, false, {peer});
  TANDEM_THROW(Status::kMismatch, "rank {} called {} as op #{} but rank {} sent {}{}{}", rank_, describe(op), op.seq,
               peer, theirs, their_seq,
               same ? fmt::format(" in a message of {} bytes where {} were expected", got_bytes, expected_bytes)
                    : std::string());
}

// ---------------------------------------------------------------------------------- failure

void CommunicatorImpl::blame(int origin, bool aborted, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  blame_ = Blame{true, origin, aborted, std::move(ranks)};
}

void CommunicatorImpl::fail(Status status, const std::string& message, bool tell_peers, OpState* current) {
  if (!is_failed() && status != Status::kOk) {
    const Blame b = blame_.set ? blame_ : Blame{true, rank_, false, {}};
    {
      std::lock_guard lock(fail_mu_);
      fail_status_ = status;
      fail_message_ = message;
      fail_origin_ = b.origin;
      fail_aborted_ = b.aborted;
      fail_ranks_ = b.ranks;
      failed_.store(true, std::memory_order_release);
    }
    fail_cv_.notify_all();
    log::error("comm {} rank {}: {}", comm_id_, rank_, message);
    // Peers fail fast with the origin named; they keep a mismatch's or timeout's own status.
    if (tell_peers) {
      ControlMessage m = make_control(ControlType::kAbort, rank_, static_cast<int32_t>(status), 0, message);
      m.first_origin = b.origin;
      m.aborted = b.aborted ? 1 : 0;
      for (int r : b.ranks)
        if (m.blamed_count < kMaxBlamedRanks) m.blamed[m.blamed_count++] = r;
      send_control(m);
    }
  }
  blame_ = Blame{};
  Status st;
  std::string msg;
  {
    std::lock_guard lock(fail_mu_);
    st = fail_status_;
    msg = fail_message_;
  }
  if (current && current->state.load() == 0) current->complete(st, msg);
  for (auto& op : p2p_) {
    if (op->request) op->request->cancel();
    shared_->bury(op);  // a send's header may still be read
    op->complete(st, msg);
  }
  p2p_.clear();
  p2p_count_.store(0, std::memory_order_release);
  std::deque<std::shared_ptr<OpState>> queued;
  {
    std::lock_guard lock(mu_);
    queued.swap(queue_);
  }
  for (auto& op : queued) op->complete(st, msg);
}

// ------------------------------------------------------------------------------------ split

std::unique_ptr<Communicator> CommunicatorImpl::split(int color, int key) {
  check_usable();
  // Everyone learns everyone's (color, key) and the lowest communicator id free on every rank.
  auto op = new_op(WireKind::kSplit, nullptr, nullptr, 3, DType::kI64);
  op->split_in = {color, key, static_cast<int64_t>(shared_->next_id())};
  op->split_out.assign(3 * static_cast<size_t>(size_), 0);
  op->send = op->split_in.data();
  op->recv = op->split_out.data();
  enqueue(op)->wait();
  const auto& all = op->split_out;
  int64_t base = 0;
  std::set<int64_t> colors;
  for (int r = 0; r < size_; ++r) {
    base = std::max(base, all[3 * r + 2]);
    if (all[3 * r] >= 0) colors.insert(all[3 * r]);
  }
  TANDEM_CHECK(base + static_cast<int64_t>(colors.size()) <= kMaxCommId, Status::kUnsupported,
               "split: out of communicator ids ({} in use on some rank, at most {})", base, kMaxCommId);
  shared_->reserve_ids(static_cast<uint32_t>(base + static_cast<int64_t>(colors.size())));
  if (color < 0) return nullptr;
  const auto child_id = static_cast<uint32_t>(base + std::distance(colors.begin(), colors.find(color)));
  std::vector<std::pair<int64_t, int>> order;  // (key, old rank)
  for (int r = 0; r < size_; ++r)
    if (all[3 * r] == color) order.emplace_back(all[3 * r + 1], r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  std::vector<std::string> hosts;
  int child_rank = -1;
  for (const auto& [k, r] : order) {
    if (r == rank_) child_rank = static_cast<int>(members.size());
    members.push_back(members_[static_cast<size_t>(r)]);
    hosts.push_back(hosts_[static_cast<size_t>(r)]);
  }
  log::debug("comm {} rank {}: split color {} key {} -> comm {} rank {}/{}", comm_id_, rank_, color, key, child_id,
             child_rank, members.size());
  return std::make_unique<CommunicatorImpl>(shared_, child_rank, std::move(members), child_id, options_,
                                            std::move(hosts));
}

}  // namespace tandem::engine::comm
