#include "engine/comm/communicator_impl.hpp"

#include <algorithm>
#include <limits>

#include "engine/comm/group_split.hpp"
#include "engine/comm/membership.hpp"
#include "engine/comm/op_state.hpp"
#include "engine/comm/world_bootstrap.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

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

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<SharedTransport> transport, int rank, std::vector<int> members,
                                   uint32_t comm_id, CommOptions options, std::vector<std::string> hosts,
                                   Lineage lineage)
    : shared_(std::move(transport)),
      rank_(rank),
      size_(static_cast<int>(members.size())),
      members_(std::move(members)),
      comm_id_(comm_id),
      options_(std::move(options)),
      hosts_(std::move(hosts)),
      topology_(topology_of(hosts_)),
      transport_name_(shared_->transport().name()),
      lineage_(std::move(lineage)),
      peers_(*shared_, rank_, members_, comm_id_),
      engine_(*shared_, peers_, members_, comm_id_, options_, topology_) {
  abort_node_->self = this;  // an abort of its parent reaches it from now on (adopt)
  const int host_count = topology_.host_of.empty()
                             ? 0
                             : *std::max_element(topology_.host_of.begin(), topology_.host_of.end()) + 1;
  log::debug("comm {}: rank {}/{} over {} ({} host(s)), allreduce {}{}", comm_id_, rank_, size_, transport_name_,
             host_count, algorithm_name(options_.allreduce_algorithm), options_.deterministic ? ", deterministic" : "");
}

// ---------------------------------------------------------------------------------- calls

std::unique_ptr<Work> CommunicatorImpl::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = checked_bytes("allreduce", count, 1, dtype);
  check_op("allreduce", op);
  check_ptr("allreduce", "send", send, bytes);
  check_ptr("allreduce", "recv", recv, bytes);
  return engine_.enqueue(new_op(WireKind::kAllreduce, send, recv, count, dtype, op));
}

std::unique_ptr<Work> CommunicatorImpl::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                                       ReduceOp op) {
  const size_t in_bytes = checked_bytes("reduce_scatter", count, static_cast<size_t>(size_), dtype);
  check_op("reduce_scatter", op);
  check_ptr("reduce_scatter", "send", send, in_bytes);
  check_ptr("reduce_scatter", "recv", recv, in_bytes / static_cast<size_t>(size_));
  return engine_.enqueue(new_op(WireKind::kReduceScatter, send, recv, count, dtype, op));
}

std::unique_ptr<Work> CommunicatorImpl::allgather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t out_bytes = checked_bytes("allgather", count, static_cast<size_t>(size_), dtype);
  check_ptr("allgather", "send", send, out_bytes / static_cast<size_t>(size_));
  check_ptr("allgather", "recv", recv, out_bytes);
  return engine_.enqueue(new_op(WireKind::kAllgather, send, recv, count, dtype));
}

std::unique_ptr<Work> CommunicatorImpl::broadcast(void* buf, size_t count, DType dtype, int root) {
  const size_t bytes = checked_bytes("broadcast", count, 1, dtype);
  TANDEM_REQUIRE(root >= 0 && root < size_, "broadcast: root {} is outside [0, {})", root, size_);
  check_ptr("broadcast", "buf", buf, bytes);
  return engine_.enqueue(new_op(WireKind::kBroadcast, buf, buf, count, dtype, ReduceOp::kSum, root));
}

std::unique_ptr<Work> CommunicatorImpl::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                               int root) {
  const size_t bytes = checked_bytes("reduce", count, 1, dtype);
  check_op("reduce", op);
  TANDEM_REQUIRE(root >= 0 && root < size_, "reduce: root {} is outside [0, {})", root, size_);
  check_ptr("reduce", "send", send, bytes);
  if (root == rank_) check_ptr("reduce", "recv (on the root)", recv, bytes);
  return engine_.enqueue(new_op(WireKind::kReduce, send, recv, count, dtype, op, root));
}

std::unique_ptr<Work> CommunicatorImpl::barrier() {
  return engine_.enqueue(new_op(WireKind::kBarrier, nullptr, nullptr, 0, DType::kU8));
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
  return engine_.enqueue(std::move(s));
}

