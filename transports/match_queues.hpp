#pragma once
// The matching every two-sided transport core does: receives posted before their message, and
// messages that arrived before their receive, per (peer, tag), each queue in posting / arrival
// order (MPI-style non-overtaking). Not thread-safe: the core's mutex guards it.
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "transports/completion.hpp"
#include "transports/match_key.hpp"
#include "transports/transport.hpp"

namespace tandem::transports {

// A posted receive of a transport core that matches in software (zmq, tcp): its parts, their
// total size, the (peer, tag) it waits for, and its completion.
struct RecvOp {
  std::vector<MutPart> parts;
  size_t capacity = 0;
  int peer = 0;
  uint64_t tag = 0;
  Completion done;
};

inline std::shared_ptr<RecvOp> make_recv_op(int peer, uint64_t tag, std::span<const MutPart> parts) {
  auto op = std::make_shared<RecvOp>();
  op->parts.assign(parts.begin(), parts.end());
  for (const auto& p : parts) op->capacity += p.bytes;
  op->peer = peer;
  op->tag = tag;
  return op;
}


template <typename Op, typename Msg>
class MatchQueues {
 public:
  void post(const MatchKey& k, std::shared_ptr<Op> op) { posted_[k].push_back(std::move(op)); }
  void stash(const MatchKey& k, std::shared_ptr<Msg> m) { stashed_[k].push_back(std::move(m)); }
  // The oldest posted receive / stashed message for the key, removed; null when there is none.
  std::shared_ptr<Op> take_posted(const MatchKey& k) { return pop(posted_, k); }
  std::shared_ptr<Msg> take_stashed(const MatchKey& k) { return pop(stashed_, k); }
  void forget_posted(const MatchKey& k, const std::shared_ptr<Op>& op) { erase(posted_, k, op); }
  void forget_stashed(const MatchKey& k, const std::shared_ptr<Msg>& m) { erase(stashed_, k, m); }
  // Removes the posted receives from `peer` (all of them when peer < 0), calling fn(key, op) for each.
  template <typename Fn>
  void drain_posted(int peer, Fn fn) {
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (peer >= 0 && it->first.peer != peer) {
        ++it;
        continue;
      }
      for (auto& op : it->second) fn(it->first, op);
      it = posted_.erase(it);
    }
  }
  void clear_stashed() { stashed_.clear(); }

 private:
  template <typename T>
  using Map = std::unordered_map<MatchKey, std::deque<std::shared_ptr<T>>, MatchKeyHash>;

  template <typename T>
  static std::shared_ptr<T> pop(Map<T>& m, const MatchKey& k) {
    auto it = m.find(k);
    if (it == m.end()) return nullptr;
    std::shared_ptr<T> out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) m.erase(it);
    return out;
  }
  template <typename T>
  static void erase(Map<T>& m, const MatchKey& k, const std::shared_ptr<T>& x) {
    auto it = m.find(k);
    if (it == m.end()) return;
    std::erase(it->second, x);
    if (it->second.empty()) m.erase(it);
  }

  Map<Op> posted_;
  Map<Msg> stashed_;
};

// Matches a new receive (the core's mutex held): a message already stashed for it is handed to
// copy_out(msg) to deliver what has arrived, and the receive completes if that was all of it or
// else becomes the message's destination for the rest; with nothing stashed, a receive from a peer
// that is gone (`gone`: why, or null while it is alive) fails, else it is posted.
template <typename Msg, typename CopyOut>
void match_receive(MatchQueues<RecvOp, Msg>& queues, const std::shared_ptr<RecvOp>& op, const std::string* gone,
                   const char* transport, CopyOut copy_out) {
  if (std::shared_ptr<Msg> msg = queues.take_stashed({op->peer, op->tag})) {
    copy_out(*msg);
    if (msg->complete()) op->done.complete(msg->total, msg->total > op->capacity);
    else msg->matched = op;  // the rest goes into our parts as it arrives
  } else if (gone) {
    op->done.fail(Status::kPeerFailure,
                  fmt::format("{}: receive from rank {} tag {}: {}", transport, op->peer, op->tag, *gone));
  } else {
    queues.post({op->peer, op->tag}, op);
  }
}

// Cancels a pending receive (the core's mutex held): forgets it if it is still posted; if a
// message is already arriving into it (`arriving`, the message in progress from its peer, or
// null), that message's rest is dropped instead. `transport` names the transport in the error.
template <typename Msg>
void cancel_receive(MatchQueues<RecvOp, Msg>& queues, const std::shared_ptr<RecvOp>& op, std::shared_ptr<Msg>* arriving,
                    const char* transport) {
  if (!op->done.pending()) return;
  queues.forget_posted({op->peer, op->tag}, op);
  if (arriving && *arriving && (*arriving)->matched == op) {
    (*arriving)->matched.reset();
    (*arriving)->discard = true;
  }
  op->done.fail(Status::kTransport, fmt::format("{}: receive from rank {} tag {} was cancelled", transport, op->peer, op->tag));
}

}  // namespace tandem::transports
