#include "engine/parallel/param_server.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

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
constexpr uint32_t kTagPush = kTagBase + 0x10000;  // + global piece index
constexpr uint32_t kTagPull = kTagBase + 0x20000;
constexpr size_t kMaxPieces = 0x10000;
constexpr size_t kHeaderFloats = 8;

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
  TANDEM_REQUIRE(program_.shards.size() == static_cast<size_t>(S), "parameter server: {} key ranges for {} servers",
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
    shard_range_ = program_.shards[static_cast<size_t>(server_)];
    const int64_t n = shard_range_.size();
    Message init;
    init.buf.resize(kHeaderFloats + static_cast<size_t>(n));
    world_->recv(init.buf.data(), init.buf.size(), DType::kF32, 0, kTagInit)->wait();
    expect(init, 0, kInit, server_, 0, n);
    shard_host_.assign(init.payload(), init.payload() + n);
    if (be.device().is_cpu()) {
      shard_ = Tensor::wrap(shard_host_.data(), Shape{n}, DType::kF32);
    } else {
      shard_ = be.empty(Shape{n});
      be.copy(Tensor::wrap(shard_host_.data(), Shape{n}, DType::kF32), shard_);
    }
    for (size_t k = 0; k < program_.pieces.size() && !elastic_; ++k) {
      const BucketPiece& p = program_.pieces[k];
      if (p.server != server_) continue;
      TANDEM_REQUIRE(p.begin >= shard_range_.begin && p.end <= shard_range_.end && p.begin < p.end,
                     "parameter server {}: piece {} [{}, {}) is outside its key range [{}, {})", server_, k, p.begin,
                     p.end, shard_range_.begin, shard_range_.end);
      ServerPiece sp;
      sp.global = static_cast<int32_t>(k);
      sp.offset = p.begin - shard_range_.begin;
      sp.size = p.end - p.begin;
      sp.optimizer = std::make_unique<optim::Optimizer>(
          be, optimizer_config_, std::vector<Tensor>{shard_.slice(sp.offset, Shape{sp.size})});
      pieces_.push_back(std::move(sp));
    }
    peers_.resize(static_cast<size_t>(W));
    for (WorkerState& ws : peers_) {
      ws.push.resize(pieces_.size());
      ws.reply.resize(pieces_.size());
      ws.push_clock.assign(pieces_.size(), 0);
    }
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
  for (int s = 0; s < program_.servers; ++s) {
    auto& w = control_sends_[static_cast<size_t>(s)];
    if (w) w->wait();  // the previous control message to this server (long delivered)
    control_out_[static_cast<size_t>(s)] = Header{kind, rank_, s, 0, clock, 0};
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
  }
  compute::Backend& be = model_.backend();
  const bool host = be.device().is_cpu();
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
}

void ParameterServerSync::receive_shards() {
  const int W = program_.workers;
  std::vector<Message> finals(static_cast<size_t>(program_.servers));
  for (int s = 0; s < program_.servers; ++s) {
    Message& m = finals[static_cast<size_t>(s)];
    m.buf.assign(kHeaderFloats + static_cast<size_t>(program_.shards[static_cast<size_t>(s)].size()), 0.0f);
    m.work = world_->recv(m.buf.data(), m.buf.size(), DType::kF32, W + s, kTagFinal);
  }
  for (int s = 0; s < program_.servers; ++s) {
    const KeyRange& r = program_.shards[static_cast<size_t>(s)];
    Message& m = finals[static_cast<size_t>(s)];
    m.work->wait();
    m.work.reset();
    expect(m, W + s, kFinal, s, clock_, r.size());
    copy_into_params(r.begin, r.size(), m.payload());
  }
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
    copy_into_params(p.begin, p.end - p.begin, pull_[k].payload());
  }
  for (auto& w : control_sends_) w->wait();
  const int64_t t1 = tracer_.now_ns();
  clock_ = t;
  step_started_ = false;
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
        ws.elastic.buf.assign(kHeaderFloats + static_cast<size_t>(shard_range_.size()), 0.0f);
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
  if (program_.staleness < 0) {
    apply_async(p, m.payload());
    reply(w, j, t);
    return;
  }
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
  p.optimizer->step({g}, optim::lr_at(schedule_, p.optimizer->steps()));
  if (!be.device().is_cpu()) {
    const Tensor h = be.to_host(shard_.slice(p.offset, Shape{p.size}));
    std::copy_n(h.data<float>(), p.size, shard_host_.begin() + p.offset);
  }
  p.applied = clock;
}

