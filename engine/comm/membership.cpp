#include "engine/comm/membership.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "engine/comm/peer_table.hpp"
#include "engine/comm/wire.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace {

using Clock = std::chrono::steady_clock;

// "<next_id> <blamed ranks, comma-separated>" -- what each rank posts.
std::string format_post(uint32_t next_id, const std::vector<int>& blamed) {
  return fmt::format("{} {}", next_id, format_rank_list(blamed));
}

struct Post {
  uint32_t next_id = 0;
  std::vector<int> blamed;
};

Post parse_post(const std::string& text, int from) {
  Post p;
  const size_t space = text.find(' ');
  const std::string id = text.substr(0, space);
  TANDEM_CHECK(std::from_chars(id.data(), id.data() + id.size(), p.next_id).ec == std::errc() && !id.empty(),
               Status::kInternal, "shrink: rank {} posted '{}', not '<next id> <blamed ranks>'", from, text);
  if (space != std::string::npos) p.blamed = parse_rank_list(text.substr(space + 1));
  return p;
}

// The coordinator's part: waits for the posts, decides, publishes.
Membership decide(transports::KvStore& store, const ShrinkRequest& req) {
  const auto deadline = Clock::now() + req.window;
  std::set<int> out(req.blamed.begin(), req.blamed.end());
  std::vector<int> arrived{req.rank};
  uint32_t next_id = req.next_id;
  std::vector<uint32_t> ids(static_cast<size_t>(req.size), 0);
  ids[static_cast<size_t>(req.rank)] = req.next_id;
  for (int r = 0; r < req.size; ++r) {
    if (r == req.rank || out.count(r) != 0) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      const Post p = parse_post(store.get(fmt::format("{}alive/{}", req.key_base, r), std::max(left, std::chrono::milliseconds(1))), r);
      out.insert(p.blamed.begin(), p.blamed.end());
      ids[static_cast<size_t>(r)] = p.next_id;
      arrived.push_back(r);
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      log::warn("shrink: rank {} did not take part within {} ms; it is declared dead", r, req.window.count());
      out.insert(r);
    }
  }
  Membership m;
  m.epoch = req.epoch + 1;
  m.coordinator = req.rank;
  for (int r : arrived)
    if (out.count(r) == 0) {
      m.members.push_back(r);
      next_id = std::max(next_id, ids[static_cast<size_t>(r)]);
    }
  std::sort(m.members.begin(), m.members.end());
  TANDEM_CHECK(next_id <= kMaxCommId, Status::kUnsupported, "shrink: out of communicator ids ({} in use, at most {})",
               next_id, kMaxCommId);
  m.comm_id = next_id;
  store.set(req.key_base + "decision", format_decision(m));
  return m;
}

}  // namespace

std::string format_decision(const Membership& m) {
  return fmt::format("epoch={} id={} coordinator={} members={}", m.epoch, m.comm_id, m.coordinator,
                     format_rank_list(m.members));
}

Membership parse_decision(const std::string& text) {
  Membership m;
  std::istringstream in(text);
  std::string members;
  // Each field is "<name>=<value>", in the order format_decision writes them.
  const auto field = [&](const char* name, auto& value) {
    std::string token;
    in >> token;
    const std::string prefix = std::string(name) + "=";
    const bool ok = token.rfind(prefix, 0) == 0 &&
                    std::from_chars(token.data() + prefix.size(), token.data() + token.size(), value).ec == std::errc();
    TANDEM_CHECK(ok, Status::kInternal, "shrink: malformed membership decision '{}' (field {})", text, name);
  };
  field("epoch", m.epoch);
  field("id", m.comm_id);
  field("coordinator", m.coordinator);
  in >> members;
  TANDEM_CHECK(members.rfind("members=", 0) == 0, Status::kInternal,
               "shrink: malformed membership decision '{}' (field members)", text);
  m.members = parse_rank_list(members.substr(8));
  return m;
}

Membership agree_membership(transports::KvStore& store, const ShrinkRequest& req) {
  TANDEM_CHECK(req.rank >= 0 && req.rank < req.size && req.window.count() > 0, Status::kInternal,
               "shrink: rank {} of {}, window {} ms", req.rank, req.size, req.window.count());
  store.set(fmt::format("{}alive/{}", req.key_base, req.rank), format_post(req.next_id, req.blamed));
  const int64_t ticket = store.add(req.key_base + "ticket", 1);
  Membership m;
  if (ticket == 1) {
    m = decide(store, req);
  } else {
    // The coordinator waits at most one window for the posts; the second absorbs its late start.
    std::string text;
    try {
      text = store.get(req.key_base + "decision", 2 * req.window);
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      TANDEM_THROW(Status::kTimeout,
                   "shrink: rank {}: no membership decision within {} ms (the coordinating rank may have died "
                   "while deciding): {}",
                   req.rank, 2 * req.window.count(), e.what());
    }
    m = parse_decision(text);
  }
  const auto it = std::find(m.members.begin(), m.members.end(), req.rank);
  TANDEM_CHECK(it != m.members.end(), Status::kPeerFailure,
               "shrink: rank {} was declared dead by the survivors (coordinator rank {}; epoch {} keeps {} of {}: "
               "{}); it cannot rejoin this job's communicator",
               req.rank, m.coordinator, m.epoch, m.members.size(), req.size,
               m.members.empty() ? std::string("none") : ranks_phrase(m.members));
  m.new_rank = static_cast<int>(it - m.members.begin());
  return m;
}

}  // namespace tandem::engine::comm
