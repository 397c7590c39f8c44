#include "engine/comm/membership.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
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

// "<next_id> fault=<ranks> timeout=<ranks> dead=<ranks>" (comma-separated lists, possibly empty) -- what each rank
// posts. A post without the dead field (a build before rule 2's transport evidence) still reads.
std::string format_post(uint32_t next_id, const std::vector<int>& fault, const std::vector<int>& timed_out,
                        const std::vector<int>& dead) {
  return fmt::format("{} fault={} timeout={} dead={}", next_id, format_rank_list(fault), format_rank_list(timed_out),
                     format_rank_list(dead));
}

struct Post {
  uint32_t next_id = 0;
  std::vector<int> fault;
  std::vector<int> timed_out;
  std::vector<int> dead;
};

Post parse_post(const std::string& text, int from) {
  Post p;
  std::istringstream in(text);
  std::string id, fault, timed_out, dead;
  in >> id >> fault >> timed_out >> dead;
  const bool ok = !id.empty() && std::from_chars(id.data(), id.data() + id.size(), p.next_id).ec == std::errc() &&
                  fault.rfind("fault=", 0) == 0 && timed_out.rfind("timeout=", 0) == 0 &&
                  (dead.empty() || dead.rfind("dead=", 0) == 0);
  TANDEM_CHECK(ok, Status::kInternal,
               "shrink: rank {} posted '{}', not '<next id> fault=<ranks> timeout=<ranks> dead=<ranks>'", from, text);
  p.fault = parse_rank_list(fault.substr(6));
  p.timed_out = parse_rank_list(timed_out.substr(8));
  if (!dead.empty()) p.dead = parse_rank_list(dead.substr(5));
  return p;
}

// What this rank's transport knows is gone (rule 2), in the failed communicator's ranks, itself left out.
std::vector<int> known_dead(const ShrinkRequest& req) {
  if (!req.dead_peers) return {};
  std::vector<int> out;
  for (int r : req.dead_peers())
    if (r >= 0 && r < req.size && r != req.rank) out.push_back(r);
  return out;
}

constexpr const char* kLeftPost = "left ";  // rule 5's post: "left <note>"

std::string alive_key(const std::string& key_base, int rank) { return fmt::format("{}alive/{}", key_base, rank); }
std::string note_key(const std::string& key_base, int rank) { return fmt::format("{}note/{}", key_base, rank); }

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// Rule 6's frozen notes: "<rank> <note>" per line (a note is one line).
std::string format_notes(const std::vector<std::pair<int, std::string>>& notes) {
  std::string out;
  for (const auto& [r, note] : notes) out += fmt::format("{} {}\n", r, note);
  return out;
}

std::map<int, std::string> parse_notes(const std::string& text) {
  std::map<int, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    int r = -1;
    const bool ok = space != std::string::npos &&
                    std::from_chars(line.data(), line.data() + space, r).ec == std::errc() && r >= 0;
    TANDEM_CHECK(ok, Status::kInternal, "shrink: malformed line '{}' in the departed ranks' notes", line);
    out[r] = line.substr(space + 1);
  }
  return out;
}

// How long the coordinator waits on one missing post before it looks at the transport and the others' posts again.
constexpr auto kPollSlice = std::chrono::milliseconds(20);

