#include "engine/parallel/fedavg.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::parallel {

namespace {

// Point-to-point tags on the workers' communicator (the trainer's own are below 100, gossip's 201).
constexpr uint32_t kTagUpdateHeader = 211;  // worker -> 0: [round, samples, loss_sum, correct, scored, clients]
constexpr uint32_t kTagUpdateBody = 212;    // worker -> 0: sum of n_k x_k
constexpr uint32_t kTagReplyHeader = 213;   // 0 -> worker: [round, counted, total (5), dropped count, dropped...]
constexpr uint32_t kTagReplyBody = 214;     // 0 -> worker: the new global state
constexpr size_t kUpdateHeader = 6;

size_t reply_header_size(int workers) { return 8 + static_cast<size_t>(std::max(workers - 1, 0)); }

using Clock = std::chrono::steady_clock;

}  // namespace

std::vector<int32_t> sample_clients(int32_t clients, double fraction, uint64_t seed, int64_t round) {
  TANDEM_REQUIRE(clients >= 1 && fraction > 0 && fraction <= 1, "cannot sample a fraction {} of {} clients", fraction,
                 clients);
  // ceil, but a fraction that is an exact multiple in decimal (0.3 of 10) must not round up to one more
  const auto m = static_cast<int32_t>(std::clamp(std::ceil(fraction * clients - 1e-9), 1.0, static_cast<double>(clients)));
  std::vector<int32_t> all(static_cast<size_t>(clients));
  std::iota(all.begin(), all.end(), 0);
  Rng rng(mix64(mix64(seed, 0x66656461766721), static_cast<uint64_t>(round)));
  for (int32_t i = 0; i < m; ++i) {  // partial Fisher-Yates: the first m are a uniform sample
    const auto j = static_cast<size_t>(i) + rng.below(static_cast<uint64_t>(clients - i));
    std::swap(all[static_cast<size_t>(i)], all[j]);
  }
  all.resize(static_cast<size_t>(m));
  std::sort(all.begin(), all.end());
  return all;
}

std::vector<int32_t> clients_of_worker(const std::vector<int32_t>& sampled, int worker, int workers) {
  std::vector<int32_t> out;
  for (size_t j = static_cast<size_t>(worker); j < sampled.size(); j += static_cast<size_t>(workers))
    out.push_back(sampled[j]);
  return out;
}

bool RoundExchange::Incoming::done() const { return header_work->test() && body_work->test(); }

RoundExchange::RoundExchange(comm::Communicator* workers, double deadline_s)
    : workers_(workers != nullptr && workers->size() > 1 ? workers : nullptr), deadline_s_(deadline_s) {
  if (deadline_s_ <= 0) {
    const double timeout_s = workers_ != nullptr ? std::chrono::duration<double>(workers_->options().timeout).count() : 60;
    deadline_s_ = 0.9 * timeout_s;
  }
}

RoundExchange::~RoundExchange() {
  // Late updates and replies in flight: their buffers must outlive them. Each wait is bounded by the
  // communicator's deadline; a failure here is no longer anyone's to report.
  for (auto& in : late_) {
    try {
      in->header_work->wait();
      in->body_work->wait();
    } catch (...) {
    }
  }
  for (Outgoing& o : sent_) {
    try {
      o.header_work->wait();
      o.body_work->wait();
    } catch (...) {
    }
  }
}

std::shared_ptr<void> RoundExchange::rebind(comm::Communicator* workers) {
  struct InFlight {
    std::vector<std::unique_ptr<Incoming>> incoming;
    std::deque<std::unique_ptr<Incoming>> late;
    std::deque<Outgoing> sent;
  };
  auto old = std::make_shared<InFlight>(InFlight{std::move(incoming_), std::move(late_), std::move(sent_)});
  incoming_.clear();
  late_.clear();
  sent_.clear();
  workers_ = workers != nullptr && workers->size() > 1 ? workers : nullptr;
  round_ = -1;
  return old;
}

void RoundExchange::reap_late() {
  for (auto it = late_.begin(); it != late_.end();) {
    if (!(*it)->done()) {
      ++it;
      continue;
    }
    log::debug("fedavg: worker rank {}'s update for round {} arrived after its round closed; discarded",
               (*it)->worker, (*it)->round);
    it = late_.erase(it);
  }
}

void RoundExchange::reap_sent() {
  while (!sent_.empty() && sent_.front().header_work->test() && sent_.front().body_work->test()) sent_.pop_front();
}

void RoundExchange::begin(int64_t round, size_t size) {
  round_ = round;
  size_ = size;
  started_ = Clock::now();
  if (workers_ == nullptr || workers_->rank() != 0) return;
  reap_late();
  reap_sent();
  const int n = workers_->size();
  incoming_.clear();
  incoming_.resize(static_cast<size_t>(n));
  for (int w = 1; w < n; ++w) {
    auto in = std::make_unique<Incoming>();
    in->worker = w;
    in->round = round;
    in->header.assign(kUpdateHeader, 0.0);
    in->body.assign(size, 0.0f);
    in->header_work = workers_->recv(in->header.data(), in->header.size(), DType::kF64, w, kTagUpdateHeader);
    in->body_work = workers_->recv(in->body.data(), in->body.size(), DType::kF32, w, kTagUpdateBody);
    incoming_[static_cast<size_t>(w)] = std::move(in);
  }
}