std::unique_ptr<Work> CommunicatorImpl::send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  return point_to_point(WireKind::kSend, buf, nullptr, count, dtype, peer, tag);
}

std::unique_ptr<Work> CommunicatorImpl::recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  return point_to_point(WireKind::kRecv, nullptr, buf, count, dtype, peer, tag);
}

CommunicatorImpl::~CommunicatorImpl() {
  std::lock_guard lock(abort_node_->mu);  // an abort reaching it from its parent waits for this, or finds it gone
  abort_node_->self = nullptr;
}

void CommunicatorImpl::abort(const std::string& reason) {
  abort_family(abort_node_, reason.empty() ? std::string("aborted by the application") : reason);
}

std::string CommunicatorImpl::stopped_by() const {
  std::lock_guard lock(abort_node_->mu);
  return abort_node_->reason;
}

void CommunicatorImpl::abort_here(const std::string& reason) {
  engine_.request_abort(reason);
  // The progress thread fails everything and tells the peers; wait (bounded) until it has.
  peers_.wait_failed(std::chrono::seconds(2));
}

void CommunicatorImpl::abort_family(const std::shared_ptr<AbortNode>& node, const std::string& reason) {
  std::vector<std::shared_ptr<AbortNode>> children;
  {
    std::lock_guard lock(node->mu);
    if (node->reason.empty()) node->reason = reason;
    // A communicator that failed already (the original world after a peer died) is left as it is; its descendants
    // are not.
    if (node->self != nullptr && !node->self->is_failed()) node->self->abort_here(reason);
    for (const auto& w : node->children)
      if (auto c = w.lock()) children.push_back(std::move(c));
  }
  for (const auto& c : children) abort_family(c, reason);
}

void CommunicatorImpl::adopt(Communicator& child) {
  auto* impl = dynamic_cast<CommunicatorImpl*>(&child);
  if (impl == nullptr || impl == this) return;
  std::string reason;
  {
    std::lock_guard lock(abort_node_->mu);
    std::erase_if(abort_node_->children, [](const std::weak_ptr<AbortNode>& w) { return w.expired(); });
    abort_node_->children.push_back(impl->abort_node_);
    reason = abort_node_->reason;
  }
  if (!reason.empty()) abort_family(impl->abort_node_, reason);
}

Algorithm CommunicatorImpl::allreduce_algorithm_for(size_t count, DType dtype) const {
  TANDEM_REQUIRE(dtype_valid(static_cast<int32_t>(dtype)), "dtype value {} is not a valid dtype",
                 static_cast<int>(dtype));
  OpState op;
  op.kind = WireKind::kAllreduce;
  op.count = count;
  op.dtype = dtype;
  PlanRequest r = plan_request_for(op, rank_, size_, options_);
  r.topology = topology_;
  return choose_algorithm(r);
}

// ------------------------------------------------------------------------------------ split

std::unique_ptr<Communicator> CommunicatorImpl::split(int color, int key) {
  peers_.check_usable();
  // Everyone learns everyone's (color, key) and the lowest communicator id free on every rank.
  auto op = new_op(WireKind::kSplit, nullptr, nullptr, 3, DType::kI64);
  op->split_in = {color, key, static_cast<int64_t>(shared_->next_id())};
  op->split_out.assign(3 * static_cast<size_t>(size_), 0);
  op->send = op->split_in.data();
  op->recv = op->split_out.data();
  engine_.enqueue(op)->wait();
  const SplitLayout layout = split_layout(op->split_out, rank_);
  shared_->reserve_ids(layout.reserve_until);
  if (color < 0) return nullptr;
  std::vector<int> members;
  std::vector<std::string> hosts;
  for (int r : layout.members) {
    members.push_back(members_[static_cast<size_t>(r)]);
    hosts.push_back(hosts_[static_cast<size_t>(r)]);
  }
  log::debug("comm {} rank {}: split color {} key {} -> comm {} rank {}/{}", comm_id_, rank_, color, key,
             layout.child_id, layout.child_rank, members.size());
  Lineage lineage{lineage_.store, lineage_.key_prefix, 0, {}, lineage_.listen_addr};
  auto child = std::make_unique<CommunicatorImpl>(shared_, layout.child_rank, std::move(members), layout.child_id,
                                                  options_, std::move(hosts), std::move(lineage));
  adopt(*child);
  return child;
}