// The coordinator's part (rule 2): waits for the posts, decides, publishes.
Membership decide(transports::KvStore& store, const ShrinkRequest& req) {
  const auto start = Clock::now();
  const auto deadline = start + unsuspected_wait(req.window);
  const auto grace_end = start + timeout_grace(req.window);
  std::set<int> fault(req.blamed.begin(), req.blamed.end());
  std::set<int> suspected(req.timed_out.begin(), req.timed_out.end());
  std::set<int> dead;  // seen gone by a transport (this rank's or a poster's) before they posted
  std::vector<bool> posted(static_cast<size_t>(req.size), false);
  posted[static_cast<size_t>(req.rank)] = true;
  std::vector<uint32_t> ids(static_cast<size_t>(req.size), 0);
  ids[static_cast<size_t>(req.rank)] = req.next_id;
  std::map<int, std::string> gone;  // rule 5: the ranks that left, with their notes
  std::vector<int> reported;        // transport evidence not yet weighed
  // Reads rank r's post if it appears within `wait`; a post adds its suspicions and its transport's evidence.
  const auto read_post = [&](int r, std::chrono::milliseconds wait) {
    try {
      const std::string text = store.get(alive_key(req.key_base, r), std::max(wait, std::chrono::milliseconds(0)));
      if (text.rfind(kLeftPost, 0) == 0) {
        gone[r] = text.substr(std::strlen(kLeftPost));
        return;
      }
      const Post p = parse_post(text, r);
      fault.insert(p.fault.begin(), p.fault.end());
      suspected.insert(p.timed_out.begin(), p.timed_out.end());
      reported.insert(reported.end(), p.dead.begin(), p.dead.end());
      ids[static_cast<size_t>(r)] = p.next_id;
      posted[static_cast<size_t>(r)] = true;
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
    }
  };
  const auto settled = [&](int r) {
    return posted[static_cast<size_t>(r)] || fault.count(r) != 0 || gone.count(r) != 0 || dead.count(r) != 0;
  };
  // Transport evidence counts out only a rank that has not posted: its post is read once more first, as it may have
  // posted (or left, rule 5) just before its connection ended. A rank that took part stays unless blamed for a fault.
  const auto weigh_evidence = [&] {
    const std::vector<int> own = known_dead(req);
    reported.insert(reported.end(), own.begin(), own.end());
    while (!reported.empty()) {  // a post read here may report more
      const int r = reported.back();
      reported.pop_back();
      if (r < 0 || r >= req.size || settled(r)) continue;
      read_post(r, std::chrono::milliseconds(0));
      if (!settled(r)) dead.insert(r);
    }
  };
  // Every rank not blamed for a fault may post until its wait ends: the grace for a rank suspected of a timeout, the
  // window for one nobody suspects -- or until a transport saw it gone. Each round waits a slice on one missing post,
  // then reads the others' without waiting and asks the transport again.
  for (;;) {
    weigh_evidence();
    const auto now = Clock::now();
    std::vector<int> waiting;
    for (int r = 0; r < req.size; ++r)
      if (!settled(r) && now < (suspected.count(r) != 0 ? grace_end : deadline)) waiting.push_back(r);
    if (waiting.empty()) break;
    const auto until = suspected.count(waiting[0]) != 0 ? grace_end : deadline;
    read_post(waiting[0],
              std::min(kPollSlice, std::chrono::duration_cast<std::chrono::milliseconds>(until - now)));
    for (size_t i = 1; i < waiting.size(); ++i)
      if (!settled(waiting[i])) read_post(waiting[i], std::chrono::milliseconds(0));
  }
  Membership m;
  m.epoch = req.epoch + 1;
  m.coordinator = req.rank;
  uint32_t next_id = req.next_id;
  for (int r = 0; r < req.size; ++r) {
    if (posted[static_cast<size_t>(r)] && fault.count(r) == 0) {
      m.members.push_back(r);
      next_id = std::max(next_id, ids[static_cast<size_t>(r)]);
      continue;
    }
    if (gone.count(r) != 0) {
      m.left.emplace_back(r, gone[r]);
      log::info("shrink: rank {} left the communicator (its program is done with it: {})", r, gone[r]);
      continue;
    }
    // Rule 6: what the rank recorded before it went (none: it never wrote one)
    try {
      m.left.emplace_back(r, store.get(note_key(req.key_base, r), std::chrono::milliseconds(0)));
      log::info("shrink: rank {}, counted out, left the note '{}'", r, m.left.back().second);
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
    }
    if (fault.count(r) != 0) {
      log::warn("shrink: rank {} is declared dead: a rank saw it fail", r);
    } else if (dead.count(r) != 0) {
      log::warn("shrink: rank {} is declared dead: a rank's transport saw its connection end before it took part", r);
    } else if (suspected.count(r) != 0) {
      log::warn("shrink: rank {} is declared dead: a rank timed out waiting for it, and it did not take part within "
                "the {} ms grace",
                r, timeout_grace(req.window).count());
    } else {
      log::warn("shrink: rank {} did not take part within {} ms; it is declared dead", r,
                unsuspected_wait(req.window).count());
    }
  }
  TANDEM_CHECK(next_id <= kMaxCommId, Status::kUnsupported, "shrink: out of communicator ids ({} in use, at most {})",
               next_id, kMaxCommId);
  m.comm_id = next_id;
  if (!m.left.empty()) store.set(req.key_base + "notes", format_notes(m.left));  // rule 6: before the decision
  store.set(req.key_base + "decision", format_decision(m));
  return m;
}

}  // namespace

