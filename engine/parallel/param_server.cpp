#include "engine/parallel/param_server.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// World tags of the parameter-server protocol (the trainer's own world tags are small numbers).
constexpr uint32_t kTagBase = 0x400000;
constexpr uint32_t kTagControl = kTagBase;
constexpr uint32_t kTagInit = kTagBase + 1;
constexpr uint32_t kTagFinal = kTagBase + 2;
constexpr uint32_t kTagState = kTagBase + 3;
constexpr uint32_t kTagCentre = kTagBase + 4;
constexpr uint32_t kTagDelta = kTagBase + 5;
constexpr uint32_t kTagReplicaHeader = kTagBase + 6;  // replication: owner -> backup headers (and end markers)
constexpr uint32_t kTagReplica = kTagBase + 7;        // owner -> backup: the payload after each header
constexpr uint32_t kTagAck = kTagBase + 8;            // backup -> owner
constexpr uint32_t kTagPush = kTagBase + 0x10000;  // + global piece index
constexpr uint32_t kTagPull = kTagBase + 0x20000;
constexpr uint32_t kTagFinalShard = kTagBase + 0x30000;  // + shard index: a shard's values at a sync point
constexpr uint32_t kTagStateShard = kTagBase + 0x40000;  // + shard index: its optimizer state (gather_state)
constexpr size_t kMaxPieces = 0x10000;
constexpr size_t kHeaderFloats = 8;
static_assert(kHeaderFloats * sizeof(float) == kPsHeaderBytes, "the job's header size (job.hpp)");

// The optimizer's state tensors per buffer (optim::Optimizer::state_tensors).
size_t state_tensors_per_buffer(const optim::OptimizerConfig& c) {
  if (c.kind != optim::OptimizerKind::kSgd) return 2;
  return c.momentum > 0 ? 1 : 0;
}

}  // namespace

// ------------------------------------------------------------------------------------ messages

ParameterServerSync::Header ParameterServerSync::Message::header() const {
  Header h;
  if (buf.size() >= kHeaderFloats) std::memcpy(static_cast<void*>(&h), buf.data(), sizeof(h));
  return h;
}

void ParameterServerSync::Message::set(const Header& h) {
  buf.resize(kHeaderFloats + static_cast<size_t>(h.count));
  std::memcpy(buf.data(), &h, sizeof(h));
}

const char* ParameterServerSync::kind_name(int32_t kind) noexcept {
  switch (kind) {
    case kStep: return "step";
    case kPause: return "pause";
    case kPush: return "push";
    case kPull: return "pull";
    case kFinal: return "final shard";
    case kInit: return "initial shard";
    case kElastic: return "elastic";
    case kCentre: return "elastic parameters";
    case kDelta: return "elastic difference";
    case kState: return "optimizer state";
    case kReplica: return "replica";
    case kAck: return "replica acknowledgement";
    case kReplicaEnd: return "end of replicas";
  }
  return "unknown";
}

uint32_t ParameterServerSync::push_tag(int32_t piece) const { return kTagPush + static_cast<uint32_t>(piece); }
uint32_t ParameterServerSync::pull_tag(int32_t piece) const { return kTagPull + static_cast<uint32_t>(piece); }

void ParameterServerSync::expect(const Message& m, int from, int32_t kind, int32_t piece, int64_t clock,
                                 int64_t count) const {
  const Header h = m.header();
  TANDEM_CHECK(h.kind == kind && h.sender == from && h.piece == piece && h.clock == clock && h.count == count &&
                   m.buf.size() == kHeaderFloats + static_cast<size_t>(count),
               Status::kMismatch,
               "parameter server protocol: world rank {} expected {} (piece {}, clock {}, {} values) from world rank {} "
               "but got {} (kind {}, sender {}, piece {}, clock {}, {} values)",
               rank_, kind_name(kind), piece, clock, count, from, kind_name(h.kind), h.kind, h.sender, h.piece,
               h.clock, h.count);
}

// ------------------------------------------------------------------------------------ construction

ParameterServerSync::ParameterServerSync(comm::Communicator& world, nn::Model& model, SyncProgram program,
                                         std::vector<GradientBucket> buckets, optim::OptimizerConfig optimizer,
                                         optim::ScheduleConfig schedule, double alpha, Tracer& tracer)
    : world_(&world),
      model_(model),
      program_(std::move(program)),
      buckets_(std::move(buckets)),
      optimizer_config_(optimizer),
      schedule_(schedule),
      alpha_(0),
      tracer_(tracer),
      rank_(world.rank()) {
  const int W = program_.workers, S = program_.servers;
  TANDEM_REQUIRE(W >= 1 && S >= 1 && world.size() == W + S,
                 "parameter server: {} workers and {} servers need a world of {} ranks, not {}", W, S, W + S,
                 world.size());
  elastic_ = program_.exchange == Exchange::kElastic;
  TANDEM_REQUIRE(elastic_ || program_.exchange == Exchange::kPushPull,
                 "parameter server: the job's exchange is {}, not push-pull or elastic", exchange_name(program_.exchange));
  // A job starts with shard s on server s; a worker joining after a server loss (issue #17) gets more shards than
  // servers, each on the server that owns it now.
  const bool fresh = program_.shards.size() == static_cast<size_t>(S);
  for (size_t k = 0; k < program_.shards.size(); ++k)
    TANDEM_REQUIRE(program_.shards[k].server >= 0 && program_.shards[k].server < S &&
                       (!fresh || program_.shards[k].server == static_cast<int32_t>(k)),
                   "parameter server: key range {} of {} belongs to server {} of {}", k, program_.shards.size(),
                   program_.shards[k].server, S);
  TANDEM_REQUIRE(program_.shards.size() >= static_cast<size_t>(S) && (fresh || (rank_ != 0 && rank_ < W)),
                 "parameter server: {} key ranges for {} servers (more only for a worker joining a running job)",
                 program_.shards.size(), S);
  TANDEM_REQUIRE(program_.pieces.size() < kMaxPieces, "parameter server: {} bucket pieces; at most {} are supported",
                 program_.pieces.size(), kMaxPieces - 1);
  TANDEM_REQUIRE(model_.holds_all(), "parameter server: the model must hold every layer (pp = 1)");
  TANDEM_REQUIRE(program_.period >= 1, "parameter server: exchange period {} must be >= 1", program_.period);
  alpha_ = static_cast<float>(alpha > 0 ? alpha : 0.9 / W);
  if (rank_ >= W) server_ = rank_ - W;
  compute::Backend& be = model_.backend();
  const int64_t total = model_.total_params();

  if (server_ < 0) {
    // ---- worker: which pieces each bucket pushes, and which layer completes each bucket ----
    bucket_pieces_.resize(buckets_.size());
    for (size_t k = 0; k < program_.pieces.size(); ++k) {
      const BucketPiece& p = program_.pieces[k];
      TANDEM_REQUIRE(p.bucket >= 0 && static_cast<size_t>(p.bucket) < buckets_.size() && p.server >= 0 &&
                         p.server < S && p.begin >= 0 && p.begin < p.end && p.end <= total,
                     "parameter server: piece {} (bucket {}, server {}, [{}, {})) does not fit {} buckets, {} servers "
                     "and {} parameters",
                     k, p.bucket, p.server, p.begin, p.end, buckets_.size(), S, total);
      bucket_pieces_[static_cast<size_t>(p.bucket)].push_back(static_cast<int32_t>(k));
    }
    trigger_bucket_.assign(model_.num_layers(), -1);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (int32_t l = buckets_[b].first_layer; l < buckets_[b].end_layer; ++l) {
        if (model_.spec().layers[static_cast<size_t>(l)].params > 0) {
          trigger_bucket_[static_cast<size_t>(l)] = static_cast<int>(b);
          break;
        }
      }
    }
    issued_.assign(buckets_.size(), false);
    push_.resize(elastic_ ? static_cast<size_t>(S) : program_.pieces.size());
    pull_.resize(push_.size());
    control_sends_.resize(static_cast<size_t>(S));
    control_out_.resize(static_cast<size_t>(S));
    if (!elastic_) model_.set_grad_ready_hook([this](size_t layer) { on_grad_ready(layer); });
  } else {
    // ---- server: the shard, its pieces and their optimizers; the initial values come from world rank 0 ----
    const int64_t n = program_.shards[static_cast<size_t>(server_)].size();
    Message init;
    init.buf.resize(kHeaderFloats + static_cast<size_t>(n));
    world_->recv(init.buf.data(), init.buf.size(), DType::kF32, 0, kTagInit)->wait();
    expect(init, 0, kInit, server_, 0, n);
    owned_.reserve(program_.shards.size());
    own_shard(server_, init.payload());
    peers_.resize(static_cast<size_t>(W));
    for (WorkerState& ws : peers_) {
      ws.push.resize(pieces_.size());
      ws.reply.resize(pieces_.size());
      ws.push_clock.assign(pieces_.size(), 0);
      ws.pulled.assign(pieces_.size(), 0);
    }
    place_replicas();
  }
  if (rank_ == 0) {
    const Tensor host = be.to_host(model_.params());
    const float* p = host.data<float>();
    std::vector<Message> out(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) {
      const KeyRange& r = program_.shards[static_cast<size_t>(s)];
      Message& m = out[static_cast<size_t>(s)];
      m.set(Header{kInit, rank_, s, 0, 0, r.size()});
      std::copy(p + r.begin, p + r.end, m.payload());
      m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, W + s, kTagInit);
    }
    for (Message& m : out) m.work->wait();
  }
}

ParameterServerSync::Shard& ParameterServerSync::own_shard(int32_t index, const float* values) {
  compute::Backend& be = model_.backend();
  const KeyRange& r = program_.shards[static_cast<size_t>(index)];
  const int64_t n = r.size();
  TANDEM_CHECK(owned_.size() < owned_.capacity(), Status::kInternal, "parameter server {}: no room for shard {}",
               server_, index);  // reserved: a Shard never moves (its optimizers hold its buffer)
  Shard& sh = owned_.emplace_back();
  sh.index = index;
  sh.range = r;
  sh.host.assign(values, values + n);
  if (be.device().is_cpu()) {
    sh.dev = Tensor::wrap(sh.host.data(), Shape{n}, DType::kF32);
  } else {
    sh.dev = be.empty(Shape{n});
    be.copy(Tensor::wrap(sh.host.data(), Shape{n}, DType::kF32), sh.dev);
  }
  for (size_t k = 0; k < program_.pieces.size() && !elastic_; ++k) {
    const BucketPiece& p = program_.pieces[k];
    if (p.begin < r.begin || p.end > r.end) continue;
    TANDEM_REQUIRE(p.server == r.server && p.begin < p.end,
                   "parameter server {}: piece {} [{}, {}) of shard {} [{}, {}) belongs to server {}", server_, k,
                   p.begin, p.end, index, r.begin, r.end, p.server);
    ServerPiece sp;
    sp.global = static_cast<int32_t>(k);
    sp.shard = static_cast<int32_t>(owned_.size() - 1);
    sp.offset = p.begin - r.begin;
    sp.size = p.end - p.begin;
    sp.optimizer = std::make_unique<optim::Optimizer>(be, optimizer_config_,
                                                      std::vector<Tensor>{sh.dev.slice(sp.offset, Shape{sp.size})});
    pieces_.push_back(std::move(sp));
  }
  return sh;
}

