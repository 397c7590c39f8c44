#pragma once
// A communicator's peers and its failure detection: the control channel to every peer (aborts and
// timeout notices on the control tag), whom a failure is blamed on, and the sticky failure itself.
//
// A failure is recorded once (the first wins) with the blame noted just before it was thrown
// (blame(); none noted: this rank itself), then told to every peer so they fail fast with the
// origin named; a peer relays the origin and the blamed ranks unchanged. Deadlines: a rank that
// hits one announces whom it waits for (announce_wait) and, after a grace period, blames the ranks
// some rank waited for that announced nothing themselves (timeout_verdict).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/comm/shared_transport.hpp"
#include "engine/comm/wire.hpp"

namespace tandem::engine::comm {

// "rank 3" / "ranks 1, 2".
std::string ranks_phrase(const std::vector<int>& ranks);
// "1,2,5" <-> {1, 2, 5} (a timeout notice's text; items that are not integers are skipped).
std::string format_rank_list(const std::vector<int>& ranks);
std::vector<int> parse_rank_list(const std::string& text);

struct TimeoutVerdict {
  std::vector<int> missing;  // waited for by some rank and not stuck itself (announced nothing): blamed
  std::vector<int> stuck;    // ranks other than `self` that announced a timeout too, ascending
};
// `self` waited for `waited`; `notices` holds the other ranks' announcements (origin -> ranks it waited for).
TimeoutVerdict timeout_verdict(int self, const std::vector<int>& waited, const std::map<int, std::vector<int>>& notices);

class PeerTable {
 public:
  // Posts a control receive from every peer. `members[r]`: the transport rank of communicator rank r.
  PeerTable(SharedTransport& shared, int rank, std::vector<int> members, uint32_t comm_id);
  // Cancels the control receives and gives control sends a moment to leave (their buffers stay
  // with the shared transport).
  ~PeerTable();
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }

  // ------------------------------------------------------------- control channel (engine thread)
  // Receives what peers sent: records timeout notices; an abort from a peer is blamed as it says
  // and thrown (kMismatch and kTimeout keep their status, anything else is kPeerFailure). Once failed,
  // it still takes the peers' reports of the failure in: the one with the lowest origin is kept
  // (adopt), so every rank ends up blaming alike.
  void poll();
  std::chrono::steady_clock::time_point last_poll() const { return last_poll_; }
  // Tells every peer that operation `seq` timed out here waiting for `waited`.
  void announce_wait(uint64_t seq, const std::vector<int>& waited);
  // The timeout notices received for operation `seq` (origin -> ranks it waited for).
  const std::map<int, std::vector<int>>& notices(uint64_t seq) const;

  // ------------------------------------------------------------------ failure (engine thread)
  // Notes whom the failure about to be thrown is blamed on (ranks sorted, duplicates dropped).
  void blame(int origin, bool aborted, std::vector<int> ranks);
  bool blamed() const { return blame_.set; }
  // Makes the communicator failed unless it already is (then and for kOk only the pending blame
  // is dropped): records status, message and blame, logs, and tells the peers when `tell_peers`.
  // Returns the sticky failure's status and message.
  std::pair<Status, std::string> fail(Status status, const std::string& message, bool tell_peers);

  // --------------------------------------------------------------------------- any thread
  bool is_failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure_message() const;
  FailureStatus failure_status() const;
  // Throws the sticky failure ("communicator already failed: ...") when failed.
  void check_usable() const;
  // Waits up to `limit` for the communicator to fail.
  void wait_failed(std::chrono::milliseconds limit);

 private:
  void post_recv(int peer);
  void adopt(int origin, bool aborted, std::vector<int> ranks, Status status);
  void send_to_all(const ControlMessage& msg);

  SharedTransport& shared_;
  transports::Transport& transport_;
  const int rank_;
  const std::vector<int> members_;
  const uint32_t comm_id_;

  std::vector<std::unique_ptr<transports::Request>> recvs_;
  std::vector<std::shared_ptr<ControlMessage>> bufs_;
  std::vector<std::unique_ptr<transports::Request>> sends_;
  std::map<uint64_t, std::map<int, std::vector<int>>> notices_;  // seq -> origin -> ranks it waited for
  std::chrono::steady_clock::time_point last_poll_{};

  struct Blame {
    bool set = false;
    int origin = -1;
    bool aborted = false;
    std::vector<int> ranks;
  } blame_;  // for the failure being thrown (see blame())

  std::atomic<bool> failed_{false};
  mutable std::mutex fail_mu_;
  std::condition_variable fail_cv_;
  Status fail_status_ = Status::kOk;
  std::string fail_message_;
  int fail_origin_ = -1;
  bool fail_aborted_ = false;
  std::vector<int> fail_ranks_;
  bool fail_timed_out_ = false;  // fail_ranks_ were blamed for a deadline (FailureStatus::timed_out)
};

}  // namespace tandem::engine::comm