void ParameterServerSync::apply_async(ServerPiece& p, const float* grad) {
  compute::Backend& be = model_.backend();
  Tensor g = Tensor::wrap(const_cast<float*>(grad), Shape{p.size}, DType::kF32);
  if (!be.device().is_cpu()) {
    Tensor d = be.empty(Shape{p.size});
    be.copy(g, d);
    g = d;
  }
  p.optimizer->step({g}, optim::lr_at(schedule_, p.optimizer->steps() / program_.workers));
  if (!be.device().is_cpu()) {
    const Tensor h = be.to_host(shard_.slice(p.offset, Shape{p.size}));
    std::copy_n(h.data<float>(), p.size, shard_host_.begin() + p.offset);
  }
}

void ParameterServerSync::reply(int w, int j, int64_t clock) {
  WorkerState& ws = peers_[static_cast<size_t>(w)];
  const ServerPiece& p = pieces_[static_cast<size_t>(j)];
  Message& r = ws.reply[static_cast<size_t>(j)];
  if (r.work) r.work->wait();  // the last reply of this piece (the worker received it before pushing again)
  r.set(Header{kPull, rank_, p.global, 0, clock, p.size});
  std::copy_n(shard_host_.begin() + p.offset, p.size, r.payload());
  r.work = world_->send(r.buf.data(), r.buf.size(), DType::kF32, w, pull_tag(p.global));
  if (++ws.replied == static_cast<int64_t>(pieces_.size())) {
    // The worker may start its next step once it has every server's replies: its clock against the slowest's.
    max_gap_ = std::max(max_gap_, clock - slowest());
  }
}