const float* ParameterServerSync::host_of(const ServerPiece& p) const {
  return owned_[static_cast<size_t>(p.shard)].host.data() + p.offset;
}

std::vector<int32_t> ParameterServerSync::owned_shards() const {
  std::vector<int32_t> out;
  for (const Shard& sh : owned_) out.push_back(sh.index);
  return out;
}

const std::vector<float>& ParameterServerSync::shard_values(int32_t index) const {
  for (const Shard& sh : owned_)
    if (sh.index == index) return sh.host;
  TANDEM_THROW(Status::kInvalidArgument, "parameter server (world rank {}): shard {} is not owned here", rank_, index);
}

int64_t ParameterServerSync::ServerPiece::replicated() const noexcept {
  int64_t m = INT64_MAX;
  for (int64_t a : acked) m = std::min(m, a);
  return m;
}

ParameterServerSync::~ParameterServerSync() {
  if (server_ < 0 && !elastic_) model_.set_grad_ready_hook({});
  try {
    if (!world_->is_failed()) sync_point();
  } catch (...) {
    // the trainer already reports failures of collective calls; a destructor must not throw
  }
  // Operations still in flight read or write our buffers: wait for them (each bounded by its deadline).
  auto drain = [](Message& m) {
    try {
      if (m.work) m.work->wait();
    } catch (...) {
    }
    m.work.reset();
  };
  for (Message& m : push_) drain(m);
  for (Message& m : pull_) drain(m);
  for (auto& w : control_sends_) {
    try {
      if (w) w->wait();
    } catch (...) {
    }
  }
  for (Message& m : ack_sends_) drain(m);
  for (Message& m : stray_) drain(m);
  for (Link& l : backups_) {
    for (Message& m : l.sends) drain(m);
    drain(l.ack);
  }
  for (Primary& pr : primaries_) drain(pr.header);
  for (WorkerState& ws : peers_) {
    drain(ws.control);
    drain(ws.elastic);
    drain(ws.delta);
    for (Message& m : ws.push) drain(m);
    for (Message& m : ws.reply) drain(m);
  }
}

// ------------------------------------------------------------------------------------ worker

void ParameterServerSync::send_control(int32_t kind, int64_t clock) {
  const int W = program_.workers;
  const int32_t request = kind == kStep && request_next_ ? 1 : 0;
  if (request != 0) {
    request_next_ = false;
    admit_at_ = clock + program_.staleness;
  }
  for (int s = 0; s < program_.servers; ++s) {
    auto& w = control_sends_[static_cast<size_t>(s)];
    if (w) w->wait();  // the previous control message to this server (long delivered)
    control_out_[static_cast<size_t>(s)] = Header{kind, rank_, s, request, clock, 0};
    w = world_->send(&control_out_[static_cast<size_t>(s)], kHeaderFloats, DType::kF32, W + s, kTagControl);
  }
}

void ParameterServerSync::on_grad_ready(size_t layer) {
  if (!armed_ || layer >= trigger_bucket_.size()) return;
  const int b = trigger_bucket_[layer];
  if (b >= 0) issue(b);
}

void ParameterServerSync::issue(int b) {
  TANDEM_CHECK(server_ < 0, Status::kInternal, "parameter server {}: a server pushes no gradients", server_);
  TANDEM_CHECK(b >= 0 && static_cast<size_t>(b) < buckets_.size(), Status::kInternal,
               "push of bucket {} but the model has {} buckets", b, buckets_.size());
  if (elastic_ || issued_[static_cast<size_t>(b)]) return;
  issued_[static_cast<size_t>(b)] = true;
  const int64_t t = clock_ + 1;
  if (!step_started_) {
    step_started_ = true;
    in_region_ = true;
    first_issue_ns_ = tracer_.now_ns();
    send_control(kStep, t);
    if (program_.replicas > 0 && program_.staleness == 0) {  // what reform() redoes the step from
      const Tensor h = model_.backend().to_host(model_.params());
      step_start_.assign(h.data<float>(), h.data<float>() + h.numel());
    }
  }
  compute::Backend& be = model_.backend();
  const bool host = be.device().is_cpu();
  const int64_t pushed_ns = tracer_.now_ns();
  for (int32_t k : bucket_pieces_[static_cast<size_t>(b)]) {
    const BucketPiece& p = program_.pieces[static_cast<size_t>(k)];
    const int64_t n = p.end - p.begin;
    const int to = program_.workers + p.server;
    Message& m = push_[static_cast<size_t>(k)];
    if (m.work) m.work->wait();  // last step's push of this piece (its reply came, so it was delivered)
    m.set(Header{kPush, rank_, k, 0, t, n});
    const Tensor g = model_.grads().slice(p.begin, Shape{n});
    if (host) {
      std::memcpy(m.payload(), g.data<float>(), static_cast<size_t>(n) * sizeof(float));
    } else {
      const Tensor h = be.to_host(g);
      std::memcpy(m.payload(), h.data<float>(), static_cast<size_t>(n) * sizeof(float));
    }
    m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, to, push_tag(k));
    Message& r = pull_[static_cast<size_t>(k)];
    r.buf.assign(kHeaderFloats + static_cast<size_t>(n), 0.0f);
    r.work = world_->recv(r.buf.data(), r.buf.size(), DType::kF32, to, pull_tag(k));
  }
  // The trace (--trace): this bucket's pushes posted (DDP traces each bucket's all-reduce likewise); issued from the
  // grad-ready hook, the span lies inside backward's.
  if (tracer_.enabled()) tracer_.add(fmt::format("push bucket {}", b), "send", pushed_ns, tracer_.now_ns(), 1);
}

void ParameterServerSync::receive_shards() {
  const int W = program_.workers;
  const size_t K = program_.shards.size();
  std::vector<Message> finals(K);
  try {
    for (size_t k = 0; k < K; ++k) {
      const KeyRange& r = program_.shards[k];
      Message& m = finals[k];
      m.buf.assign(kHeaderFloats + static_cast<size_t>(r.size()), 0.0f);
      m.work = world_->recv(m.buf.data(), m.buf.size(), DType::kF32, W + r.server, kTagFinalShard + static_cast<uint32_t>(k));
    }
    for (size_t k = 0; k < K; ++k) {
      const KeyRange& r = program_.shards[k];
      Message& m = finals[k];
      m.work->wait();
      m.work.reset();
      expect(m, W + r.server, kFinal, static_cast<int32_t>(k), clock_, r.size());
      copy_into_params(r.begin, r.size(), m.payload());
    }
  } catch (...) {
    // the receives still posted write into these buffers until the failed communicator is gone
    for (Message& m : finals)
      if (m.work) stray_.push_back(std::move(m));
    throw;
  }
}

void ParameterServerSync::send_shards(const std::vector<int64_t>& clocks) {
  std::vector<Message> sends;
  sends.reserve(owned_.size() * clocks.size());
  for (const Shard& sh : owned_) {
    for (size_t w = 0; w < clocks.size(); ++w) {
      Message& m = sends.emplace_back();
      m.set(Header{kFinal, rank_, sh.index, 0, clocks[w], sh.range.size()});
      std::copy(sh.host.begin(), sh.host.end(), m.payload());
      m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, static_cast<int>(w),
                            kTagFinalShard + static_cast<uint32_t>(sh.index));
    }
  }
  try {
    for (Message& m : sends) m.work->wait();
  } catch (...) {
    for (Message& m : sends)
      if (m.work) stray_.push_back(std::move(m));
    throw;
  }
  for (size_t w = 0; w < clocks.size() && w < peers_.size(); ++w) mark_pulled(peers_[w]);
}

void ParameterServerSync::mark_pulled(WorkerState& ws) const {
  ws.pulled.resize(pieces_.size());
  for (size_t j = 0; j < pieces_.size(); ++j) ws.pulled[j] = pieces_[j].optimizer->steps();
}

void ParameterServerSync::copy_into_params(int64_t begin, int64_t size, const float* src) {
  Tensor dst = model_.params().slice(begin, Shape{size});
  model_.backend().copy(Tensor::wrap(const_cast<float*>(src), Shape{size}, DType::kF32), dst);
}

int64_t ParameterServerSync::finish() {
  armed_ = false;
  if (elastic_) {  // easgd: a local step; the exchange is elastic_exchange()
    in_region_ = true;  // every step is in the region (the server serves it), exchange or not
    ++clock_;
    return 0;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) issue(static_cast<int>(b));
  if (!step_started_) {  // no bucket (a model without parameters): the servers still count the step
    step_started_ = true;
    in_region_ = true;
    first_issue_ns_ = tracer_.now_ns();
    send_control(kStep, clock_ + 1);
  }
  const int64_t t0 = tracer_.now_ns();
  const int64_t t = clock_ + 1;
  for (size_t k = 0; k < program_.pieces.size(); ++k) {
    const BucketPiece& p = program_.pieces[k];
    const int from = program_.workers + p.server;
    push_[k].work->wait();
    pull_[k].work->wait();
    pull_[k].work.reset();
    expect(pull_[k], from, kPull, static_cast<int32_t>(k), t, p.end - p.begin);
    const int32_t due = pull_[k].header().reserved;  // 1 + B - t with an admission due at B (request_admission)
    if (due > 0) {
      TANDEM_CHECK(admit_at_ < 0 || admit_at_ == t + due - 1, Status::kMismatch,
                   "parameter server protocol: world rank {} says an admission is due at step {}, world rank {} at {}",
                   from, t + due - 1, rank_, admit_at_);
      admit_at_ = t + due - 1;
    }
    copy_into_params(p.begin, p.end - p.begin, pull_[k].payload());
  }
  for (auto& w : control_sends_) w->wait();
  const int64_t t1 = tracer_.now_ns();
  clock_ = t;
  step_started_ = false;
  step_start_.clear();  // only a step in flight is redone from it
  std::fill(issued_.begin(), issued_.end(), false);
  last_busy_ns_ = t1 - first_issue_ns_;
  tracer_.add("push/pull", "allreduce", first_issue_ns_, t1, 1);
  tracer_.add("wait pull", "comm", t0, t1);
  return t1 - t0;
}

