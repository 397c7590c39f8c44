#pragma once
// Plan execution for one communicator: operations are queued in call order and run by one progress
// thread (or by a caller waiting on its own operation while that thread is idle); collectives run as
// compiled plans (executor.hpp, cached in a PlanCache), point-to-point operations are posted in
// order and complete in the background. Errors fail the communicator through its PeerTable, then
// the running operation, every point-to-point operation in flight and everything queued.
//
// Deadlines are inactivity deadlines: an operation fails when nothing of it has completed for
// `options.timeout`; the ranks that hit the deadline tell each other whom they wait for, wait a
// short grace period, and then name the rank(s) nobody heard from.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/aligned_buffer.hpp"
#include "engine/comm/communicator.hpp"
#include "engine/comm/executor.hpp"
#include "engine/comm/op_state.hpp"
#include "engine/comm/peer_table.hpp"
#include "engine/comm/plan_cache.hpp"
#include "engine/comm/shared_transport.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::comm {

class ProgressEngine final : private ExecHooks {
 public:
  // Starts the progress thread. `shared` and `peers` must outlive the engine.
  ProgressEngine(SharedTransport& shared, PeerTable& peers, std::vector<int> members, uint32_t comm_id,
                 CommOptions options, Topology topology);
  // Runs what is queued (it fails at once when the communicator has failed), then stops the thread.
  ~ProgressEngine() override;
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Queues `op` (collectives and splits get the next sequence number); throws the sticky failure.
  std::unique_ptr<Work> enqueue(std::shared_ptr<OpState> op);
  // Asks the progress thread to fail everything with `reason` and tell the peers (returns at once).
  void request_abort(const std::string& reason);
  // Runs the queue on the calling thread until `op` completes, if no other thread is driving
  // progress; false when one is (the caller then waits for it).
  bool drive_until_done(const OpState& op);

 private:
  // ExecHooks
  void poll() override;
  void idle(const PlanExecutor& executor) override;
  [[noreturn]] void bad_message(int peer, const WireHeader& got, size_t got_bytes, size_t expected_bytes) override;

  void progress_main();
  // One unit of progress: runs the next queued operation, or polls point-to-point and control
  // messages. Caller holds engine_mu_.
  void step();
  void run_collective(OpState& op);
  // Broadcast and reduce: every rank learns the smallest and largest root passed; kMismatch when they differ.
  void agree_on_root(const OpState& op);
  void post_p2p(const std::shared_ptr<OpState>& op);
  void poll_p2p();
  void fail(Status status, const std::string& message, bool tell_peers, OpState* current);
  // This failed communicator's messages that nobody will receive are dropped (see Transport).
  void drop_unexpected();
  void backoff(std::chrono::steady_clock::duration idle_for);
  [[noreturn]] void throw_abort(const std::string& reason);
  // The rank a failed operation with rank `peer` is blamed on: `peer`, or this rank when its transport gave the link
  // up for want of its own memory (Transport::at_fault).
  int at_fault(int peer) const;

  // Fixed at construction.
  SharedTransport& shared_;
  transports::Transport& transport_;
  PeerTable& peers_;
  const int rank_;
  const int size_;
  const std::vector<int> members_;
  const uint32_t comm_id_;
  const CommOptions options_;
  const std::chrono::milliseconds grace_;
  // The creating thread's settings (settings::current()): the progress thread runs under them too, so that a
  // context's settings (and a test's hooks) apply whichever thread drives the transport.
  const std::shared_ptr<const settings::Settings> settings_;

  // Queue, shared with callers.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<OpState>> queue_;
  bool stopping_ = false;
  bool wake_ = false;  // the progress thread has work to look at now
  uint64_t next_seq_ = 1;
  std::string abort_reason_;
  std::atomic<bool> abort_requested_{false};

  // Last time anything completed (ns of steady_clock), for the callers' stall backstop.
  std::shared_ptr<std::atomic<int64_t>> activity_;

  // Held by whichever thread drives progress (the progress thread, or a caller waiting on its
  // operation); everything below is touched only under it.
  std::mutex engine_mu_;
  std::atomic<size_t> p2p_count_{0};
  std::atomic<size_t> p2p_awaited_{0};  // of them, operations a caller still waits for (not buffered sends)
  std::atomic<bool> caller_driving_{false};
  PlanExecutor executor_;
  PlanCache plans_;
  AlignedBuffer scratch_, staging_;
  int64_t root_vote_[4] = {};  // agree_on_root's input (2) and output (2)
  OpState* current_ = nullptr;
  std::shared_ptr<WireHeader> send_header_ = std::make_shared<WireHeader>();
  std::vector<std::shared_ptr<OpState>> p2p_;
  bool grace_started_ = false;
  std::chrono::steady_clock::time_point grace_until_{};
  std::vector<int> waited_;

  std::thread thread_;  // last: started once everything above exists
};

}  // namespace tandem::engine::comm