// ----------------------------------------------------------------------------------- shrink

std::unique_ptr<Communicator> CommunicatorImpl::shrink() {
  TANDEM_REQUIRE(peers_.is_failed(),
                 "shrink: communicator {} (rank {} of {}) has not failed: every rank is alive, there is nobody to "
                 "remove (shrink is the recovery after a peer failure)",
                 comm_id_, rank_, size_);
  TANDEM_CHECK(lineage_.store != nullptr, Status::kUnsupported, "shrink: communicator {} was built without a store",
               comm_id_);
  const FailureStatus failure = peers_.failure_status();
  posted_ = true;
  ShrinkRequest req;
  req.key_base = shrink_keys();
  req.rank = rank_;
  req.size = size_;
  req.epoch = lineage_.epoch;
  req.next_id = shared_->next_id();
  (failure.timed_out ? req.timed_out : req.blamed) = failure.ranks;
  if (failure.aborted && failure.origin >= 0) req.blamed.push_back(failure.origin);  // an abort leaves the group
  req.window = options_.timeout;
  req.dead_peers = [this] {  // the transport's ranks, in this communicator's
    std::vector<int> out;
    for (int t : shared_->transport().dead_peers())
      if (const auto it = std::find(members_.begin(), members_.end(), t); it != members_.end())
        out.push_back(static_cast<int>(it - members_.begin()));
    return out;
  };
  const Membership m = agree_membership(*lineage_.store, req);
  shared_->reserve_ids(m.comm_id + 1);
  std::vector<int> members;
  std::vector<std::string> hosts;
  for (int r : m.members) {
    members.push_back(members_[static_cast<size_t>(r)]);
    hosts.push_back(hosts_[static_cast<size_t>(r)]);
  }
  // What the failure cut between survivors that are both alive is mended before they talk again (ucx: a worker left
  // deaf by a same-host death moves to a fresh one; transport.hpp).
  shared_->transport().reconnect(*lineage_.store, req.key_base + "peers/", members, options_.timeout);
  log::info("comm {} rank {}: shrunk to comm {} rank {}/{} (epoch {}, kept ranks {})", comm_id_, rank_, m.comm_id,
            m.new_rank, m.members.size(), m.epoch, format_rank_list(m.members));
  Lineage lineage{lineage_.store, lineage_.key_prefix, m.epoch, m.members, lineage_.listen_addr, m.left};
  auto child = std::make_unique<CommunicatorImpl>(shared_, m.new_rank, std::move(members), m.comm_id, options_,
                                                  std::move(hosts), std::move(lineage));
  adopt(*child);
  return child;
}

std::string CommunicatorImpl::shrink_keys() const {
  // Unique per world (prefix) and communicator (ids are never reused on a transport).
  return fmt::format("{}shrink/c{}/", lineage_.key_prefix, comm_id_);
}

std::chrono::milliseconds CommunicatorImpl::note_bound() const {
  return std::min(options_.timeout, std::chrono::milliseconds(2000));
}

void CommunicatorImpl::set_note(const std::string& note) noexcept {
  if (lineage_.store == nullptr || posted_) return;
  const auto bound = note_bound();
  try {
    post_note(*lineage_.store, shrink_keys(), rank_, note, bound);
  } catch (const std::exception& e) {
    log::warn("comm {} rank {}: could not record its note '{}' in the store within {} ms (a shrink that counts this "
              "rank out will not have it): {}",
              comm_id_, rank_, note, bound.count(), e.what());
  }
}

void CommunicatorImpl::leave(const std::string& note) noexcept {
  if (lineage_.store == nullptr || !peers_.is_failed() || posted_.exchange(true)) return;
  const auto bound = note_bound();
  try {
    post_departure(*lineage_.store, shrink_keys(), rank_, note, bound);
    log::debug("comm {} rank {}: left the failed communicator ({})", comm_id_, rank_, note);
  } catch (const std::exception& e) {
    log::info("comm {} rank {}: could not post that it left the failed communicator within {} ms (the survivors wait "
              "out their window for it): {}",
              comm_id_, rank_, bound.count(), e.what());
  }
}

}  // namespace tandem::engine::comm
