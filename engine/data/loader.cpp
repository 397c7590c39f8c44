#include "engine/data/loader.hpp"

#include <chrono>

#include "engine/core/error.hpp"

namespace tandem::engine::data {

Loader::Loader(const Dataset& data, DistributedSampler& sampler, LoaderOptions options)
    : data_(data),
      sampler_(sampler),
      opts_(std::move(options)),
      converter_(opts_.augment, data.channels, data.height, data.width) {
  TANDEM_REQUIRE(opts_.batch_size > 0, "loader: batch size must be positive (got {})", opts_.batch_size);
  TANDEM_REQUIRE(opts_.prefetch >= 0 && opts_.prefetch <= 64, "loader: prefetch {} outside [0, 64]", opts_.prefetch);
  TANDEM_REQUIRE(opts_.timeout_ms > 0, "loader: timeout must be positive");
  TANDEM_REQUIRE(sampler.dataset_size() == data.size(), "loader: sampler covers {} samples but dataset '{}' has {}",
                 sampler.dataset_size(), data.name, data.size());
}

Loader::~Loader() { reset(); }

int64_t Loader::batches_per_epoch() const {
  const int64_t n = sampler_.shard_size();
  return opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
}

Batch Loader::assemble(const int64_t* idx, int64_t n, int64_t epoch) const {
  Batch b;
  b.size = n;
  b.channels = data_.channels;
  b.height = data_.height;
  b.width = data_.width;
  const int64_t ss = data_.sample_size();
  b.images.resize(static_cast<size_t>(n * ss));
  b.labels.resize(static_cast<size_t>(n));
  const uint64_t epoch_seed = mix64(opts_.seed, static_cast<uint64_t>(epoch));
  const bool random = opts_.train && opts_.augment.random();
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(mix64(epoch_seed, static_cast<uint64_t>(idx[i])));
    converter_.convert(data_.sample(idx[i]), b.images.data() + i * ss, random ? &rng : nullptr);
    b.labels[i] = data_.labels[static_cast<size_t>(idx[i])];
  }
  return b;
}

void Loader::start() {
  std::vector<int64_t> rest(sampler_.indices().begin() + sampler_.position(), sampler_.indices().end());
  int64_t full = static_cast<int64_t>(rest.size()) / opts_.batch_size;
  if (!opts_.drop_last && static_cast<int64_t>(rest.size()) % opts_.batch_size != 0) ++full;
  rest.resize(static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(rest.size()), full * opts_.batch_size)));
  {
    std::lock_guard lk(mu_);
    queue_.clear();
    error_ = nullptr;
    stop_ = false;
    producer_done_ = false;
    pending_ = full;
    running_ = true;
  }
  if (opts_.prefetch > 0) thread_ = std::thread([this, r = std::move(rest), e = sampler_.epoch()]() mutable {
    run(std::move(r), e);
  });
  else {
    // Synchronous mode: keep the indices and assemble one batch per next().
    std::lock_guard lk(mu_);
    producer_done_ = true;
  }
}

void Loader::run(std::vector<int64_t> indices, int64_t epoch) {
  try {
    const auto n = static_cast<int64_t>(indices.size());
    for (int64_t begin = 0; begin < n; begin += opts_.batch_size) {
      Batch b = assemble(indices.data() + begin, std::min(opts_.batch_size, n - begin), epoch);
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || static_cast<int>(queue_.size()) < opts_.prefetch; });
      if (stop_) return;
      queue_.push_back(std::move(b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lk(mu_);
    error_ = std::current_exception();
  }
  std::lock_guard lk(mu_);
  producer_done_ = true;
  cv_.notify_all();
}

bool Loader::next(Batch& out) {
  if (!running_) start();
  std::unique_lock lk(mu_);
  if (pending_ == 0) {
    lk.unlock();
    reset();
    return false;
  }
  if (opts_.prefetch == 0) {
    lk.unlock();
    const int64_t n = std::min(opts_.batch_size, sampler_.remaining());
    out = assemble(sampler_.indices().data() + sampler_.position(), n, sampler_.epoch());
    sampler_.advance(n);
    std::lock_guard relock(mu_);
    --pending_;
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  const bool ready = cv_.wait_until(lk, deadline, [&] { return !queue_.empty() || error_ || producer_done_; });
  if (error_) {
    auto e = error_;
    lk.unlock();
    reset();
    std::rethrow_exception(e);
  }
  TANDEM_CHECK(ready, Status::kTimeout, "loader: no batch from the loader thread within {} ms (dataset '{}')",
               opts_.timeout_ms, data_.name);
  TANDEM_CHECK(!queue_.empty(), Status::kInternal, "loader: thread finished with {} batches still expected", pending_);
  out = std::move(queue_.front());
  queue_.pop_front();
  --pending_;
  cv_.notify_all();
  lk.unlock();
  sampler_.advance(out.size);
  return true;
}

void Loader::reset() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  queue_.clear();
  running_ = false;
  pending_ = 0;
}

}  // namespace tandem::engine::data