RoundOutcome RoundExchange::finish(std::vector<float>& sum, const RoundReport& mine,
                                   const std::vector<float>& previous) {
  TANDEM_CHECK(sum.size() == size_ && previous.size() == size_, Status::kInternal,
               "fedavg round {}: states of {} and {} values, {} expected", round_, sum.size(), previous.size(), size_);
  RoundOutcome out;
  out.round = round_;
  const auto average = [&](const std::vector<double>& acc, double weight) {
    if (weight > 0) {
      for (size_t k = 0; k < size_; ++k) sum[k] = static_cast<float>(acc[k] / weight);
    } else {
      sum = previous;  // nobody trained a sample: the model stays
    }
  };
  if (workers_ == nullptr) {
    out.total = mine;
    average(std::vector<double>(sum.begin(), sum.end()), mine.samples);
    return out;
  }
  const int n = workers_->size();
  if (workers_->rank() != 0) {
    const std::vector<double> header = {static_cast<double>(round_), mine.samples, mine.loss_sum, mine.correct,
                                        mine.scored, static_cast<double>(mine.clients)};
    auto hs = workers_->send(header.data(), header.size(), DType::kF64, 0, kTagUpdateHeader);
    auto bs = workers_->send(sum.data(), sum.size(), DType::kF32, 0, kTagUpdateBody);
    hs->wait();
    bs->wait();
    std::vector<double> reply(reply_header_size(n));
    workers_->recv(reply.data(), reply.size(), DType::kF64, 0, kTagReplyHeader)->wait();
    workers_->recv(sum.data(), sum.size(), DType::kF32, 0, kTagReplyBody)->wait();
    TANDEM_CHECK(static_cast<int64_t>(reply[0]) == round_, Status::kInternal,
                 "fedavg: worker 0 replied for round {} to this worker in round {}", reply[0], round_);
    out.counted = reply[1] != 0;
    out.total = {reply[2], reply[3], reply[4], reply[5], static_cast<int32_t>(reply[6])};
    for (int k = 0; k < static_cast<int>(reply[7]); ++k) out.dropped.push_back(static_cast<int>(reply[8 + static_cast<size_t>(k)]));
    if (!out.counted)
      log::warn("fedavg round {}: this worker's update (rank {}, {} clients) missed the round's deadline of {:.3g} s "
                "and was dropped; it continues from the new global model",
                round_, workers_->rank(), mine.clients, deadline_s_);
    return out;
  }
  // Worker 0: whoever reports by the deadline.
  const auto deadline = started_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s_));
  std::vector<bool> arrived(static_cast<size_t>(n), false);
  for (;;) {
    bool all = true;
    for (int w = 1; w < n; ++w) {
      if (!arrived[static_cast<size_t>(w)]) arrived[static_cast<size_t>(w)] = incoming_[static_cast<size_t>(w)]->done();
      all = all && arrived[static_cast<size_t>(w)];
    }
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  std::vector<double> acc(sum.begin(), sum.end());
  out.total = mine;
  for (int w = 1; w < n; ++w) {
    auto& in = incoming_[static_cast<size_t>(w)];
    if (!arrived[static_cast<size_t>(w)]) {
      out.dropped.push_back(w);
      late_.push_back(std::move(in));
      continue;
    }
    TANDEM_CHECK(static_cast<int64_t>(in->header[0]) == round_, Status::kInternal,
                 "fedavg: worker rank {} sent its update for round {} in round {}", w, in->header[0], round_);
    for (size_t k = 0; k < size_; ++k) acc[k] += in->body[k];
    out.total.samples += in->header[1];
    out.total.loss_sum += in->header[2];
    out.total.correct += in->header[3];
    out.total.scored += in->header[4];
    out.total.clients += static_cast<int32_t>(in->header[5]);
  }
  incoming_.clear();
  average(acc, out.total.samples);
  if (!out.dropped.empty()) {
    log::warn("fedavg round {}: worker rank(s) {} did not report within the round's deadline of {:.3g} s and were "
              "dropped; the round closes with the {} clients of the other workers",
              round_, fmt::join(out.dropped, ", "), deadline_s_, out.total.clients);
  }
  auto body = std::make_shared<std::vector<float>>(sum);
  for (int w = 1; w < n; ++w) {
    auto header = std::make_shared<std::vector<double>>(reply_header_size(n), -1.0);
    std::vector<double>& h = *header;
    h[0] = static_cast<double>(round_);
    h[1] = std::find(out.dropped.begin(), out.dropped.end(), w) == out.dropped.end() ? 1 : 0;
    h[2] = out.total.samples;
    h[3] = out.total.loss_sum;
    h[4] = out.total.correct;
    h[5] = out.total.scored;
    h[6] = out.total.clients;
    h[7] = static_cast<double>(out.dropped.size());
    for (size_t k = 0; k < out.dropped.size(); ++k) h[8 + k] = out.dropped[k];
    Outgoing o;
    o.header = header;
    o.body = body;
    o.header_work = workers_->send(header->data(), header->size(), DType::kF64, w, kTagReplyHeader);
    o.body_work = workers_->send(body->data(), body->size(), DType::kF32, w, kTagReplyBody);
    sent_.push_back(std::move(o));
  }
  reap_sent();
  return out;
}

}  // namespace tandem::engine::parallel
