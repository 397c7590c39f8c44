#include "engine/comm/peer_table.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

using Clock = std::chrono::steady_clock;

std::string ranks_phrase(const std::vector<int>& ranks) {
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i) list += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", list);
}

std::string format_rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) list += fmt::format("{}{}", list.empty() ? "" : ",", r);
  return list;
}

std::vector<int> parse_rank_list(const std::string& text) {
  std::vector<int> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int v = 0;
    if (std::from_chars(item.data(), item.data() + item.size(), v).ec == std::errc()) out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

TimeoutVerdict timeout_verdict(int self, const std::vector<int>& waited_for,
                               const std::map<int, std::vector<int>>& notices) {
  // Nobody heard from: waited for by some rank, and not itself stuck waiting (no notice).
  std::set<int> waited(waited_for.begin(), waited_for.end());
  std::set<int> stuck{self};
  for (const auto& [origin, list] : notices) {
    stuck.insert(origin);
    waited.insert(list.begin(), list.end());
  }
  TimeoutVerdict v;
  for (int r : waited)
    if (!stuck.count(r)) v.missing.push_back(r);
  for (int r : stuck)
    if (r != self) v.stuck.push_back(r);
  return v;
}

// ------------------------------------------------------------------------------- construction

PeerTable::PeerTable(SharedTransport& shared, int rank, std::vector<int> members, uint32_t comm_id)
    : shared_(shared), transport_(shared.transport()), rank_(rank), members_(std::move(members)), comm_id_(comm_id) {
  recvs_.resize(members_.size());
  bufs_.resize(members_.size());
  for (int p = 0; p < size(); ++p)
    if (p != rank_) post_recv(p);
}

PeerTable::~PeerTable() {
  for (auto& r : recvs_)
    if (r) r->cancel();
  recvs_.clear();
  // Give abort messages a moment to leave; their buffers stay with the transport regardless.
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  for (auto& r : sends_) {
    try {
      while (!r->test() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
    } catch (const Error&) {
    }
  }
  sends_.clear();
  for (auto& b : bufs_)
    if (b) shared_.bury(b);
}

// ---------------------------------------------------------------------------- control channel

void PeerTable::post_recv(int peer) {
  if (!bufs_[peer]) bufs_[peer] = std::make_shared<ControlMessage>();
  const transports::MutPart part{bufs_[peer].get(), sizeof(ControlMessage)};
  recvs_[peer] = transport_.irecv(members_[static_cast<size_t>(peer)], control_tag(comm_id_), std::span(&part, 1));
}

void PeerTable::send_to_all(const ControlMessage& msg) {
  auto buf = std::make_shared<ControlMessage>(msg);
  shared_.bury(buf);  // sends may outlive this communicator
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    try {
      const transports::ConstPart part{buf.get(), sizeof(ControlMessage)};
      sends_.push_back(transport_.isend(members_[static_cast<size_t>(p)], control_tag(comm_id_), std::span(&part, 1)));
    } catch (const Error& e) {
      log::debug("comm {} rank {}: control message to rank {} not sent: {}", comm_id_, rank_, p, e.what());
    }
  }
}

void PeerTable::announce_wait(uint64_t seq, const std::vector<int>& waited) {
  send_to_all(make_control(ControlType::kTimeoutNotice, rank_, 0, seq, format_rank_list(waited)));
}

const std::map<int, std::vector<int>>& PeerTable::notices(uint64_t seq) const {
  static const std::map<int, std::vector<int>> none;
  auto it = notices_.find(seq);
  return it == notices_.end() ? none : it->second;
}

void PeerTable::poll() {
  last_poll_ = Clock::now();
  for (int p = 0; p < size(); ++p) {
    auto& req = recvs_[static_cast<size_t>(p)];
    if (!req) continue;
    bool done = false;
    try {
      done = req->test();
    } catch (const Error&) {
      req.reset();  // the peer is gone; its data receives report that
      continue;
    }
    if (!done) continue;
    const ControlMessage msg = *bufs_[p];
    const bool ok = req->bytes() == sizeof(ControlMessage) && msg.magic == kWireMagic;
    post_recv(p);
    if (!ok) {
      log::warn("comm {} rank {}: ignored a malformed control message from rank {}", comm_id_, rank_, p);
      continue;
    }
    const std::string text(msg.text, strnlen(msg.text, sizeof(msg.text)));
    if (msg.type == static_cast<uint32_t>(ControlType::kTimeoutNotice)) {
      notices_[msg.seq][p] = parse_rank_list(text);
      while (notices_.size() > 16) notices_.erase(notices_.begin());
    } else if (msg.type == static_cast<uint32_t>(ControlType::kAbort)) {
      const auto st = static_cast<Status>(msg.status);
      std::vector<int> blamed;
      for (int k = 0; k < std::min<int>(msg.blamed_count, kMaxBlamedRanks); ++k)
        if (msg.blamed[k] >= 0 && msg.blamed[k] < size()) blamed.push_back(msg.blamed[k]);
      const bool known_origin = msg.first_origin >= 0 && msg.first_origin < size();
      if (is_failed()) {  // another rank's report of the failure this rank has too: agree on one
        adopt(known_origin ? msg.first_origin : p, known_origin && msg.aborted != 0, std::move(blamed), st);
        continue;
      }
      blame(known_origin ? msg.first_origin : p, known_origin && msg.aborted != 0, std::move(blamed));
      if (st == Status::kMismatch || st == Status::kTimeout)
        throw Error(st, fmt::format("{} (reported by rank {})", text, p));
      const std::string origin = fmt::format("rank {} ", p);
      throw Error(Status::kPeerFailure, text.rfind(origin, 0) == 0 ? text : fmt::format("rank {} failed: {}", p, text));
    }
  }
}

// ------------------------------------------------------------------------------------ failure

void PeerTable::blame(int origin, bool aborted, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  blame_ = Blame{true, origin, aborted, std::move(ranks)};
}

void PeerTable::adopt(int origin, bool aborted, std::vector<int> ranks, Status status) {
  // Every rank that detects a fault tells every other; each keeps the report with the lowest origin, so once
  // the reports have crossed, all ranks name the same origin and the same blamed ranks.
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::lock_guard lock(fail_mu_);
  if (origin < 0 || origin >= fail_origin_) return;
  fail_origin_ = origin;
  fail_aborted_ = aborted;
  fail_ranks_ = std::move(ranks);
  fail_timed_out_ = status == Status::kTimeout;
}

std::pair<Status, std::string> PeerTable::fail(Status status, const std::string& message, bool tell_peers) {
  if (!is_failed() && status != Status::kOk) {
    const Blame b = blame_.set ? blame_ : Blame{true, rank_, false, {}};
    {
      std::lock_guard lock(fail_mu_);
      fail_status_ = status;
      fail_message_ = message;
      fail_origin_ = b.origin;
      fail_aborted_ = b.aborted;
      fail_ranks_ = b.ranks;
      fail_timed_out_ = status == Status::kTimeout;
      failed_.store(true, std::memory_order_release);
    }
    fail_cv_.notify_all();
    log::error("comm {} rank {}: {}", comm_id_, rank_, message);
    // Peers fail fast with the origin named; they keep a mismatch's or timeout's own status.
    if (tell_peers) {
      ControlMessage m = make_control(ControlType::kAbort, rank_, static_cast<int32_t>(status), 0, message);
      m.first_origin = b.origin;
      m.aborted = b.aborted ? 1 : 0;
      for (int r : b.ranks)
        if (m.blamed_count < kMaxBlamedRanks) m.blamed[m.blamed_count++] = r;
      send_to_all(m);
    }
  }
  blame_ = Blame{};
  std::lock_guard lock(fail_mu_);
  return {fail_status_, fail_message_};
}

std::string PeerTable::failure_message() const {
  std::lock_guard lock(fail_mu_);
  return fail_message_;
}

FailureStatus PeerTable::failure_status() const {
  FailureStatus f;
  std::lock_guard lock(fail_mu_);
  if (!failed_.load(std::memory_order_acquire)) return f;
  f.failed = true;
  f.status = fail_status_;
  f.origin = fail_origin_;
  f.aborted = fail_aborted_;
  f.ranks = fail_ranks_;
  f.timed_out = fail_timed_out_;
  f.message = fail_message_;
  return f;
}

void PeerTable::check_usable() const {
  if (!is_failed()) return;
  std::lock_guard lock(fail_mu_);
  throw Error(fail_status_, fmt::format("communicator already failed: {}", fail_message_));
}

void PeerTable::wait_failed(std::chrono::milliseconds limit) {
  std::unique_lock lock(fail_mu_);
  fail_cv_.wait_for(lock, limit, [&] { return failed_.load(std::memory_order_acquire); });
}

}  // namespace tandem::engine::comm