void ParameterServerSync::elastic_exchange() {
  TANDEM_CHECK(server_ < 0 && elastic_, Status::kInternal,
               "elastic_exchange: only a worker of asynchronous EASGD exchanges with the centre");
  in_region_ = true;
  const int W = program_.workers;
  const int64_t e = exchanges_ + 1;
  send_control(kElastic, e);
  compute::Backend& be = model_.backend();
  const Tensor host = be.to_host(model_.params());
  const float* x = host.data<float>();
  for (int s = 0; s < program_.servers; ++s) {
    const KeyRange& r = program_.shards[static_cast<size_t>(s)];
    Message& m = push_[static_cast<size_t>(s)];
    m.set(Header{kCentre, rank_, s, 0, e, r.size()});
    std::copy(x + r.begin, x + r.end, m.payload());
    m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, W + s, kTagCentre);
    Message& d = pull_[static_cast<size_t>(s)];
    d.buf.assign(kHeaderFloats + static_cast<size_t>(r.size()), 0.0f);
    d.work = world_->recv(d.buf.data(), d.buf.size(), DType::kF32, W + s, kTagDelta);
  }
  std::vector<float> updated(x, x + host.numel());
  for (int s = 0; s < program_.servers; ++s) {
    const KeyRange& r = program_.shards[static_cast<size_t>(s)];
    push_[static_cast<size_t>(s)].work->wait();
    Message& d = pull_[static_cast<size_t>(s)];
    d.work->wait();
    d.work.reset();
    expect(d, W + s, kDelta, s, e, r.size());
    const float* delta = d.payload();
    for (int64_t i = 0; i < r.size(); ++i) updated[static_cast<size_t>(r.begin + i)] -= delta[i];
  }
  for (auto& w : control_sends_) w->wait();
  copy_into_params(0, static_cast<int64_t>(updated.size()), updated.data());
  exchanges_ = e;
}

// ------------------------------------------------------------------------------------ server

void ParameterServerSync::enter_region() {
  if (in_region_) return;
  in_region_ = true;
  for (Primary& pr : primaries_) {
    pr.ended = false;
    pr.header.buf.assign(kHeaderFloats, 0.0f);
    pr.header.work = world_->recv(pr.header.buf.data(), kHeaderFloats, DType::kF32, pr.from, kTagReplicaHeader);
  }
  if (reseed_) {  // the backups start from a full replica of every piece
    reseed_ = false;
    for (ServerPiece& p : pieces_) replicate(p);
  }
  for (size_t w = 0; w < peers_.size(); ++w) {
    WorkerState& ws = peers_[w];
    ws.paused = false;
    ws.control.buf.assign(kHeaderFloats, 0.0f);
    ws.control.work = world_->recv(ws.control.buf.data(), kHeaderFloats, DType::kF32, static_cast<int>(w), kTagControl);
  }
}

int64_t ParameterServerSync::slowest() const {
  int64_t m = INT64_MAX;
  for (const WorkerState& ws : peers_) m = std::min(m, ws.done);
  return m;
}

bool ParameterServerSync::poll_worker(int w) {
  WorkerState& ws = peers_[static_cast<size_t>(w)];
  bool progressed = false;
  for (size_t j = 0; j < pieces_.size(); ++j) {
    Message& m = ws.push[j];
    if (m.work && m.work->test()) {
      m.work.reset();
      on_push(w, static_cast<int>(j));
      progressed = true;
    }
  }
  if (ws.elastic.work && ws.elastic.work->test()) {
    ws.elastic.work.reset();
    on_elastic(w);
    progressed = true;
  }
  if (!ws.paused && ws.control.work && ws.control.work->test()) {
    ws.control.work.reset();
    progressed = true;
    const Header h = ws.control.header();
    const bool idle = ws.done == ws.started;  // everything of its last clock received
    auto bad = [&](const char* why) {
      TANDEM_THROW(Status::kMismatch,
                   "parameter server protocol: world rank {} got {} (clock {}) from world rank {} {} (its last clock "
                   "{}, completed {})",
                   rank_, kind_name(h.kind), h.clock, w, why, ws.started, ws.done);
    };
    if (h.sender != w || h.count != 0 || h.piece != server_) bad("with a malformed header");
    switch (h.kind) {
      case kStep:
        if (elastic_) bad("but this job exchanges with an elastic centre");
        if (!idle || h.clock != ws.started + 1) bad("out of order");
        ws.started = h.clock;
        ws.replied = 0;
        ws.started_ns = tracer_.now_ns();
        if (h.reserved != 0) {  // worker 0 asks for an admission (request_admission)
          if (w != 0 || program_.staleness < 0) bad("with an admission request only worker 0 of ps or ssp sends");
          if (admit_at_ < 0) admit_at_ = h.clock + program_.staleness;
        }
        for (size_t j = 0; j < pieces_.size(); ++j) {
          Message& m = ws.push[j];
          m.buf.assign(kHeaderFloats + static_cast<size_t>(pieces_[j].size), 0.0f);
          m.work = world_->recv(m.buf.data(), m.buf.size(), DType::kF32, w, push_tag(pieces_[j].global));
        }
        if (pieces_.empty()) ws.done = ws.started;
        break;
      case kElastic:
        if (!elastic_) bad("but this job pushes gradients");
        if (!idle || h.clock != ws.started + 1) bad("out of order");
        ws.started = h.clock;
        ws.elastic.buf.assign(kHeaderFloats + static_cast<size_t>(owned_.front().range.size()), 0.0f);
        ws.elastic.work = world_->recv(ws.elastic.buf.data(), ws.elastic.buf.size(), DType::kF32, w, kTagCentre);
        break;
      case kPause:
        if (!idle || h.clock != ws.done) bad("before its last pushes");
        ws.paused = true;
        return progressed;  // no control receive posted until the next region
      default: bad("which is not a control message");
    }
    ws.control.buf.assign(kHeaderFloats, 0.0f);
    ws.control.work = world_->recv(ws.control.buf.data(), kHeaderFloats, DType::kF32, w, kTagControl);
  }
  return progressed;
}

void ParameterServerSync::on_push(int w, int j) {
  WorkerState& ws = peers_[static_cast<size_t>(w)];
  ServerPiece& p = pieces_[static_cast<size_t>(j)];
  Message& m = ws.push[static_cast<size_t>(j)];
  const int64_t t = ws.started;
  expect(m, w, kPush, p.global, t, p.size);
  ws.push_clock[static_cast<size_t>(j)] = t;
  if (std::all_of(ws.push_clock.begin(), ws.push_clock.end(), [&](int64_t c) { return c == t; })) ws.done = t;
  // The trace (--trace): per worker (tid 2 + w), its step's control message taken .. this push in (ps, ssp) or
  // applied and answered (ps-async), so that the pushes' arrivals line up with the workers' spans.
  const auto trace_push = [&] {
    if (tracer_.enabled()) tracer_.add("push", "recv", ws.started_ns, tracer_.now_ns(), 2 + w);
  };
  if (program_.staleness < 0) {
    apply_async(p, m.payload(), ws, j);
    note(PieceEvent::kApplied, p, w, t);
    reply(w, j, t);
    trace_push();
    return;
  }
  trace_push();
  if (t <= p.applied) {
    // A step redone after a reform (reform()): its first push of this piece was applied already; answer with the
    // current values rather than apply it twice (or leave it pending forever behind the applied clock).
    reply(w, j, t);
    return;
  }
  auto& slot = p.pending[t];
  if (slot.empty()) slot.resize(peers_.size());
  slot[static_cast<size_t>(w)] = std::move(m.buf);
  apply_complete(p);
  withheld_.push_back(Withheld{w, j, t});
}

void ParameterServerSync::apply_complete(ServerPiece& p) {
  // Clocks complete in order (every worker pushes its clocks in order), so apply every complete one from the oldest.
  for (auto it = p.pending.begin(); it != p.pending.end() && it->first == p.applied + 1;) {
    const bool complete = std::all_of(it->second.begin(), it->second.end(), [](const auto& g) { return !g.empty(); });
    if (!complete) break;
    apply_clock(p, it->first);
    it = p.pending.erase(it);
  }
}

void ParameterServerSync::apply_clock(ServerPiece& p, int64_t clock) {
  // DDP's average: the workers' gradients summed (in worker order, so the result does not depend on arrival
  // order), then scaled by 1/W.
  const auto& grads = p.pending.at(clock);
  std::vector<float> avg(grads[0].begin() + kHeaderFloats, grads[0].end());
  for (size_t w = 1; w < grads.size(); ++w) {
    const float* g = grads[w].data() + kHeaderFloats;
    for (size_t i = 0; i < avg.size(); ++i) avg[i] += g[i];
  }
  const float inv = 1.0f / static_cast<float>(grads.size());
  for (float& v : avg) v *= inv;
  compute::Backend& be = model_.backend();
  Tensor g = Tensor::wrap(avg.data(), Shape{p.size}, DType::kF32);
  if (!be.device().is_cpu()) {
    Tensor d = be.empty(Shape{p.size});
    be.copy(g, d);
    g = d;
  }
  p.optimizer->step({g}, static_cast<float>(optim::lr_at(schedule_, p.optimizer->steps()) * lr_scale_));
  Shard& sh = owned_[static_cast<size_t>(p.shard)];
  if (!be.device().is_cpu()) {
    const Tensor h = be.to_host(sh.dev.slice(p.offset, Shape{p.size}));
    std::copy_n(h.data<float>(), p.size, sh.host.begin() + p.offset);
  }
  p.applied = clock;
  note(PieceEvent::kApplied, p, -1, clock);
  replicate(p);
}