bool ParameterServerSync::release_withheld() {
  bool progressed = false;
  for (size_t i = 0; i < withheld_.size();) {
    const Withheld x = withheld_[i];
    if (pieces_[static_cast<size_t>(x.piece)].applied >= x.clock - program_.staleness) {
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
  const int64_t n = shard_range_.size();
  expect(ws.elastic, w, kCentre, server_, ws.started, n);
  Message& d = ws.delta;
  if (d.work) d.work->wait();
  d.set(Header{kDelta, rank_, server_, 0, ws.started, n});
  const float* x = ws.elastic.payload();
  float* delta = d.payload();
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    delta[i] = alpha_ * (x[i] - shard_host_[k]);
    shard_host_[k] += delta[i];
  }
  if (!model_.backend().device().is_cpu()) {
    model_.backend().copy(Tensor::wrap(shard_host_.data(), Shape{n}, DType::kF32), shard_);
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
    progressed |= release_withheld();
    if (progressed) {
      last = Clock::now();
      pause = std::chrono::microseconds(20);
      continue;
    }
    // ps (staleness 0): every receive posted must complete before the step (or sync point) can, and no reply can be
    // released meanwhile, so block on one of them (woken when it lands) instead of polling.
    if (program_.staleness == 0 && !elastic_) {
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
  Message m;
  m.set(Header{kFinal, rank_, server_, 0, clock_, shard_range_.size()});
  std::copy(shard_host_.begin(), shard_host_.end(), m.payload());
  std::vector<std::unique_ptr<comm::Work>> sends;
  for (int w = 0; w < W; ++w) sends.push_back(world_->send(m.buf.data(), m.buf.size(), DType::kF32, w, kTagFinal));
  for (auto& s : sends) s->wait();
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
  TANDEM_CHECK(!in_region_, Status::kInternal, "gather_state inside the push/pull region (call sync_point first)");
  const size_t K = elastic_ ? 0 : state_tensors_per_buffer(optimizer_config_);
  if (K == 0) return {};
  const int W = program_.workers;
  compute::Backend& be = model_.backend();
  if (server_ >= 0) {
    const int64_t n = shard_range_.size();
    Message m;
    m.set(Header{kState, rank_, server_, 0, clock_, static_cast<int64_t>(K) * n});
    for (const ServerPiece& p : pieces_) {
      const std::vector<Tensor> st = p.optimizer->state_tensors();
      TANDEM_CHECK(st.size() == K, Status::kInternal, "optimizer of piece {} has {} state tensors, expected {}",
                   p.global, st.size(), K);
      for (size_t k = 0; k < K; ++k) {
        const Tensor h = be.to_host(st[k]);
        std::copy_n(h.data<float>(), p.size, m.payload() + static_cast<int64_t>(k) * n + p.offset);
      }
    }
    world_->send(m.buf.data(), m.buf.size(), DType::kF32, root, kTagState)->wait();
  }
  if (rank_ != root) return {};
  std::vector<std::vector<float>> out(K, std::vector<float>(static_cast<size_t>(model_.total_params()), 0.0f));
  for (int s = 0; s < program_.servers; ++s) {
    const KeyRange& r = program_.shards[static_cast<size_t>(s)];
    Message m;
    m.buf.assign(kHeaderFloats + K * static_cast<size_t>(r.size()), 0.0f);
    world_->recv(m.buf.data(), m.buf.size(), DType::kF32, W + s, kTagState)->wait();
    expect(m, W + s, kState, s, clock_, static_cast<int64_t>(K) * r.size());
    for (size_t k = 0; k < K; ++k)
      std::copy_n(m.payload() + static_cast<int64_t>(k) * r.size(), r.size(), out[k].begin() + r.begin);
  }
  return out;
}

void ParameterServerSync::restore(int64_t steps, const float* params,
                                  const std::vector<const std::vector<float>*>& state) {
  TANDEM_CHECK(!in_region_, Status::kInternal, "restore inside the push/pull region (call sync_point first)");
  TANDEM_REQUIRE(!elastic_, "asynchronous EASGD: resuming the centre variable is not supported yet");
  clock_ = steps;
  if (server_ < 0) return;
  compute::Backend& be = model_.backend();
  const int64_t n = shard_range_.size();
  std::copy(params + shard_range_.begin, params + shard_range_.end, shard_host_.begin());
  if (!be.device().is_cpu()) be.copy(Tensor::wrap(shard_host_.data(), Shape{n}, DType::kF32), shard_);
  const size_t K = state_tensors_per_buffer(optimizer_config_);
  TANDEM_REQUIRE(state.size() == K, "parameter server: the checkpoint has {} optimizer state tensors, this optimizer {}",
                 state.size(), K);
  // ps-async counts one optimizer update per push: W per worker step.
  const int64_t updates = program_.staleness < 0 ? steps * program_.workers : steps;
  for (ServerPiece& p : pieces_) {
    const int64_t begin = shard_range_.begin + p.offset;
    std::vector<Tensor> st;
    for (const std::vector<float>* v : state) {
      TANDEM_REQUIRE(v != nullptr && static_cast<int64_t>(v->size()) >= begin + p.size,
                     "parameter server: optimizer state of {} values is shorter than the model", v ? v->size() : 0);
      st.push_back(Tensor::wrap(const_cast<float*>(v->data()) + begin, Shape{p.size}, DType::kF32));
    }
    p.optimizer->restore(updates, st);
    p.applied = steps;
    p.pending.clear();
  }
  for (WorkerState& ws : peers_) {
    ws.started = ws.done = steps;
    std::fill(ws.push_clock.begin(), ws.push_clock.end(), steps);
  }
  withheld_.clear();
}

}  // namespace tandem::engine::parallel

namespace tandem::engine::parallel {

// ------------------------------------------------------------------------------------ absorbing a lost worker

ParameterServerSync::Reformed ParameterServerSync::reform(comm::Communicator& survivors, const std::vector<int>& kept,
                                                          int64_t steps) {
  const int S = program_.servers;
  const int W = survivors.size() - S;
  TANDEM_CHECK(W >= 1 && static_cast<int>(kept.size()) == W && survivors.rank() < survivors.size(), Status::kInternal,
               "parameter server reform: {} ranks left for {} servers, {} kept workers", survivors.size(), S,
               kept.size());
  // ---- clocks: [worker's completed clock, server's lowest applied clock] from every survivor ----
  const bool sync = !elastic_ && program_.staleness >= 0;
  int64_t mine[2] = {0, INT64_MAX};
  if (server_ < 0) {
    mine[0] = elastic_ ? exchanges_ : clock_;
  } else if (sync) {
    for (const ServerPiece& p : pieces_) mine[1] = std::min(mine[1], p.applied);
  }
  std::vector<int64_t> all(2 * static_cast<size_t>(survivors.size()));
  survivors.allgather(mine, all.data(), 2, DType::kI64)->wait();
  int64_t applied_everywhere = INT64_MIN;
  if (sync) {
    applied_everywhere = INT64_MAX;
    for (int s = 0; s < S; ++s) applied_everywhere = std::min(applied_everywhere, all[2 * static_cast<size_t>(W + s) + 1]);
  }
  std::vector<int64_t> clocks(static_cast<size_t>(W));
  for (int w = 0; w < W; ++w) clocks[static_cast<size_t>(w)] = std::max(all[2 * static_cast<size_t>(w)], applied_everywhere);

  // Everything in flight on the failed communicator: its buffers outlive it (the caller keeps `retired`).
  struct Retired {
    std::vector<Message> messages;
    std::vector<std::unique_ptr<comm::Work>> works;
    std::vector<WorkerState> peers;
    std::vector<Header> control_out;
  };
  auto retired = std::make_shared<Retired>();
  for (auto* v : {&push_, &pull_})
    for (Message& m : *v)
      if (m.work) retired->messages.push_back(std::move(m));
  for (auto& w : control_sends_) retired->works.push_back(std::move(w));
  retired->control_out = std::move(control_out_);
  control_out_.assign(static_cast<size_t>(S), Header{});
  control_sends_.clear();
  control_sends_.resize(static_cast<size_t>(S));
  for (Message& m : push_) m = Message{};
  for (Message& m : pull_) m = Message{};
  std::vector<WorkerState> old = std::move(peers_);
  peers_.clear();

  world_ = &survivors;
  rank_ = survivors.rank();
  program_.workers = W;
  withheld_.clear();
  step_started_ = false;
  armed_ = false;
  std::fill(issued_.begin(), issued_.end(), false);

  Reformed out;
  if (server_ < 0) {
    const int64_t c = clocks[static_cast<size_t>(rank_)];
    out.step_done = c > mine[0];
    if (elastic_) {
      exchanges_ = c;
      clock_ = steps;
    } else {
      clock_ = c;
    }
    in_region_ = true;
  } else {
    // ---- server: the survivors' states, their pending pushes re-indexed ----
    peers_.resize(static_cast<size_t>(W));
    for (int w = 0; w < W; ++w) {
      WorkerState& ws = peers_[static_cast<size_t>(w)];
      const int64_t c = clocks[static_cast<size_t>(w)];
      ws.push.resize(pieces_.size());
      ws.reply.resize(pieces_.size());
      ws.push_clock.assign(pieces_.size(), c);
      ws.started = ws.done = c;
      ws.replied = 0;
      ws.paused = true;
    }
    for (ServerPiece& p : pieces_) {
      std::map<int64_t, std::vector<std::vector<float>>> pending;
      for (auto& [t, slot] : p.pending) {
        std::vector<std::vector<float>> now(static_cast<size_t>(W));
        bool any = false;
        for (int w = 0; w < W; ++w) {
          const auto from = static_cast<size_t>(kept[static_cast<size_t>(w)]);
          // only the pushes of a completed step: a step in flight is pushed again
          if (from < slot.size() && clocks[static_cast<size_t>(w)] >= t && !slot[from].empty()) {
            now[static_cast<size_t>(w)] = std::move(slot[from]);
            any = true;
          }
        }
        if (any) pending.emplace(t, std::move(now));
      }
      p.pending = std::move(pending);
      if (sync) apply_complete(p);
    }
    for (WorkerState& ws : old) retired->peers.push_back(std::move(ws));
    in_region_ = false;
    enter_region();
  }

  // ---- parameters: the workers go on from the servers' newest values (push/pull) ----
  if (!elastic_) {
    if (server_ >= 0) {
      std::vector<Message> sends(static_cast<size_t>(W));
      for (int w = 0; w < W; ++w) {
        Message& m = sends[static_cast<size_t>(w)];
        m.set(Header{kFinal, rank_, server_, 0, clocks[static_cast<size_t>(w)], shard_range_.size()});
        std::copy(shard_host_.begin(), shard_host_.end(), m.payload());
        m.work = world_->send(m.buf.data(), m.buf.size(), DType::kF32, w, kTagFinal);
      }
      for (Message& m : sends) m.work->wait();
    } else {
      receive_shards();
    }
  }
  out.retired = std::move(retired);
  return out;
}

}  // namespace tandem::engine::parallel
