// Communicator::pending_joins and Communicator::grow (admission.hpp states the rule).
#include <algorithm>

#include <fmt/format.h>

#include "engine/comm/admission.hpp"
#include "engine/comm/communicator_impl.hpp"
#include "engine/comm/world_bootstrap.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

int64_t CommunicatorImpl::pending_joins() {
  int64_t waiting = peek_joins();
  if (size_ > 1) broadcast(&waiting, 1, DType::kI64, 0)->wait();
  return waiting;
}

int64_t CommunicatorImpl::peek_joins() {
  peers_.check_usable();
  TANDEM_CHECK(lineage_.store != nullptr, Status::kUnsupported,
               "grow: communicator {} was built without a store, so no rank can join it", comm_id_);
  return rank_ == 0 ? joiners_waiting(*lineage_.store) : 0;
}

std::unique_ptr<Communicator> CommunicatorImpl::grow(const GrowOptions& o) {
  peers_.check_usable();
  TANDEM_CHECK(lineage_.store != nullptr, Status::kUnsupported,
               "grow: communicator {} was built without a store, so no rank can join it", comm_id_);
  TANDEM_REQUIRE(o.max_ranks >= 0, "grow: max_ranks must be >= 0 (0: no bound; got {})", o.max_ranks);
  TANDEM_REQUIRE(o.limit >= 0, "grow: limit must be >= 0 (0: every joiner waiting; got {})", o.limit);
  const std::chrono::milliseconds window = o.window.count() > 0 ? o.window : options_.timeout;
  // 1. One decision, rank 0's, told to every old rank over this (healthy) communicator.
  int64_t decision[2] = {0, 0};  // admitted joiners, grow id
  if (rank_ == 0) {
    const Admission a = admit_joiners(*lineage_.store, size_, lineage_.epoch + 1, o.max_ranks, window, o.limit);
    decision[0] = static_cast<int64_t>(a.tickets.size());
    decision[1] = a.grow_id;
  }
  if (size_ > 1) broadcast(decision, 2, DType::kI64, 0)->wait();
  if (decision[0] == 0) return nullptr;
  const int grown_size = size_ + static_cast<int>(decision[0]);
  // 2. Old ranks and joiners build the grown world under its own namespace of the job's store, with this
  // communicator's options: a joiner that died while being admitted costs at most options().timeout.
  BootstrapInfo info;
  info.rank = rank_;
  info.size = grown_size;
  info.listen_addr = lineage_.listen_addr;
  std::vector<int> parents(static_cast<size_t>(grown_size), -1);
  for (int r = 0; r < size_; ++r) parents[static_cast<size_t>(r)] = r;
  std::unique_ptr<Communicator> grown;
  std::string error;
  try {
    grown = create_world(info, lineage_.store, options_, grow_prefix(decision[1]), lineage_.epoch + 1, parents,
                         hosts_[static_cast<size_t>(rank_)]);
  } catch (const Error& e) {
    error = e.what();
  }
  // 3. All or nothing: the old ranks vote on this communicator.
  int64_t ok = grown ? 1 : 0;
  if (size_ > 1) allreduce(&ok, &ok, 1, DType::kI64, ReduceOp::kMin)->wait();
  if (rank_ == 0) publish_outcome(*lineage_.store, decision[1], ok == 1);
  if (grown) adopt(*grown);  // this communicator's abort reaches the grown world (a vote that failed drops it)
  if (ok == 0) {
    log::warn("grow: rank {}: admitting {} joiner(s) was abandoned ({}); going on with the {} ranks there were", rank_,
              decision[0], error.empty() ? "another rank could not reach them" : error, size_);
    return nullptr;
  }
  log::info("comm {} rank {}: grown to {} ranks (epoch {}, {} joiner(s) admitted)", comm_id_, rank_, grown_size,
            lineage_.epoch + 1, decision[0]);
  return grown;
}

std::unique_ptr<Communicator> CommunicatorImpl::rejoin(std::chrono::milliseconds wait) {
  TANDEM_CHECK(lineage_.store != nullptr, Status::kUnsupported,
               "rejoin: communicator {} was built without a store, so this rank cannot wait as a spare", comm_id_);
  TANDEM_REQUIRE(wait.count() > 0, "rejoin: the wait for admission must be positive (got {} ms)", wait.count());
  const std::string& host = hosts_[static_cast<size_t>(rank_)];
  log::info("comm {} rank {}: waits as a spare for the job's next grow (up to {} ms)", comm_id_, rank_, wait.count());
  const JoinAnswer a = request_admission(*lineage_.store, host, wait);
  BootstrapInfo info;
  info.rank = a.rank;
  info.size = a.size;
  info.listen_addr = lineage_.listen_addr;
  std::vector<int> parents(static_cast<size_t>(a.size), -1);
  for (int r = 0; r < a.old_size; ++r) parents[static_cast<size_t>(r)] = r;
  std::unique_ptr<Communicator> grown =
      create_world(info, lineage_.store, options_, grow_prefix(a.grow_id), a.epoch, std::move(parents), host);
  adopt(*grown);  // the spare's communicator's abort reaches the world it was drafted into
  await_outcome(*lineage_.store, a.grow_id, 2 * options_.timeout);
  log::info("comm {} rank {}: the spare was admitted as rank {} of {} (epoch {})", comm_id_, rank_, a.rank, a.size,
            a.epoch);
  return grown;
}

void CommunicatorImpl::refuse_joiners(const std::string& why) {
  if (lineage_.store == nullptr) return;
  const int64_t n = refuse_waiting(*lineage_.store, why);
  if (n > 0) log::info("comm {} rank {}: {} waiting joiner(s) or spare(s) refused: {}", comm_id_, rank_, n, why);
}

}  // namespace tandem::engine::comm