void ParameterServerSync::apply_async(ServerPiece& p, const float* grad, const WorkerState& from, int j) {
  // --staleness-lr: tau, the updates of this piece since the pushing worker was sent its values (header comment)
  const int64_t tau = std::max<int64_t>(p.optimizer->steps() - from.pulled[static_cast<size_t>(j)], 0);
  double staleness_scale = 1.0;
  if (program_.staleness_lr == StalenessLr::kInverse)
    staleness_scale = 1.0 / static_cast<double>(std::max<int64_t>(tau, 1));
  compute::Backend& be = model_.backend();
  const double mu = optimizer_config_.momentum;
  if (program_.staleness_lr == StalenessLr::kMomentum && optimizer_config_.kind == optim::OptimizerKind::kSgd &&
      mu > 0 && p.optimizer->steps() > 0) {
    // the buffer pre-scaled by mu_tau / mu: the step's mu v + g is then mu_tau v + g (0 included: v = g)
    const double mu_tau = std::max(0.0, 1.0 - (1.0 - mu) * static_cast<double>(tau + 1));
    std::vector<Tensor> state = p.optimizer->state_tensors();
    be.scale(state.front(), static_cast<float>(mu_tau / mu));
  }
  Tensor g = Tensor::wrap(const_cast<float*>(grad), Shape{p.size}, DType::kF32);
  if (!be.device().is_cpu()) {
    Tensor d = be.empty(Shape{p.size});
    be.copy(g, d);
    g = d;
  }
  const int64_t at = p.schedule_step(p.optimizer->steps(), program_.workers);
  p.optimizer->step({g}, static_cast<float>(optim::lr_at(schedule_, at) * lr_scale_ * staleness_scale));
  Shard& sh = owned_[static_cast<size_t>(p.shard)];
  if (!be.device().is_cpu()) {
    const Tensor h = be.to_host(sh.dev.slice(p.offset, Shape{p.size}));
    std::copy_n(h.data<float>(), p.size, sh.host.begin() + p.offset);
  }
  replicate(p);
}

void ParameterServerSync::reply(int w, int j, int64_t clock) {
  WorkerState& ws = peers_[static_cast<size_t>(w)];
  const ServerPiece& p = pieces_[static_cast<size_t>(j)];
  Message& r = ws.reply[static_cast<size_t>(j)];
  if (r.work) r.work->wait();  // the last reply of this piece (the worker received it before pushing again)
  // A due admission rides on every reply (request_admission): 1 + B - clock, never below 1 (no reply is of a clock
  // past B before the admission).
  const int64_t ahead = admit_at_ >= 0 ? admit_at_ - clock : -1;
  TANDEM_CHECK(admit_at_ < 0 || ahead >= 0, Status::kInternal,
               "parameter server {}: a pull reply of clock {} past the admission due at step {}", server_, clock,
               admit_at_);
  r.set(Header{kPull, rank_, p.global, static_cast<int32_t>(ahead + 1), clock, p.size});
  std::copy_n(host_of(p), p.size, r.payload());
  ws.pulled[static_cast<size_t>(j)] = p.optimizer->steps();
  r.work = world_->send(r.buf.data(), r.buf.size(), DType::kF32, w, pull_tag(p.global));
  note(PieceEvent::kReplied, p, w, clock);
  if (++ws.replied == static_cast<int64_t>(pieces_.size())) {
    // The worker may start its next step once it has every server's replies: its clock against the slowest's.
    max_gap_ = std::max(max_gap_, clock - slowest());
  }
}

void ParameterServerSync::note(PieceEvent::Kind kind, const ServerPiece& p, int32_t worker, int64_t clock) const {
  if (!piece_hook_) return;
  const int64_t version = program_.staleness < 0 ? p.optimizer->steps() : p.applied;
  piece_hook_(PieceEvent{kind, p.global, worker, clock, version});
}

bool ParameterServerSync::release_withheld() {
  bool progressed = false;
  for (size_t i = 0; i < withheld_.size();) {
    const Withheld x = withheld_[i];
    const ServerPiece& p = pieces_[static_cast<size_t>(x.piece)];
    if (p.applied >= x.clock - program_.staleness && p.replicated() >= x.clock - program_.staleness) {
      reply(x.worker, x.piece, x.clock);
      withheld_.erase(withheld_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
    } else {
      ++i;
    }
  }
  return progressed;
}

void ParameterServerSync::on_elastic(int w) {
  WorkerState& ws = peers_[static_cast<size_t>(w)];
  Shard& centre = owned_.front();
  const int64_t n = centre.range.size();
  expect(ws.elastic, w, kCentre, server_, ws.started, n);
  Message& d = ws.delta;
  if (d.work) d.work->wait();
  d.set(Header{kDelta, rank_, server_, 0, ws.started, n});
  const float* x = ws.elastic.payload();
  float* delta = d.payload();
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    delta[i] = alpha_ * (x[i] - centre.host[k]);
    centre.host[k] += delta[i];
  }
  if (!model_.backend().device().is_cpu()) {
    model_.backend().copy(Tensor::wrap(centre.host.data(), Shape{n}, DType::kF32), centre.dev);
  }
  d.work = world_->send(d.buf.data(), d.buf.size(), DType::kF32, w, kTagDelta);
  ws.done = ws.started;
}

comm::Work* ParameterServerSync::next_receive(int64_t due) {
  // A posted push always lands without anything from us. A control message does too unless its worker waits for a
  // reply of ours (withheld); and only a worker behind `due` is needed (one ahead may send its next much later).
  for (WorkerState& ws : peers_) {
    for (Message& m : ws.push)
      if (m.work) return m.work.get();
  }
  for (size_t w = 0; w < peers_.size(); ++w) {
    WorkerState& ws = peers_[w];
    if (ws.paused || !ws.control.work || ws.done >= due) continue;
    if (std::any_of(withheld_.begin(), withheld_.end(), [&](const Withheld& x) { return x.worker == static_cast<int>(w); }))
      continue;
    return ws.control.work.get();
  }
  return nullptr;
}

template <typename Done>
void ParameterServerSync::serve_until(const Done& done, int64_t due, const char* what) {
  const auto limit = world_->options().timeout + std::chrono::seconds(5);
  auto last = Clock::now();
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    bool progressed = false;
    for (int w = 0; w < program_.workers; ++w) progressed |= poll_worker(w);
    progressed |= poll_replication();
    progressed |= release_withheld();
    if (progressed) {
      last = Clock::now();
      pause = std::chrono::microseconds(20);
      continue;
    }
    // ps (staleness 0): every receive posted must complete before the step (or sync point) can, and no reply can be
    // released meanwhile, so block on one of them (woken when it lands) instead of polling.
    if (program_.staleness == 0 && !elastic_ && backups_.empty() && primaries_.empty()) {
      if (comm::Work* next = next_receive(due)) {
        next->wait();
        continue;
      }
    }
    if (Clock::now() - last > limit) {
      // The communicator's own deadline on the posted receives normally fires first and names the rank.
      std::string waiting;
      for (size_t w = 0; w < peers_.size(); ++w) {
        if (!peers_[w].paused) waiting += fmt::format("{}world rank {} (clock {})", waiting.empty() ? "" : ", ", w,
                                                      peers_[w].done);
      }
      TANDEM_THROW(Status::kTimeout, "parameter server (world rank {}): nothing from the workers for {} ms at {}; "
                   "waiting for {}", rank_, std::chrono::duration_cast<std::chrono::milliseconds>(limit).count(), what,
                   waiting);
    }
    // Sleep rather than spin (ranks share cores), but briefly: a push seen late delays every worker's pull.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

void ParameterServerSync::serve(int64_t steps) {
  TANDEM_CHECK(server_ >= 0, Status::kInternal, "serve: world rank {} is a worker", rank_);
  enter_region();
  const int64_t due = elastic_ ? (steps + program_.period - 1) / program_.period : steps;
  const int64_t t0 = tracer_.now_ns();
  serve_until(
      [&] {
        for (size_t w = 0; w < peers_.size(); ++w) {
          const WorkerState& ws = peers_[w];
          if (ws.done >= due) continue;
          TANDEM_CHECK(!ws.paused, Status::kMismatch,
                       "parameter server (world rank {}): world rank {} left training after {} {} but the server "
                       "serves step {} (ranks must call step() equally often)",
                       rank_, w, ws.done, elastic_ ? "exchanges" : "steps", steps);
          return false;
        }
        return true;
      },
      due, "a step");
  clock_ = std::max(clock_, steps);
  tracer_.add(fmt::format("serve step {}", steps), "comm", t0, tracer_.now_ns());
}

// ------------------------------------------------------------------------------------ replication (issue #17)

void ParameterServerSync::place_replicas() {
  backups_.clear();
  primaries_.clear();
  kept_.clear();
  for (ServerPiece& p : pieces_) p.acked.clear();
  if (server_ < 0 || elastic_ || program_.replicas <= 0) return;
  const int W = program_.workers, S = program_.servers;
  for (int32_t b : replica_servers(server_, S, program_.replicas)) {
    Link& l = backups_.emplace_back();
    l.to = W + b;
  }
  for (ServerPiece& p : pieces_) p.acked.assign(backups_.size(), -1);
  for (int32_t o = 0; o < S; ++o) {
    const std::vector<int32_t> b = replica_servers(o, S, program_.replicas);
    if (std::find(b.begin(), b.end(), server_) != b.end()) primaries_.push_back(Primary{W + o, Message{}, true});
  }
  reseed_ = true;
}

void ParameterServerSync::replicate(ServerPiece& p) {
  if (backups_.empty()) return;
  const std::vector<Tensor> st = p.optimizer->state_tensors();
  compute::Backend& be = model_.backend();
  const int64_t updates = p.optimizer->steps();
  const int64_t count = static_cast<int64_t>(1 + st.size()) * p.size;
  // the message the compiled job describes, and the simulator times (SyncProgram::replica_bytes_per_param)
  TANDEM_CHECK(4.0 * static_cast<double>(count) == program_.replica_bytes_per_param * static_cast<double>(p.size),
               Status::kInternal, "parameter server replication: a replica of piece {} is {} bytes, the job says {}",
               p.global, 4 * count, program_.replica_bytes_per_param * static_cast<double>(p.size));
  const auto local = static_cast<int32_t>(&p - pieces_.data());
  for (Link& l : backups_) {
    Message h;
    h.set(Header{kReplica, rank_, p.global, 0, updates, count});
    Message m;
    m.buf.resize(static_cast<size_t>(count));
    std::copy_n(host_of(p), p.size, m.buf.data());
    for (size_t k = 0; k < st.size(); ++k) {
      const Tensor t = be.to_host(st[k]);
      std::copy_n(t.data<float>(), p.size, m.buf.data() + static_cast<int64_t>(k + 1) * p.size);
    }
    // (a Message's buffer keeps its address when the Message moves into the vector)
    h.work = world_->send(h.buf.data(), kHeaderFloats, DType::kF32, l.to, kTagReplicaHeader);
    l.sends.push_back(std::move(h));
    if (reform_hook_ && updates > 0) reform_hook_("replicating");  // test hook: a loss between header and payload
    m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, l.to, kTagReplica);
    l.sends.push_back(std::move(m));
    l.unacked.emplace_back(local, updates);
    if (!l.ack.work) {
      l.ack.buf.assign(kHeaderFloats, 0.0f);
      l.ack.work = world_->recv(l.ack.buf.data(), kHeaderFloats, DType::kF32, l.to, kTagAck);
    }
  }
}