std::chrono::milliseconds timeout_grace(std::chrono::milliseconds window) {
  using std::chrono::milliseconds;
  return std::min(window, std::clamp(window / 4, milliseconds(20), milliseconds(2000)));
}

std::chrono::milliseconds unsuspected_wait(std::chrono::milliseconds window) { return window + kLetGoAllowance; }

std::string format_decision(const Membership& m) {
  std::vector<int> left;
  for (const auto& [r, note] : m.left) left.push_back(r);
  return fmt::format("epoch={} id={} coordinator={} members={} left={}", m.epoch, m.comm_id, m.coordinator,
                     format_rank_list(m.members), format_rank_list(left));
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
  std::string left;  // optional (rule 5): the notes are read from the ranks' posts (agree_membership)
  if (in >> left) {
    TANDEM_CHECK(left.rfind("left=", 0) == 0, Status::kInternal,
                 "shrink: malformed membership decision '{}' (field left)", text);
    for (int r : parse_rank_list(left.substr(5))) m.left.emplace_back(r, std::string());
  }
  return m;
}

void post_departure(transports::KvStore& store, const std::string& key_base, int rank, const std::string& note,
                    std::chrono::milliseconds bound) {
  store.set_within(alive_key(key_base, rank), kLeftPost + one_line(note), bound);
}

void post_note(transports::KvStore& store, const std::string& key_base, int rank, const std::string& note,
               std::chrono::milliseconds bound) {
  store.set_within(note_key(key_base, rank), one_line(note), bound);
}

Membership agree_membership(transports::KvStore& store, const ShrinkRequest& req) {
  TANDEM_CHECK(req.rank >= 0 && req.rank < req.size && req.window.count() > 0, Status::kInternal,
               "shrink: rank {} of {}, window {} ms", req.rank, req.size, req.window.count());
  store.set(alive_key(req.key_base, req.rank), format_post(req.next_id, req.blamed, req.timed_out, known_dead(req)));
  const int64_t ticket = store.add(req.key_base + "ticket", 1);
  Membership m;
  if (ticket == 1) {
    m = decide(store, req);
  } else {
    // The coordinator waits at most unsuspected_wait for the posts; one window more absorbs its late start.
    const auto wait = req.window + unsuspected_wait(req.window);
    std::string text;
    try {
      text = store.get(req.key_base + "decision", wait);
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      TANDEM_THROW(Status::kTimeout,
                   "shrink: rank {}: no membership decision within {} ms (the coordinating rank may have died "
                   "while deciding): {}",
                   req.rank, wait.count(), e.what());
    }
    m = parse_decision(text);
    // The departed ranks' notes, as the coordinator wrote them before its decision (rule 6).
    if (!m.left.empty()) {
      try {
        const std::map<int, std::string> notes = parse_notes(store.get(req.key_base + "notes", req.window));
        for (auto& [r, note] : m.left)
          if (const auto it = notes.find(r); it != notes.end()) note = it->second;
      } catch (const Error& e) {
        log::warn("shrink: rank {}: the notes of the ranks that left could not be read: {}", req.rank, e.what());
      }
    }
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
