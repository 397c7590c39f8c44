#include "simulator/des/simulator.hpp"

#include <cmath>

#include "engine/core/error.hpp"

namespace tandem::simulator::des {

namespace {
TimeNs checked_ns(double ns, double seconds) {
  TANDEM_REQUIRE(std::isfinite(ns) && ns >= 0 && ns < 9.2e18, "simulated duration {} s is negative or out of range",
                 seconds);
  return static_cast<TimeNs>(ns);
}
}  // namespace

TimeNs to_ns(double seconds) { return checked_ns(std::nearbyint(seconds * 1e9), seconds); }
TimeNs ceil_ns(double seconds) { return checked_ns(std::ceil(seconds * 1e9), seconds); }

void Simulator::schedule_at(TimeNs t, EventHandler* handler, uint64_t arg) {
  TANDEM_CHECK(t >= now_, Status::kInternal, "event scheduled in the past: t={} ns < now={} ns", t, now_);
  push(Entry{t, next_seq_++, handler, arg});
}

void Simulator::push(const Entry& e) {
  heap_.push_back(e);
  size_t i = heap_.size() - 1;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!before(e, heap_[parent])) break;
    heap_[i] = heap_[parent];
    i = parent;
  }
  heap_[i] = e;
}

Simulator::Entry Simulator::pop() {
  Entry top = heap_.front();
  Entry last = heap_.back();
  heap_.pop_back();
  size_t n = heap_.size();
  if (n > 0) {
    size_t i = 0;
    for (;;) {
      size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
      if (!before(heap_[child], last)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = last;
  }
  return top;
}

void Simulator::end_instant() {
  for (InstantHook* h : hooks_) h->on_instant_end();
}

uint64_t Simulator::run(TimeNs until) {
  uint64_t count = 0;
  for (;;) {
    if (heap_.empty() || heap_.front().time > now_) {
      end_instant();  // may schedule more events, possibly at now_
      if (heap_.empty() || heap_.front().time > until) break;
      if (heap_.front().time == now_) continue;  // a hook scheduled work at this instant
    }
    Entry e = pop();
    now_ = e.time;
    e.handler->on_event(e.arg);
    ++count;
  }
  processed_ += count;
  return count;
}

}  // namespace tandem::simulator::des