bool ParameterServerSync::poll_replication() {
  bool progressed = false;
  for (size_t i = 0; i < backups_.size(); ++i) {
    Link& l = backups_[i];
    std::erase_if(l.sends, [](Message& m) { return !m.work || m.work->test(); });
    while (l.ack.work && l.ack.work->test()) {
      l.ack.work.reset();
      progressed = true;
      TANDEM_CHECK(!l.unacked.empty(), Status::kMismatch,
                   "parameter server replication: world rank {} got an acknowledgement from world rank {} for no "
                   "replica", rank_, l.to);
      const auto [local, updates] = l.unacked.front();
      l.unacked.erase(l.unacked.begin());
      ServerPiece& p = pieces_[static_cast<size_t>(local)];
      expect(l.ack, l.to, kAck, p.global, updates, 0);
      p.acked[i] = updates;
      if (!l.unacked.empty()) {
        l.ack.buf.assign(kHeaderFloats, 0.0f);
        l.ack.work = world_->recv(l.ack.buf.data(), kHeaderFloats, DType::kF32, l.to, kTagAck);
      }
    }
  }
  std::erase_if(ack_sends_, [](Message& m) { return !m.work || m.work->test(); });
  for (Primary& pr : primaries_) {
    while (pr.header.work && pr.header.work->test()) {
      pr.header.work.reset();
      progressed = true;
      const Header h = pr.header.header();
      if (h.kind == kReplicaEnd) {
        expect(pr.header, pr.from, kReplicaEnd, 0, 0, 0);
        pr.ended = true;
        break;
      }
      TANDEM_CHECK(h.kind == kReplica && h.sender == pr.from && h.piece >= 0 &&
                       static_cast<size_t>(h.piece) < program_.pieces.size(),
                   Status::kMismatch,
                   "parameter server replication: world rank {} expected a replica header from world rank {} but got "
                   "{} (kind {}, sender {}, piece {})",
                   rank_, pr.from, kind_name(h.kind), h.kind, h.sender, h.piece);
      const BucketPiece& bp = program_.pieces[static_cast<size_t>(h.piece)];
      const int64_t size = bp.end - bp.begin;
      TANDEM_CHECK(h.count > 0 && h.count % size == 0, Status::kMismatch,
                   "parameter server replication: a replica of piece {} from world rank {} has {} values, not a "
                   "multiple of its {}", h.piece, pr.from, h.count, size);
      // The payload lands beside the last complete copy, which it replaces only once it is whole: a primary lost
      // between the two messages leaves that copy (and its update count) as it was, never one half-overwritten.
      std::vector<float> values(static_cast<size_t>(h.count), 0.0f);
      world_->recv(values.data(), values.size(), DType::kF32, pr.from, kTagReplica)->wait();  // sent with it
      Kept& k = kept_[h.piece];
      k.values = std::move(values);
      k.updates = h.clock;
      Message& a = ack_sends_.emplace_back();
      a.set(Header{kAck, rank_, h.piece, 0, h.clock, 0});
      a.work = world_->send(a.buf.data(), kHeaderFloats, DType::kF32, pr.from, kTagAck);
      pr.header.buf.assign(kHeaderFloats, 0.0f);
      pr.header.work = world_->recv(pr.header.buf.data(), kHeaderFloats, DType::kF32, pr.from, kTagReplicaHeader);
    }
  }
  return progressed;
}

bool ParameterServerSync::replicas_seeded() const {
  const int W = program_.workers;
  for (const Primary& pr : primaries_) {
    for (size_t g = 0; g < program_.pieces.size(); ++g) {
      if (W + program_.pieces[g].server != pr.from) continue;
      const auto it = kept_.find(static_cast<int32_t>(g));
      if (it == kept_.end() || it->second.updates < 0) return false;
    }
  }
  return true;
}

bool ParameterServerSync::replication_flushed() const {
  return std::all_of(backups_.begin(), backups_.end(), [](const Link& l) { return l.unacked.empty(); });
}

void ParameterServerSync::end_replication() {
  for (Link& l : backups_) {
    Message& m = l.sends.emplace_back();
    m.set(Header{kReplicaEnd, rank_, 0, 0, 0, 0});
    m.work = world_->send(m.buf.data(), kHeaderFloats, DType::kF32, l.to, kTagReplicaHeader);
  }
}

// ------------------------------------------------------------------------------------ every rank

void ParameterServerSync::sync_point() {
  if (!in_region_) return;
  const int W = program_.workers;
  if (server_ < 0) {
    TANDEM_CHECK(!step_started_, Status::kInternal, "sync point in the middle of a step");
    send_control(kPause, elastic_ ? exchanges_ : clock_);
    if (!elastic_) {
      receive_shards();  // every worker leaves with the servers' parameters
    }
    for (auto& w : control_sends_) w->wait();
    in_region_ = false;
    return;
  }
  serve_until(
      [&] {
        return std::all_of(peers_.begin(), peers_.end(), [](const WorkerState& ws) { return ws.paused; });
      },
      INT64_MAX, "a sync point");
  // Replication: every update acknowledged by the backups, then the end marker; and the primaries' markers here.
  serve_until([&] { return replication_flushed(); }, INT64_MAX, "the backups' acknowledgements");
  end_replication();
  serve_until([&] { return std::all_of(primaries_.begin(), primaries_.end(), [](const Primary& p) { return p.ended; }); },
              INT64_MAX, "the primaries' last replicas");
  for (size_t w = 0; w < peers_.size(); ++w) {
    TANDEM_CHECK(peers_[w].done == peers_[0].done, Status::kMismatch,
                 "parameter server (world rank {}): world rank {} left training at clock {} but world rank 0 at {} "
                 "(ranks must call step() equally often)",
                 rank_, w, peers_[w].done, peers_[0].done);
  }
  TANDEM_CHECK(withheld_.empty(), Status::kInternal, "parameter server {}: {} pull replies still withheld at a sync point",
               server_, withheld_.size());
  in_region_ = false;
  if (elastic_) return;
  clock_ = peers_.empty() ? clock_ : peers_[0].done;
  send_shards(std::vector<int64_t>(static_cast<size_t>(W), clock_));
  for (WorkerState& ws : peers_) {
    for (Message& r : ws.reply) {
      if (r.work) r.work->wait();
      r.work.reset();
    }
    if (ws.delta.work) ws.delta.work->wait();
    ws.delta.work.reset();
  }
}

std::vector<std::vector<float>> ParameterServerSync::gather_state(int root) {
  const size_t K = elastic_ ? 0 : state_tensors_per_buffer(optimizer_config_);
  if (K == 0) return {};
  compute::Backend& be = model_.backend();
  return gather_shards(root, K, [&](size_t shard, float* out) {
    const int64_t n = owned_[shard].range.size();
    for (const ServerPiece& p : pieces_) {
      if (static_cast<size_t>(p.shard) != shard) continue;
      const std::vector<Tensor> st = p.optimizer->state_tensors();
      TANDEM_CHECK(st.size() == K, Status::kInternal, "optimizer of piece {} has {} state tensors, expected {}",
                   p.global, st.size(), K);
      for (size_t k = 0; k < K; ++k) {
        const Tensor h = be.to_host(st[k]);
        std::copy_n(h.data<float>(), p.size, out + static_cast<int64_t>(k) * n + p.offset);
      }
    }
  });
}

std::vector<float> ParameterServerSync::gather_centre(int root) {
  TANDEM_CHECK(elastic_, Status::kInternal, "gather_centre: this job has no elastic centre");
  std::vector<std::vector<float>> v = gather_shards(root, 1, [&](size_t shard, float* out) {
    std::copy(owned_[shard].host.begin(), owned_[shard].host.end(), out);
  });
  return v.empty() ? std::vector<float>{} : std::move(v.front());
}

std::vector<std::vector<float>> ParameterServerSync::gather_shards(
    int root, size_t K, const std::function<void(size_t shard, float* out)>& fill) {
  TANDEM_CHECK(!restore_due_, Status::kInternal,
               "parameter server: the shards taken from the checkpoint are not restored yet (restore())");
  TANDEM_CHECK(!in_region_, Status::kInternal,
               "gathering the shards inside the push/pull region (call sync_point first)");
  const int W = program_.workers;
  if (server_ >= 0) {
    std::vector<Message> out(owned_.size());
    for (size_t i = 0; i < owned_.size(); ++i) {
      const int64_t n = owned_[i].range.size();
      out[i].set(Header{kState, rank_, owned_[i].index, 0, clock_, static_cast<int64_t>(K) * n});
      fill(i, out[i].payload());
    }
    for (size_t i = 0; i < owned_.size(); ++i)
      out[i].work = world_->send(out[i].buf.data(), out[i].buf.size(), DType::kF32, root,
                                 kTagStateShard + static_cast<uint32_t>(owned_[i].index));
    for (Message& m : out) m.work->wait();
  }
  if (rank_ != root) return {};
  std::vector<std::vector<float>> out(K, std::vector<float>(static_cast<size_t>(model_.total_params()), 0.0f));
  for (size_t s = 0; s < program_.shards.size(); ++s) {
    const KeyRange& r = program_.shards[s];
    Message m;
    m.buf.assign(kHeaderFloats + K * static_cast<size_t>(r.size()), 0.0f);
    world_->recv(m.buf.data(), m.buf.size(), DType::kF32, W + r.server, kTagStateShard + static_cast<uint32_t>(s))->wait();
    expect(m, W + r.server, kState, static_cast<int32_t>(s), clock_, static_cast<int64_t>(K) * r.size());
    for (size_t k = 0; k < K; ++k)
      std::copy_n(m.payload() + static_cast<int64_t>(k) * r.size(), r.size(), out[k].begin() + r.begin);
  }
  return out;
}

int64_t ParameterServerSync::updates() const noexcept {
  int64_t u = -1;
  for (const ServerPiece& p : pieces_) u = std::max(u, p.optimizer->steps());
  return u;
}

