#include "engine/comm/admission.hpp"

#include <algorithm>
#include <charconv>
#include <sstream>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace {

constexpr const char* kAsked = "tandem/join/asked";
constexpr const char* kHandled = "tandem/join/handled";
// Set once the job admits nobody any more (refuse_waiting): a joiner asking later is refused at once, and one waiting
// learns it within kClosedPoll, instead of waiting for an answer no step boundary will give.
constexpr const char* kClosed = "tandem/join/closed";
constexpr const char* kClosedWhy = "tandem/join/closed-why";
constexpr std::chrono::milliseconds kClosedPoll{500};

// Throws kUnsupported with the job's reason when it admits nobody any more.
void refuse_if_closed(transports::KvStore& store, int64_t ticket) {
  if (store.add(kClosed, 0) == 0) return;
  std::string why;
  try {
    why = store.get(kClosedWhy, std::chrono::milliseconds(2000));
  } catch (const Error&) {
    why = "it admits no joiners";
  }
  if (ticket > 0) TANDEM_THROW(Status::kUnsupported, "join: the job refused this rank (ticket {}): {}", ticket, why);
  TANDEM_THROW(Status::kUnsupported, "join: the job refused this rank: {}", why);
}

std::string request_key(int64_t t) { return fmt::format("tandem/join/request/{}", t); }
std::string answer_key(int64_t t) { return fmt::format("tandem/join/answer/{}", t); }

}  // namespace

std::string grow_prefix(int64_t grow_id) { return fmt::format("tandem/grow/{}/", grow_id); }

int64_t joiners_waiting(transports::KvStore& store) { return store.add(kAsked, 0) - store.add(kHandled, 0); }

Admission admit_joiners(transports::KvStore& store, int size, int epoch, int max_ranks,
                        std::chrono::milliseconds window, int limit) {
  const int64_t asked = store.add(kAsked, 0);
  const int64_t handled = store.add(kHandled, 0);
  Admission a;
  std::vector<std::string> hosts;
  int64_t last = handled;  // the tickets handled+1..last are handled here; later ones keep waiting (limit)
  for (int64_t t = handled + 1; t <= asked && (limit <= 0 || static_cast<int>(a.tickets.size()) < limit); ++t) {
    last = t;
    std::string host;
    try {
      host = store.get(request_key(t), window);
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      log::warn("grow: joiner ticket {} posted no request within {} ms (it died after asking); it is not admitted", t,
                window.count());
      continue;
    }
    const int now = size + static_cast<int>(a.tickets.size());
    if (max_ranks > 0 && now >= max_ranks) {
      const std::string why =
          fmt::format("the job is full: {} of --max-ranks {} ranks run (the job already has {} ranks and --max-ranks "
                      "is {})", now, max_ranks, now, max_ranks);
      log::warn("grow: joiner ticket {} ({}) refused: {}", t, host, why);
      store.set(answer_key(t), "refuse " + why);
      continue;
    }
    a.tickets.push_back(t);
    hosts.push_back(host);
  }
  // The grown world's namespace: the last ticket handled, unique (every grow handles at least one new ticket).
  a.grow_id = last;
  store.add(kHandled, last - handled);
  const int grown = size + static_cast<int>(a.tickets.size());
  for (size_t i = 0; i < a.tickets.size(); ++i) {
    store.set(answer_key(a.tickets[i]),
              fmt::format("admit {} {} {} {} {}", a.grow_id, size + static_cast<int>(i), grown, epoch, size));
    log::info("grow: joiner ticket {} ({}) admitted as rank {} of {} (epoch {})", a.tickets[i], hosts[i],
              size + static_cast<int>(i), grown, epoch);
  }
  return a;
}

int64_t refuse_waiting(transports::KvStore& store, const std::string& why) {
  store.set(kClosedWhy, why);  // first: a joiner that sees the flag reads the reason
  store.add(kClosed, 1);
  const int64_t asked = store.add(kAsked, 0);
  const int64_t handled = store.add(kHandled, 0);
  for (int64_t t = handled + 1; t <= asked; ++t) store.set(answer_key(t), "refuse " + why);
  if (asked > handled) store.add(kHandled, asked - handled);
  return asked - handled;
}

JoinAnswer request_admission(transports::KvStore& store, const std::string& host, std::chrono::milliseconds wait) {
  refuse_if_closed(store, 0);
  const int64_t t = store.add(kAsked, 1);
  store.set(request_key(t), host);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      text = store.get(answer_key(t), std::clamp(left, std::chrono::milliseconds(1), kClosedPoll));
      break;
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      if (left <= kClosedPoll)
        TANDEM_THROW(Status::kTimeout,
                     "join: no answer to joiner ticket {} within {} ms: the job admits joiners only at the step "
                     "boundaries of elastic training (tandem train --elastic) -- is it elastic, and still running? ({})",
                     t, wait.count(), e.what());
    }
    refuse_if_closed(store, t);  // the job closed while this rank waited (it ended, or admits nobody)
  }
  if (text.rfind("refuse ", 0) == 0)
    TANDEM_THROW(Status::kUnsupported, "join: the job refused this rank (ticket {}): {}", t, text.substr(7));
  JoinAnswer a;
  std::istringstream in(text);
  std::string word;
  in >> word >> a.grow_id >> a.rank >> a.size >> a.epoch >> a.old_size;
  TANDEM_CHECK(word == "admit" && !in.fail() && a.old_size >= 1 && a.rank >= a.old_size && a.rank < a.size, Status::kInternal,
               "join: malformed answer '{}' to ticket {}", text, t);
  return a;
}

void publish_outcome(transports::KvStore& store, int64_t grow_id, bool ok) {
  store.set(grow_prefix(grow_id) + "outcome", ok ? "ok" : "abandoned");
}

void await_outcome(transports::KvStore& store, int64_t grow_id, std::chrono::milliseconds wait) {
  const std::string v = store.get(grow_prefix(grow_id) + "outcome", wait);
  TANDEM_CHECK(v == "ok", Status::kPeerFailure,
               "join: the running ranks abandoned this admission (grow {}): a rank failed to connect to the grown "
               "world within the deadline; they go on without the joiners",
               grow_id);
}

}  // namespace tandem::engine::comm
