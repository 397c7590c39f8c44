#pragma once
// The Communicator behind Communicator::create (world_bootstrap.cpp) and split: checks the
// arguments of every call and hands the operation to its ProgressEngine (queue, progress thread,
// plans); its PeerTable holds the control channel to the peers and the sticky failure. split()
// exchanges (color, key) and builds the child per group_split.hpp.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/comm/peer_table.hpp"
#include "engine/comm/progress_engine.hpp"
#include "engine/comm/shared_transport.hpp"

namespace tandem::engine::comm {

class CommunicatorImpl final : public Communicator {
 public:
  // What a communicator remembers of the job beyond its transport, for shrink: the store and this
  // world's key namespace on it, its membership epoch and (after a shrink) its ranks' parent ranks.
  struct Lineage {
    std::shared_ptr<transports::KvStore> store;
    std::string key_prefix;
    int epoch = 0;
    std::vector<int> parent_ranks;
    std::string listen_addr;  // where its transport listens ("" = the default): a grown world listens there too
    std::vector<std::pair<int, std::string>> departures = {};  // after a shrink: the parent's ranks that left
  };
  // `members[r]`: the transport rank of communicator rank r; `hosts[r]` its host name.
  CommunicatorImpl(std::shared_ptr<SharedTransport> transport, int rank, std::vector<int> members, uint32_t comm_id,
                   CommOptions options, std::vector<std::string> hosts, Lineage lineage);
  ~CommunicatorImpl() override;  // unlinks it from its abort family; the engine stops first, then the peer table

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transport_name() const override { return transport_name_.c_str(); }
  const CommOptions& options() const override { return options_; }
  std::unique_ptr<Communicator> split(int color, int key) override;

  std::unique_ptr<Work> allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<Work> allgather(const void* send, void* recv, size_t count, DType dtype) override;
  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root) override;
  std::unique_ptr<Work> reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) override;
  std::unique_ptr<Work> barrier() override;
  std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;
  std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;

  bool is_failed() const override { return peers_.is_failed(); }
  std::string failure_message() const override { return peers_.failure_message(); }
  FailureStatus failure_status() const override { return peers_.failure_status(); }
  void abort(const std::string& reason) override;
  std::string stopped_by() const override;
  std::unique_ptr<Communicator> shrink() override;
  int64_t pending_joins() override;
  int64_t peek_joins() override;
  std::unique_ptr<Communicator> grow(const GrowOptions& options) override;
  std::unique_ptr<Communicator> rejoin(std::chrono::milliseconds wait) override;
  void refuse_joiners(const std::string& why) override;
  int epoch() const override { return lineage_.epoch; }
  std::vector<int> parent_ranks() const override { return lineage_.parent_ranks; }
  void leave(const std::string& note) noexcept override;
  void set_note(const std::string& note) noexcept override;
  std::vector<std::pair<int, std::string>> departures() const override { return lineage_.departures; }
  Algorithm allreduce_algorithm_for(size_t count, DType dtype) const override;

  uint32_t comm_id() const { return comm_id_; }
  // An abort reaches every communicator made from this one (split, shrink, grow), now and later: a trainer that shrank
  // or grew works on a descendant of the communicator its program holds, and the program's abort (a rank stopped by
  // a signal) must stop it. Downward only: a child's abort (a trainer failing a stage group fast) leaves its parent.
  // `child` is linked under this one; a child made after an abort starts aborted.
  void adopt(Communicator& child);
  const Topology& topology() const { return topology_; }

 private:
  std::string shrink_keys() const;  // the store keys of this communicator's shrink agreement
  std::chrono::milliseconds note_bound() const;  // how long leave and set_note may wait for the store
  std::unique_ptr<Work> point_to_point(WireKind kind, const void* send, void* recv, size_t count, DType dtype, int peer,
                                       uint32_t tag);

  // This communicator in its abort family (adopt): the reason of an abort that reached it, and its children.
  struct AbortNode {
    std::mutex mu;
    CommunicatorImpl* self = nullptr;  // null once the communicator is destroyed
    std::string reason;                // set once aborted (sticky: children made later start aborted)
    std::vector<std::weak_ptr<AbortNode>> children;
  };
  static void abort_family(const std::shared_ptr<AbortNode>& node, const std::string& reason);
  void abort_here(const std::string& reason);
  const std::shared_ptr<AbortNode> abort_node_ = std::make_shared<AbortNode>();

  // Fixed at construction; members are destroyed in reverse order: engine_ (joins its thread),
  // then peers_, then the transport.
  std::shared_ptr<SharedTransport> shared_;
  const int rank_;
  const int size_;
  const std::vector<int> members_;
  const uint32_t comm_id_;
  const CommOptions options_;
  const std::vector<std::string> hosts_;
  const Topology topology_;
  const std::string transport_name_;
  const Lineage lineage_;
  std::atomic<bool> posted_{false};  // this rank posted in the shrink agreement (shrink or leave): at most once
  PeerTable peers_;
  ProgressEngine engine_;  // last: its thread starts once everything above exists
};

}  // namespace tandem::engine::comm