void ParameterServerSync::restore(int64_t steps, const float* params,
                                  const std::vector<const std::vector<float>*>& state, int64_t saved_updates) {
  TANDEM_CHECK(!in_region_, Status::kInternal, "restore inside the push/pull region (call sync_point first)");
  clock_ = steps;
  step_start_.clear();   // no step is redone across a restore
  restore_due_ = false;  // the shards taken from the checkpoint by a re-form are real now
  // Asynchronous EASGD: a worker exchanges before its local steps 0, tau, 2 tau, ...: after `steps` steps it has made
  // ceil(steps / tau) exchanges (the count serve() expects); `params` is the centre.
  const int64_t exchanges = (steps + program_.period - 1) / program_.period;
  if (elastic_) exchanges_ = exchanges;
  if (server_ < 0) return;
  compute::Backend& be = model_.backend();
  for (Shard& sh : owned_) {
    std::copy(params + sh.range.begin, params + sh.range.end, sh.host.begin());
    if (!be.device().is_cpu()) be.copy(Tensor::wrap(sh.host.data(), Shape{sh.range.size()}, DType::kF32), sh.dev);
  }
  if (elastic_) {
    for (WorkerState& ws : peers_) ws.started = ws.done = exchanges;
    return;
  }
  const size_t K = state_tensors_per_buffer(optimizer_config_);
  TANDEM_REQUIRE(state.size() == K, "parameter server: the checkpoint has {} optimizer state tensors, this optimizer {}",
                 state.size(), K);
  // ps-async counts one optimizer update per push: W per worker step at one width; the file's count when it has one.
  const int64_t updates = program_.staleness >= 0 ? steps
                          : saved_updates >= 0    ? saved_updates
                                                  : steps * program_.workers;
  for (ServerPiece& p : pieces_) {
    const int64_t begin = owned_[static_cast<size_t>(p.shard)].range.begin + p.offset;
    std::vector<Tensor> st;
    for (const std::vector<float>* v : state) {
      TANDEM_REQUIRE(v != nullptr && static_cast<int64_t>(v->size()) >= begin + p.size,
                     "parameter server: optimizer state of {} values is shorter than the model", v ? v->size() : 0);
      st.push_back(Tensor::wrap(const_cast<float*>(v->data()) + begin, Shape{p.size}, DType::kF32));
    }
    p.optimizer->restore(updates, st);
    // The schedule is at step `steps` here, whatever the count (rebase_schedule's rule; at one width the same as 0).
    p.lr_steps = steps;
    p.lr_updates = updates;
    p.applied = steps;
    p.pending.clear();
    std::fill(p.acked.begin(), p.acked.end(), -1);
  }
  reseed_ = true;  // the backups hold the state before the checkpoint
  kept_.clear();   // and so do this server's copies: a loss before the re-seed finds them incomplete, never stale
  for (WorkerState& ws : peers_) {
    ws.started = ws.done = steps;
    std::fill(ws.push_clock.begin(), ws.push_clock.end(), steps);
    mark_pulled(ws);  // every worker restored the checkpoint's parameters
  }
  withheld_.clear();
}

}  // namespace tandem::engine::parallel

