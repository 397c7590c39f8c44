#pragma once
// The Communicator behind Communicator::create and split: operations are queued in call order and
// run by one progress thread per communicator; collectives execute as compiled plans
// (executor.hpp), point-to-point operations are posted in order and complete in the background.
//
// Failure handling: a mismatched header, a transport error, a deadline or an abort makes the
// communicator failed (sticky). It then tells every peer on the control tag (so they fail fast with
// the origin named), fails the running operation, every point-to-point operation in flight and
// everything queued. Deadlines are inactivity deadlines: an operation fails when nothing of it has
// completed for `timeout`; ranks that hit the deadline tell each other whom they wait for, wait a
// short grace period, and then name the rank(s) nobody heard from.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/comm/executor.hpp"
#include "engine/comm/wire.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::comm {

// The transport one rank's communicators share (the world's and every split of it).
class SharedTransport {
 public:
  explicit SharedTransport(std::unique_ptr<transports::Transport> t) : transport_(std::move(t)) {}
  ~SharedTransport() { transport_.reset(); }  // before the buried buffers it may still read
  SharedTransport(const SharedTransport&) = delete;
  SharedTransport& operator=(const SharedTransport&) = delete;

  transports::Transport& transport() { return *transport_; }
  // Keeps `p` alive until the transport is gone (buffers of sends that never completed).
  void bury(std::shared_ptr<void> p);
  // Communicator ids: every id handed out on this rank is below next_id().
  uint32_t next_id();
  void reserve_ids(uint32_t next);

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<void>> graveyard_;
  uint32_t next_id_ = 1;  // 0 is the world communicator
  std::unique_ptr<transports::Transport> transport_;
};

// A 64-byte aligned, growable byte buffer (scratch and staging).
class AlignedBuffer {
 public:
  unsigned char* reserve(size_t bytes);
  unsigned char* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(unsigned char* p) const noexcept;
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t size_ = 0;
};

class CommunicatorImpl final : public Communicator, private ExecHooks {
 public:
  // `members[r]`: the transport rank of communicator rank r; `hosts[r]` its host name.
  CommunicatorImpl(std::shared_ptr<SharedTransport> transport, int rank, std::vector<int> members, uint32_t comm_id,
                   CommOptions options, std::vector<std::string> hosts);
  ~CommunicatorImpl() override;

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

  bool is_failed() const override { return failed_.load(std::memory_order_acquire); }
  std::string failure_message() const override;
  FailureStatus failure_status() const override;
  void abort(const std::string& reason) override;
  Algorithm allreduce_algorithm_for(size_t count, DType dtype) const override;

  uint32_t comm_id() const { return comm_id_; }
  const Topology& topology() const { return topology_; }

  struct OpState;
  // Runs the queue on the calling thread until `op` completes, if no other thread is driving
  // progress; false when one is (the caller then waits for it).
  bool drive_until_done(const OpState& op);

 private:
  // ExecHooks
  void poll() override;
  void idle(const PlanExecutor& executor) override;
  [[noreturn]] void bad_message(int peer, const WireHeader& got, size_t got_bytes, size_t expected_bytes) override;

  std::unique_ptr<Work> enqueue(std::shared_ptr<OpState> op);
  std::unique_ptr<Work> point_to_point(WireKind kind, const void* send, void* recv, size_t count, DType dtype, int peer,
                                       uint32_t tag);
  void check_usable() const;
  void progress_main();
  // One unit of progress: runs the next queued operation, or polls point-to-point and control
  // messages. Caller holds engine_mu_.
  void step();
  void run_collective(OpState& op);
  void post_p2p(const std::shared_ptr<OpState>& op);
  void poll_p2p();
  void poll_control();
  void post_control_recv(int peer);
  void send_control(const ControlMessage& msg);
  void fail(Status status, const std::string& message, bool tell_peers, OpState* current);
  // Records whom the failure about to be thrown is blamed on; fail() takes it (first call wins
  // until then, so a relayed abort's origin is not overwritten by what the relay causes).
  void blame(int origin, bool aborted, std::vector<int> ranks);
  void backoff(std::chrono::steady_clock::duration idle_for);
  const CompiledPlan& plan_for(const OpState& op, const PlanRequest& request);
  PlanRequest request_for(const OpState& op) const;
  std::string describe(const OpState& op) const;

  // Fixed at construction.
  std::shared_ptr<SharedTransport> shared_;
  transports::Transport& transport_;
  const int rank_;
  const int size_;
  const std::vector<int> members_;
  const uint32_t comm_id_;
  const CommOptions options_;
  const std::vector<std::string> hosts_;
  Topology topology_;
  std::string transport_name_;
  std::chrono::milliseconds grace_;

  // Queue, shared with callers.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<OpState>> queue_;
  bool stopping_ = false;
  bool wake_ = false;  // the progress thread has work to look at now
  uint64_t next_seq_ = 1;
  std::string abort_reason_;
  std::atomic<bool> abort_requested_{false};

  // Sticky failure.
  std::atomic<bool> failed_{false};
  mutable std::mutex fail_mu_;
  Status fail_status_ = Status::kOk;
  std::string fail_message_;
  int fail_origin_ = -1;
  bool fail_aborted_ = false;
  std::vector<int> fail_ranks_;
  std::condition_variable fail_cv_;

  // Last time anything completed (ns of steady_clock), for the callers' stall backstop.
  std::shared_ptr<std::atomic<int64_t>> activity_;

  // Held by whichever thread drives progress (the progress thread, or a caller waiting on its
  // operation); everything below is touched only under it.
  std::mutex engine_mu_;
  std::atomic<size_t> p2p_count_{0};
  std::atomic<bool> caller_driving_{false};
  PlanExecutor executor_;
  AlignedBuffer scratch_, staging_;
  struct PlanKey {
    uint8_t collective, algorithm;
    bool in_place;
    int32_t root;
    uint64_t count, elem_bytes, chunk_bytes;
    bool operator==(const PlanKey&) const = default;
  };
  struct PlanKeyHash {
    size_t operator()(const PlanKey& k) const noexcept;
  };
  std::unordered_map<PlanKey, std::shared_ptr<const CompiledPlan>, PlanKeyHash> plans_;
  OpState* current_ = nullptr;
  std::shared_ptr<WireHeader> send_header_ = std::make_shared<WireHeader>();
  std::vector<std::shared_ptr<OpState>> p2p_;
  std::vector<std::unique_ptr<transports::Request>> control_recvs_;
  std::vector<std::shared_ptr<ControlMessage>> control_bufs_;
  std::vector<std::unique_ptr<transports::Request>> control_sends_;
  std::map<uint64_t, std::map<int, std::vector<int>>> notices_;  // seq -> origin -> ranks it waited for
  std::chrono::steady_clock::time_point last_control_poll_{};
  bool grace_started_ = false;
  std::chrono::steady_clock::time_point grace_until_{};
  std::vector<int> waited_;
  struct Blame {
    bool set = false;
    int origin = -1;
    bool aborted = false;
    std::vector<int> ranks;
  } blame_;  // for the failure being thrown (see blame())

  std::thread thread_;  // last: started once everything above exists
};

// Environment overrides for options left at their defaults: TANDEM_TRANSPORT, TANDEM_TIMEOUT_MS,
// TANDEM_ALLREDUCE_ALGO, TANDEM_DETERMINISTIC, TANDEM_CHUNK_BYTES. kInvalidArgument names a bad variable.
CommOptions apply_comm_env(const CommOptions& options);

}  // namespace tandem::engine::comm
