#include "engine/parallel/grad_reducer.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

GradientReducer::GradientReducer(comm::Communicator& comm, nn::Model& model, std::vector<GradientBucket> buckets,
                                 GradCompression compression, Tracer& tracer)
    : comm_(comm),
      model_(model),
      buckets_(std::move(buckets)),
      compression_(compression),
      tracer_(tracer),
      dp_(comm.size()),
      host_memory_(model.backend().device().is_cpu()) {
  const size_t L = model_.num_layers();
  trigger_bucket_.assign(L, -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradientBucket& g = buckets_[b];
    TANDEM_REQUIRE(g.first_layer >= 0 && g.first_layer < g.end_layer && static_cast<size_t>(g.end_layer) <= L,
                   "gradient bucket {} covers layers [{}, {}) of a {}-layer model", b, g.first_layer, g.end_layer, L);
    // Backward finishes a bucket at its earliest layer that has parameters (the hook fires only there).
    for (int32_t l = g.first_layer; l < g.end_layer; ++l) {
      if (model_.spec().layers[static_cast<size_t>(l)].params > 0) {
        trigger_bucket_[static_cast<size_t>(l)] = static_cast<int>(b);
        break;
      }
    }
  }
  issued_.assign(buckets_.size(), false);
  wire16_.resize(buckets_.size());
  host_stage_.resize(buckets_.size());
  model_.set_grad_ready_hook([this](size_t layer) { on_grad_ready(layer); });
  watcher_ = std::thread([this] { watch(); });
}

GradientReducer::~GradientReducer() {
  model_.set_grad_ready_hook({});
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watcher_.join();  // waits out all-reduces still in flight (their own deadlines bound it)
}

void GradientReducer::on_grad_ready(size_t layer) {
  if (!armed_ || layer >= trigger_bucket_.size()) return;
  const int b = trigger_bucket_[layer];
  if (b >= 0) issue(b);
}

void GradientReducer::issue(int b) {
  TANDEM_CHECK(b >= 0 && static_cast<size_t>(b) < buckets_.size(), Status::kInternal,
               "all-reduce of bucket {} but the stage has {} buckets", b, buckets_.size());
  if (issued_[static_cast<size_t>(b)]) return;
  issued_[static_cast<size_t>(b)] = true;
  const GradientBucket& g = buckets_[static_cast<size_t>(b)];
  Tensor grads = model_.range_grads(static_cast<size_t>(g.first_layer), static_cast<size_t>(g.end_layer));
  const size_t n = static_cast<size_t>(grads.numel());
  const int64_t t0 = tracer_.now_ns();
  Pending p;
  p.bucket = b;
  if (n > 0) {
    if (!host_memory_) host_stage_[static_cast<size_t>(b)] = model_.backend().to_host(grads);
    float* src = host_memory_ ? grads.data<float>() : host_stage_[static_cast<size_t>(b)].data<float>();
    if (compression_ == GradCompression::kNone) {
      p.work = comm_.allreduce(src, src, n, DType::kF32, ReduceOp::kSum);
    } else {
      // Pre-divide so that the sum stays in range of the narrow type.
      const float inv = 1.0f / static_cast<float>(dp_);
      auto& w = wire16_[static_cast<size_t>(b)];
      w.resize(n);
      compress_gradients(compression_, src, inv, w.data(), n);
      p.work = comm_.allreduce(w.data(), w.data(), n,
                               compression_ == GradCompression::kF16 ? DType::kF16 : DType::kBF16,
                               ReduceOp::kSum);
    }
  }
  p.issued_ns = tracer_.now_ns();
  if (compression_ != GradCompression::kNone && n > 0) tracer_.add("compress", "compute", t0, p.issued_ns);
  {
    std::lock_guard lock(mu_);
    ++outstanding_;
    queue_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void GradientReducer::watch() {
  for (;;) {
    Pending p;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      if (p.work) p.work->wait();
    } catch (...) {
      err = std::current_exception();
    }
    const int64_t done = tracer_.now_ns();
    {
      std::lock_guard lock(mu_);
      if (err && !error_) error_ = err;
      done_.push_back(Done{p.bucket, p.issued_ns, done});
      --outstanding_;
    }
    cv_.notify_all();
  }
}

int64_t GradientReducer::finish() {
  for (size_t b = 0; b < buckets_.size(); ++b) issue(static_cast<int>(b));
  armed_ = false;
  const int64_t t0 = tracer_.now_ns();
  std::vector<Done> done;
  std::exception_ptr err;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
    done.swap(done_);
    std::swap(err, error_);
  }
  const int64_t t1 = tracer_.now_ns();
  std::fill(issued_.begin(), issued_.end(), false);
  if (err) std::rethrow_exception(err);
  // All-reduces of one communicator run one at a time in issue order: each starts at
  // max(issued, previous completion).
  last_busy_ns_ = 0;
  int64_t prev_end = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const int64_t start = std::max(done[i].issued_ns, prev_end);
    const int64_t end = std::max(done[i].completed_ns, start);
    last_busy_ns_ += end - start;
    tracer_.add(fmt::format("allreduce bucket {}", done[i].bucket), "allreduce", start, end, 1);
    prev_end = end;
  }
  // Average (or, compressed, convert back: the 1/dp was applied before the sum).
  compute::Backend& be = model_.backend();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradientBucket& g = buckets_[b];
    Tensor grads = model_.range_grads(static_cast<size_t>(g.first_layer), static_cast<size_t>(g.end_layer));
    const size_t n = static_cast<size_t>(grads.numel());
    if (n == 0) continue;
    if (compression_ == GradCompression::kNone) {
      if (host_memory_) {
        be.scale(grads, 1.0f / static_cast<float>(dp_));
      } else {
        Tensor& h = host_stage_[b];
        be.copy(h, grads);
        be.scale(grads, 1.0f / static_cast<float>(dp_));
      }
      continue;
    }
    Tensor h = host_memory_ ? grads : host_stage_[b];
    float* dst = h.data<float>();
    const auto& w = wire16_[b];
    decompress_gradients(compression_, w.data(), dst, n);
    if (!host_memory_) be.copy(h, grads);
  }
  tracer_.add("wait allreduce", "comm", t0, t1);
  return t1 - t0;
}

void compress_gradients(GradCompression c, const float* src, float scale, uint16_t* dst, size_t n) {
  TANDEM_REQUIRE(c != GradCompression::kNone, "compress_gradients: no 16-bit format chosen");
  if (c == GradCompression::kF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i] * scale);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i] * scale);
  }
}

void decompress_gradients(GradCompression c, const uint16_t* src, float* dst, size_t n) {
  TANDEM_REQUIRE(c != GradCompression::kNone, "decompress_gradients: no 16-bit format chosen");
  if (c == GradCompression::kF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

}  // namespace tandem::engine::parallel