namespace tandem::engine::parallel {

// ------------------------------------------------------------------------------------ absorbing a lost worker

// Everything in flight on a failed communicator (or in an abandoned re-form attempt): its buffers outlive it.
struct ParameterServerSync::InFlight {
  std::vector<Message> messages;
  std::vector<std::unique_ptr<comm::Work>> works;
  std::vector<WorkerState> peers;
  std::vector<std::vector<Header>> control_out;  // the sources of control sends (a vector keeps its buffer on move)
  std::vector<Link> links;
  std::vector<Primary> primaries;
  std::vector<std::shared_ptr<void>> earlier;  // abandoned attempts before this one
};

void ParameterServerSync::retire_in_flight(InFlight& into) {
  for (auto* v : {&push_, &pull_, &ack_sends_, &stray_})
    for (Message& m : *v)
      if (m.work) into.messages.push_back(std::move(m));
  ack_sends_.clear();
  stray_.clear();
  for (Message& m : push_) m = Message{};
  for (Message& m : pull_) m = Message{};
  for (auto& w : control_sends_)
    if (w) into.works.push_back(std::move(w));
  into.control_out.push_back(std::move(control_out_));
  control_out_.clear();
  for (Link& l : backups_) into.links.push_back(std::move(l));
  backups_.clear();
  for (Primary& pr : primaries_) into.primaries.push_back(std::move(pr));
  primaries_.clear();
  for (WorkerState& ws : peers_) into.peers.push_back(std::move(ws));
  peers_.clear();
}

std::shared_ptr<void> ParameterServerSync::take_retired() {
  auto r = std::make_shared<InFlight>();
  r->earlier = std::move(abandoned_);
  abandoned_.clear();
  for (Message& m : stray_) r->messages.push_back(std::move(m));
  stray_.clear();
  return r;
}

ParameterServerSync::Reformed ParameterServerSync::reform(comm::Communicator& survivors, const std::vector<int>& kept,
                                                          const std::vector<int>& kept_servers, int64_t steps,
                                                          bool checkpoint) {
  TANDEM_CHECK(tentative_ == nullptr, Status::kInternal,
               "parameter server reform: the outcome of the last vote is not settled (adopt_tentative or drop_tentative)");
  const int S_old = program_.servers;
  const int S = static_cast<int>(kept_servers.size());
  const int W = survivors.size() - S;
  TANDEM_CHECK(W >= 1 && S >= 1 && static_cast<int>(kept.size()) == W && survivors.rank() < survivors.size() &&
                   std::is_sorted(kept_servers.begin(), kept_servers.end()) && kept_servers.back() < S_old,
               Status::kInternal, "parameter server reform: {} ranks left for {} servers, {} kept workers",
               survivors.size(), S, kept.size());
  std::vector<int32_t> lost;
  for (int32_t s = 0; s < S_old; ++s)
    if (std::find(kept_servers.begin(), kept_servers.end(), s) == kept_servers.end()) lost.push_back(s);
  const size_t NS = program_.shards.size();
  const size_t row = 3 + NS;
  const size_t kDue = 2 + NS;
  // ---- [worker's completed clock, server's lowest applied clock, per shard: the update count of this server's
  //      complete backup of it (-1: none), restore_due()] from every survivor ----
  const bool sync = !elastic_ && program_.staleness >= 0;
  std::vector<int64_t> mine(row, -1);
  mine[0] = 0;
  mine[1] = INT64_MAX;
  if (server_ < 0) {
    mine[0] = elastic_ ? exchanges_ : clock_;
  } else {
    if (sync)
      for (const ServerPiece& p : pieces_) mine[1] = std::min(mine[1], p.applied);
    std::vector<int64_t> low(NS, INT64_MAX);
    std::vector<bool> complete(NS, !kept_.empty());
    for (size_t g = 0; g < program_.pieces.size(); ++g) {
      const BucketPiece& bp = program_.pieces[g];
      for (size_t k = 0; k < NS; ++k) {
        if (bp.begin < program_.shards[k].begin || bp.end > program_.shards[k].end) continue;
        const auto it = kept_.find(static_cast<int32_t>(g));
        if (it == kept_.end() || it->second.updates < 0) complete[k] = false;
        else low[k] = std::min(low[k], it->second.updates);
      }
    }
    for (size_t k = 0; k < NS; ++k) mine[2 + k] = complete[k] && low[k] != INT64_MAX ? low[k] : -1;
  }
  mine[kDue] = restore_due_ ? 1 : 0;
  std::vector<int64_t> all(row * static_cast<size_t>(survivors.size()));
  survivors.allgather(mine.data(), all.data(), row, DType::kI64)->wait();
  const auto at = [&](int r, size_t k) { return all[row * static_cast<size_t>(r) + k]; };
  if (reform_hook_) reform_hook_("agreed");

  // ---- lost servers: who takes each of their shards (the job compiler's rule), from a replica or the checkpoint ----
  SyncProgram next = program_;
  next.workers = W;
  bool from_checkpoint = false;
  std::vector<int64_t> taken(NS, -1);  // a shard taken over from a replica: the replica's update count
  bool due = false;  // a restore from the checkpoint that an earlier re-form started has not completed on some rank
  for (int r = 0; r < survivors.size(); ++r) due = due || at(r, kDue) != 0;
  if (due) {
    // The shards taken from the checkpoint then hold no real values yet (nor do their replicas, re-seeded from
    // them): every rank goes back to the checkpoint again, whatever this loss took.
    TANDEM_CHECK(checkpoint, Status::kPeerFailure,
                 "the restore from the checkpoint that the last parameter-server re-form started did not complete, and "
                 "the checkpoint is gone (elastic_checkpoint): the job stops; restart it from a checkpoint");
    if (!lost.empty() && elastic_) reshard_servers(next, S, optimizer_config_);
    else if (!lost.empty()) fail_over_servers(next, lost, true, optimizer_config_);
    from_checkpoint = true;
  } else if (!lost.empty() && elastic_) {
    // Asynchronous EASGD keeps no replica of the centre (its exchange pairs server k with shard k): a lost shard
    // comes back from the checkpoint, the centre cut again over the survivors (reshard_servers), or the job stops.
    std::vector<std::string> gone;
    for (size_t k = 0; k < NS; ++k)
      if (std::find(lost.begin(), lost.end(), program_.shards[k].server) != lost.end())
        gone.push_back(fmt::format("parameter server {} was lost with shard {} [{}, {}) of the asynchronous EASGD centre",
                                   program_.shards[k].server, k, program_.shards[k].begin, program_.shards[k].end));
    TANDEM_CHECK(checkpoint, Status::kPeerFailure,
                 "lost {} of the centre's {} shards: {}; the centre has no replica (asynchronous EASGD keeps none) and "
                 "there is no checkpoint to restore it from (elastic_checkpoint), so the job stops; restart it from the "
                 "last checkpoint", gone.size(), NS, fmt::join(gone, "; "));
    reshard_servers(next, S, optimizer_config_);
    from_checkpoint = true;
  } else if (!lost.empty()) {
    // Every lost shard goes to the first surviving server of its backups (fail_over_servers' rule), which must hold a
    // complete replica of it; the shards that have none are named together.
    std::vector<std::string> gone;
    for (size_t k = 0; k < NS; ++k) {
      const int32_t was = program_.shards[k].server;
      if (std::find(lost.begin(), lost.end(), was) == lost.end()) continue;
      int32_t to = -1;  // the backup's index among the survivors
      for (int32_t b : replica_servers(was, S_old, program_.replicas)) {
        const auto it = std::find(kept_servers.begin(), kept_servers.end(), b);
        if (it != kept_servers.end()) {
          to = static_cast<int32_t>(it - kept_servers.begin());
          break;
        }
      }
      const std::string shard = fmt::format("parameter server {} was lost with shard {} [{}, {})", was, k,
                                            program_.shards[k].begin, program_.shards[k].end);
      if (to < 0) {
        gone.push_back(fmt::format("{}: no replica on a surviving server ({} replica(s) per shard)", shard,
                                   program_.replicas));
        continue;
      }
      taken[k] = at(W + to, 2 + k);
      if (taken[k] < 0)
        gone.push_back(fmt::format("{}: its replica on server {} is incomplete (the replicas were being re-seeded "
                                   "after an earlier loss)", shard, kept_servers[static_cast<size_t>(to)]));
    }
    if (gone.empty()) fail_over_servers(next, lost, false, optimizer_config_);  // the same owners as above
    if (!gone.empty()) {
      TANDEM_CHECK(checkpoint, Status::kPeerFailure,
                   "lost {} of the model's {} shards: {}; and no checkpoint to restore them from (elastic_checkpoint), "
                   "so the job stops; restart it from the last checkpoint", gone.size(), NS, fmt::join(gone, "; "));
      next = program_;
      next.workers = W;
      fail_over_servers(next, lost, true, optimizer_config_);
      from_checkpoint = true;
      std::fill(taken.begin(), taken.end(), -1);
    }
  }
  int64_t applied_everywhere = INT64_MIN;
  if (sync) {
    applied_everywhere = INT64_MAX;
    for (int s = 0; s < S; ++s) applied_everywhere = std::min(applied_everywhere, at(W + s, 1));
    for (size_t k = 0; k < NS; ++k)
      if (taken[k] >= 0) applied_everywhere = std::min(applied_everywhere, taken[k]);
  }
  std::vector<int64_t> clocks(static_cast<size_t>(W));
  for (int w = 0; w < W; ++w) clocks[static_cast<size_t>(w)] = std::max(at(w, 0), applied_everywhere);
  // from_checkpoint: every rank goes back to the checkpoint (restore() resets the clocks); until then one clock for
  // all, nothing pending, so the sync point before the restore closes cleanly.
  const int64_t top = *std::max_element(clocks.begin(), clocks.end());
  if (from_checkpoint) std::fill(clocks.begin(), clocks.end(), top);

  // Everything in flight on the failed communicator, and the attempts abandoned before this one.
  auto retired = std::make_shared<InFlight>();
  retire_in_flight(*retired);
  retired->earlier = std::move(abandoned_);
  abandoned_.clear();

  // ---- the transaction: the old view set aside untouched; the new one built beside it (copies) ----
  View old = take_view();
  withheld_.clear();
  const auto put_back = [&] {
    retire_in_flight(*retired);  // this attempt's operations on `survivors`
    abandoned_.push_back(retired);
    put_view(std::move(old));
  };
  bool in_vote = false;

  Reformed out;
  out.lost_servers = lost;
  out.from_checkpoint = from_checkpoint;
  try {
    control_out_.assign(static_cast<size_t>(S), Header{});
    control_sends_.clear();
    control_sends_.resize(static_cast<size_t>(S));
    clear_admission();  // some ranks may have learned of one, others not: worker 0 asks again
    world_ = &survivors;
    rank_ = survivors.rank();
    program_ = std::move(next);
    step_started_ = false;
    armed_ = false;
    std::fill(issued_.begin(), issued_.end(), false);
    if (server_ < 0) {
      const int64_t c = clocks[static_cast<size_t>(rank_)];
      out.step_done = c > mine[0];
      if (elastic_) {
        exchanges_ = c;
        clock_ = steps;
        push_.resize(static_cast<size_t>(S));  // one exchange message per server (re-sharded after a loss)
        pull_.resize(static_cast<size_t>(S));
      } else {
        clock_ = c;
      }
      in_region_ = true;
    } else {
      server_ = rank_ - W;
      owned_.reserve(NS);
      compute::Backend& be = model_.backend();
      // Asynchronous EASGD restored from the checkpoint: the centre's shard server_ of the re-cut program, its
      // values from the checkpoint (the caller's restore(); zeros until then).
      if (elastic_ && from_checkpoint) {
        const std::vector<float> zeros(static_cast<size_t>(program_.shards[static_cast<size_t>(server_)].size()), 0.0f);
        own_shard(server_, zeros.data());
      }
      // ---- the shards this server keeps: copies of the old view's (values; each piece's optimizer state, update
      //      count, clock, schedule base; the pushes pending, re-indexed to the survivors) ----
      if (!(elastic_ && from_checkpoint)) copy_owned(old, [&](ServerPiece& p, const ServerPiece& o_) {
        const ServerPiece* o = &o_;
        if (W != old.program.workers) {  // ps-async: the schedule keeps its place (rebase_schedule's rule)
          p.lr_steps = o->schedule_step(o->optimizer->steps(), old.program.workers);
          p.lr_updates = o->optimizer->steps();
        }
        for (const auto& [t, slot] : o->pending) {
          std::vector<std::vector<float>> now(static_cast<size_t>(W));
          bool any = false;
          for (int w = 0; w < W; ++w) {
            const auto from = static_cast<size_t>(kept[static_cast<size_t>(w)]);
            // only the pushes of a completed step: a step in flight is pushed again
            if (from < slot.size() && clocks[static_cast<size_t>(w)] >= t && !slot[from].empty()) {
              now[static_cast<size_t>(w)] = slot[from];
              any = true;
            }
          }
          if (any) p.pending.emplace(t, std::move(now));
        }
        if (from_checkpoint) {
          p.pending.clear();
          p.applied = top;
        }
      });
      // ---- the shards this server takes over: from its replica (values, optimizer state, clock), or empty until
      //      the caller restores the checkpoint ----
      for (size_t k = 0; k < NS && !(elastic_ && from_checkpoint); ++k) {
        const KeyRange& r = program_.shards[k];
        if (r.server != server_ ||
            std::any_of(owned_.begin(), owned_.end(), [&](const Shard& sh) { return sh.index == static_cast<int32_t>(k); }))
          continue;
        std::vector<float> values(static_cast<size_t>(r.size()), 0.0f);
        if (taken[k] >= 0) {
          for (size_t g = 0; g < program_.pieces.size(); ++g) {
            const BucketPiece& bp = program_.pieces[g];
            if (bp.begin >= r.begin && bp.end <= r.end)
              std::copy_n(old.kept.at(static_cast<int32_t>(g)).values.begin(), bp.end - bp.begin,
                          values.begin() + (bp.begin - r.begin));
          }
        }
        const size_t first = pieces_.size();
        own_shard(static_cast<int32_t>(k), values.data());
        for (size_t j = first; j < pieces_.size() && taken[k] >= 0; ++j) {
          ServerPiece& p = pieces_[j];
          const Kept& kp = old.kept.at(p.global);
          const size_t K = kp.values.size() / static_cast<size_t>(p.size) - 1;
          std::vector<Tensor> st;
          for (size_t i = 0; i < K; ++i) {
            Tensor h = Tensor::wrap(const_cast<float*>(kp.values.data()) + static_cast<int64_t>(i + 1) * p.size,
                                    Shape{p.size}, DType::kF32);
            if (!be.device().is_cpu()) {
              Tensor d = be.empty(Shape{p.size});
              be.copy(h, d);
              h = d;
            }
            st.push_back(h);
          }
          // ssp: the owner may have applied clocks after this replica's that every worker has pushed already (a
          // worker's pull needed only clock t - S replicated); those updates are lost, and the piece goes on from the
          // newest clock any worker completed, so no clock waits for pushes that will not come again. ps: the
          // replica is never behind a completed clock, so this keeps its clock.
          const int64_t updates = sync ? std::max(kp.updates, top) : kp.updates;
          p.optimizer->restore(updates, st);
          p.applied = sync ? updates : 0;
        }
      }
      // ---- the survivors' states ----
      peers_.resize(static_cast<size_t>(W));
      for (int w = 0; w < W; ++w) reset_peer(peers_[static_cast<size_t>(w)], clocks[static_cast<size_t>(w)]);
      // ssp: a clock the lost worker had not pushed may be complete over the survivors now (a survivor completed
      // it, so its push stays pending): applied before the backups are placed, so that its new values go to them
      // only with the re-seed. Each backup then gets exactly one replica of each piece before the vote, and holding
      // one of each (replicas_seeded) means it has taken everything its primary sent; a replica sent beside the
      // re-seed was left untaken by a backup already in the vote, its primary never saw the acknowledgement and
      // the re-form ran into the deadline (every survivor stopped: "every worker was lost").
      for (ServerPiece& p : pieces_)
        if (sync) apply_complete(p);
      place_replicas();  // over the survivors; re-seeded on entering the region
      in_region_ = false;
      enter_region();
    }

    // ---- parameters: the workers go on from the servers' newest values (push/pull) ----
    if (!elastic_) {
      if (server_ >= 0) {
        send_shards(clocks);
      } else {
        receive_shards();
        if (!out.step_done && !step_start_.empty()) {
          // ps with replicas: the step in flight is redone from the parameters it started with (some shards may have
          // applied it, others not), so its gradient is the one the uninterrupted run computes.
          copy_into_params(0, static_cast<int64_t>(step_start_.size()), step_start_.data());
        }
      }
    }
    // ---- the re-seed is part of the transaction: before it votes, each server holds the full replicas of the pieces
    //      it backs up and its backups acknowledged its own, so a server lost right after the commit is taken over
    //      from them (its state came over whole). The workers wait in the vote meanwhile: nothing else arrives ----
    if (server_ >= 0)
      serve_until([&] { return replication_flushed() && replicas_seeded(); }, INT64_MAX, "the re-seed of the replicas");
    // ---- the vote: every survivor has built the new view and holds its parameters. A sum of ones: the result
    //      carries every rank's contribution, so it completes nowhere unless every survivor voted, and the count
    //      is checked (a barrier would also wait for everyone now, but says nothing of who took part) ----
    if (reform_hook_) reform_hook_("voting");
    in_vote = true;
    const int64_t yes = 1;
    int64_t votes = 0;
    survivors.allreduce(&yes, &votes, 1, DType::kI64, ReduceOp::kSum)->wait();
    TANDEM_CHECK(votes == survivors.size(), Status::kInternal, "parameter server reform: {} votes from {} survivors",
                 votes, survivors.size());
    if (reform_hook_) reform_hook_("voted");
  } catch (...) {
    if (in_vote) {
      // The vote may have completed on other survivors: the new view is complete here; kept aside until the
      // outcome is settled (adopt_tentative / drop_tentative).
      tentative_ = std::make_unique<View>(take_view());
      tentative_out_ = out;
    }
    put_back();
    throw;
  }
  // ---- commit: the new view replaces the old one (which goes with this scope) ----
  // A step still to be redone keeps the parameters it starts from: a loss before it is redone (right after this
  // commit) re-forms again, and the servers' shards then mix clocks again.
  if (out.step_done) step_start_.clear();
  ++view_epoch_;
  restore_due_ = from_checkpoint;
  out.retired = std::move(retired);
  if (reform_hook_) reform_hook_("committed");
  return out;
}

void ParameterServerSync::copy_owned(const View& old,
                                     const std::function<void(ServerPiece&, const ServerPiece&)>& more) {
  for (const Shard& sh : old.owned) {
    TANDEM_CHECK(program_.shards[static_cast<size_t>(sh.index)].server == server_, Status::kInternal,
                 "parameter server: server {} would lose its own shard {} in the new view", server_, sh.index);
    own_shard(sh.index, sh.host.data());
  }
  for (ServerPiece& p : pieces_) {
    const auto o = std::find_if(old.pieces.begin(), old.pieces.end(),
                                [&](const ServerPiece& q) { return q.global == p.global; });
    if (o == old.pieces.end()) continue;  // a shard taken over (reform): not held before
    p.optimizer->restore(o->optimizer->steps(), o->optimizer->state_tensors());
    p.applied = o->applied;
    p.lr_steps = o->lr_steps;
    p.lr_updates = o->lr_updates;
    more(p, *o);
  }
}

ParameterServerSync::View ParameterServerSync::take_view() {
  View v{program_, world_, rank_, server_, clock_, exchanges_, step_started_, in_region_, reseed_,
         std::move(owned_), std::move(pieces_), std::move(kept_)};
  owned_.clear();
  pieces_.clear();
  kept_.clear();
  return v;
}

void ParameterServerSync::put_view(View&& v) {
  program_ = std::move(v.program);
  world_ = v.world;
  rank_ = v.rank;
  server_ = v.server;
  clock_ = v.clock;
  exchanges_ = v.exchanges;
  step_started_ = v.step_started;
  in_region_ = v.in_region;
  reseed_ = v.reseed;
  owned_ = std::move(v.owned);
  pieces_ = std::move(v.pieces);
  kept_ = std::move(v.kept);
  withheld_.clear();
  control_out_.assign(static_cast<size_t>(program_.servers), Header{});
  control_sends_.clear();
  control_sends_.resize(static_cast<size_t>(program_.servers));
}

ParameterServerSync::Reformed ParameterServerSync::adopt_tentative() {
  TANDEM_CHECK(tentative_ != nullptr, Status::kInternal, "parameter server: no re-formed view kept to adopt");
  // The old view's operations were retired when the attempt was abandoned; the kept view's (its peers, links and
  // posted receives on the failed communicator) too: the next reform() builds them anew from this view.
  abandoned_.push_back(std::make_shared<View>(take_view()));
  put_view(std::move(*tentative_));
  tentative_.reset();
  if (tentative_out_.step_done) step_start_.clear();  // (reform()'s commit)
  ++view_epoch_;
  restore_due_ = tentative_out_.from_checkpoint;
  Reformed out = std::move(tentative_out_);
  tentative_out_ = Reformed{};
  return out;
}

void ParameterServerSync::drop_tentative() {
  if (tentative_ != nullptr) abandoned_.push_back(std::shared_ptr<View>(std::move(tentative_)));
  tentative_out_ = Reformed{};
}

}  // namespace tandem::engine::parallel

namespace tandem::engine::parallel {

// ------------------------------------------------------------------------------------ growth (issue #17)

void ParameterServerSync::grow(comm::Communicator& grown, const std::vector<int>& from_worker,
                               const SyncProgram& program, int64_t clock, double lr_scale) {
  const int W = program.workers, S = program.servers;
  TANDEM_CHECK(!in_region_ && !step_started_, Status::kInternal,
               "parameter server grow: world rank {} is inside the push/pull region (call sync_point first)", rank_);
  TANDEM_CHECK(tentative_ == nullptr, Status::kInternal,
               "parameter server grow: the outcome of the last vote is not settled (adopt_tentative or drop_tentative)");
  TANDEM_CHECK(!elastic_ && S == program_.servers && grown.size() == W + S &&
                   static_cast<int>(from_worker.size()) == W && W >= program_.workers &&
                   program.shards.size() == program_.shards.size() && program.pieces.size() == program_.pieces.size(),
               Status::kInternal,
               "parameter server grow: {} workers and {} servers over a world of {} ({} worker indices) from {} workers "
               "and {} servers",
               W, S, grown.size(), from_worker.size(), program_.workers, program_.servers);
  TANDEM_REQUIRE(std::isfinite(lr_scale) && lr_scale > 0, "parameter server: learning-rate scale {} must be > 0",
                 lr_scale);
  const bool was_server = server_ >= 0;
  TANDEM_CHECK(was_server == (grown.rank() >= W) && (!was_server || server_ == grown.rank() - W), Status::kInternal,
               "parameter server grow: world rank {} (server {}) would become {} {}; servers neither join nor move",
               grown.rank(), server_, grown.rank() >= W ? "server" : "worker",
               grown.rank() >= W ? grown.rank() - W : grown.rank());
  // Sends still in flight on the old communicator (the replicas' end markers) complete before it is left.
  for (Link& l : backups_)
    for (Message& m : l.sends)
      if (m.work) m.work->wait();
  // ---- the transaction (reform()'s): the old view set aside untouched; the grown one built beside it (copies) ----
  auto retired = std::make_shared<InFlight>();
  retire_in_flight(*retired);  // outside the region nothing is in flight: the old view's peers and links
  View old = take_view();
  const double lr_before = lr_scale_;
  const auto put_back = [&] {
    retire_in_flight(*retired);  // this attempt's operations on `grown`
    abandoned_.push_back(retired);
    put_view(std::move(old));
    lr_scale_ = lr_before;
  };
  bool in_vote = false;
  int64_t epoch = 0;
  try {
    lr_scale_ = lr_scale;
    clear_admission();
    world_ = &grown;
    rank_ = grown.rank();
    // Shard ownership is the running job's (it may differ from a fresh compile after a server loss); the compiler's
    // program brings the new width and the servers' sizes.
    program_ = program;
    program_.shards = old.program.shards;
    program_.pieces = old.program.pieces;
    clock_ = clock;
    step_started_ = false;
    in_region_ = false;
    withheld_.clear();
    armed_ = false;
    std::fill(issued_.begin(), issued_.end(), false);
    control_out_.assign(static_cast<size_t>(S), Header{});
    control_sends_.clear();
    control_sends_.resize(static_cast<size_t>(S));
    if (was_server) {
      owned_.reserve(old.owned.size());
      copy_owned(old, [&](ServerPiece& p, const ServerPiece& o) {
        TANDEM_CHECK(o.pending.empty() && (program_.staleness < 0 || o.applied == clock), Status::kInternal,
                     "parameter server {}: piece {} has pending clocks or applied {} at the job's clock {} when "
                     "workers join", server_, p.global, o.applied, clock);
        // ps-async: the schedule keeps its place as the number of workers changes (rebase_schedule's rule)
        p.lr_steps = o.schedule_step(o.optimizer->steps(), old.program.workers);
        p.lr_updates = o.optimizer->steps();
      });
      peers_.resize(static_cast<size_t>(W));
      for (WorkerState& ws : peers_) reset_peer(ws, clock);
      place_replicas();  // the backups' world ranks moved with the workers: re-seeded on entering the region
      // ...but the copies this server holds stay real meanwhile: the servers and their shards do not change, and the
      // sync point before the admission left every copy complete, so a server lost right after the grow is taken
      // over exactly (as one lost after a re-form's commit) rather than found "being re-seeded"
      kept_ = old.kept;
      if (reform_hook_) reform_hook_("growing");
      send_shards(std::vector<int64_t>(static_cast<size_t>(W), clock));
    } else {
      if (reform_hook_) reform_hook_("growing");
      receive_shards();  // a joiner's first pull: the servers' current parameters
    }
    // ---- the vote: every rank's view epoch. An allgather completes only with every rank's part in it, so it
    //      completes nowhere unless every rank (the joiners too) built its part of the grown view ----
    in_vote = true;
    std::vector<int64_t> epochs(static_cast<size_t>(grown.size()), 0);
    grown.allgather(&view_epoch_, epochs.data(), 1, DType::kI64)->wait();
    epoch = *std::max_element(epochs.begin(), epochs.end()) + 1;
    if (reform_hook_) reform_hook_("grow-voted");
  } catch (...) {
    if (in_vote) {
      tentative_ = std::make_unique<View>(take_view());
      tentative_out_ = Reformed{};
    }
    put_back();
    throw;
  }
  // ---- commit: the grown view replaces the old one (which goes with this scope) ----
  view_epoch_ = epoch;
  abandoned_.push_back(retired);
  if (reform_hook_) reform_hook_("grow-committed");
}

}  // namespace tandem::engine::parallel

namespace tandem::engine::parallel {

void ParameterServerSync::request_admission() {
  TANDEM_CHECK(server_ < 0 && rank_ == 0 && !elastic_ && program_.staleness >= 0, Status::kInternal,
               "request_admission: only worker 0 of ps or ssp asks (world rank {})", rank_);
  if (admit_at_ < 0) request_next_ = true;
}

void ParameterServerSync::set_lr_scale(double lr_scale) {
  TANDEM_REQUIRE(std::isfinite(lr_scale) && lr_scale > 0, "parameter server: learning-rate scale {} must be > 0",
                 lr_scale);
  lr_scale_ = lr_scale;
}

void ParameterServerSync::reset_peer(WorkerState& ws, int64_t clock) const {
  ws.push.resize(pieces_.size());
  ws.reply.resize(pieces_.size());
  ws.push_clock.assign(pieces_.size(), clock);
  mark_pulled(ws);  // the shards sent next (send_shards) say so again
  ws.started = ws.done = clock;
  ws.replied = 0;
  ws.paused = true;
}

void ParameterServerSync::rebase_schedule() {
  for (ServerPiece& p : pieces_) {
    p.lr_steps = p.schedule_step(p.optimizer->steps(), program_.workers);
    p.lr_updates = p.optimizer->steps();
  }
}

}  // namespace tandem::engine::parallel
