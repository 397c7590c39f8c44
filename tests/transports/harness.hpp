#pragma once
// Runs N ranks as threads of this process, each with its own transport, over a shared MemoryStore.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "tests/common/transport_variants.hpp"
#include "transports/memory_store.hpp"
#include "transports/transport.hpp"

// Boost.Test assertions are not thread-safe: rank threads check with CHECK_RANK, which throws, and
// run_ranks rethrows the first failure on the test's own thread.
#define CHECK_RANK(cond, ...)                                                                     \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::ostringstream os_;                                                                     \
      os_ << __FILE__ << ":" << __LINE__ << ": check failed: " #cond " " __VA_OPT__(<<) __VA_ARGS__; \
      throw std::runtime_error(os_.str());                                                        \
    }                                                                                             \
  } while (0)

namespace tandem::transports::testing {

inline constexpr std::chrono::seconds kWaitDeadline{30};

struct Rank {
  int rank;
  int size;
  Transport& t;
  std::barrier<>& sync;  // all ranks of the run
};

inline std::string unique_prefix(const std::string& name) {
  static std::atomic<int> counter{0};
  return "test/" + name + "/" + std::to_string(counter.fetch_add(1));
}

inline TransportOptions options_for(const std::string& spec, int rank, int size, KvStore& store,
                                    const std::string& prefix) {
  TransportOptions o;
  o.name = transport_name(spec);
  o.rank = rank;
  o.size = size;
  o.store = &store;
  o.key_prefix = prefix;
  o.connect_timeout = std::chrono::milliseconds(20000);
  return o;
}

// Drives `t` until `r` completes; throws kTimeout after `deadline`.
inline void wait(Transport& t, Request& r, std::chrono::milliseconds deadline = kWaitDeadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!r.test()) {
    if (std::chrono::steady_clock::now() > until)
      TANDEM_THROW(Status::kTimeout, "rank {}: request not complete after {} ms", t.rank(), deadline.count());
    t.wait_for_progress(std::chrono::milliseconds(1));
  }
}

// Asks t.dead_peers() until it lists `rank`, driving progress between asks, for at most `deadline`; returns the last
// list (which lacks `rank` when the deadline passed).
inline std::vector<int> dead_peers_once_listed(Transport& t, int rank, std::chrono::milliseconds deadline = kWaitDeadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    std::vector<int> dead = t.dead_peers();
    if (std::find(dead.begin(), dead.end(), rank) != dead.end() || std::chrono::steady_clock::now() > until) return dead;
    t.wait_for_progress(std::chrono::milliseconds(1));
  }
}

// Polls `r` for at most `deadline`; returns whether it completed (does not throw on timeout).
inline bool poll_for(Transport& t, Request& r, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (r.test()) return true;
    t.wait_for_progress(std::chrono::milliseconds(1));
  }
  return r.test();
}

inline void wait_all(Transport& t, std::vector<std::unique_ptr<Request>>& rs) {
  for (auto& r : rs) wait(t, *r);
}

// A rank's part of run_rank_threads: its Rank, and its transport itself (a part may destroy it early, to time that).
using RankBody = std::function<void(Rank&, std::unique_ptr<Transport>&)>;

// Runs `size` ranks of `transport` as threads over `store` under `prefix`, each creating its own transport (with
// `connect_timeout`) and running `body` with a barrier shared by the run. A rank that throws -- while connecting too
// -- is recorded, calls `on_failure` (to release ranks waiting on something else than the barrier) and drops out of
// the barrier, so that the others never wait for it. Returns every rank's error, "\n  rank R: what" each ("" when
// none); the caller asserts.
inline std::string run_rank_threads(const std::string& transport, int size, KvStore& store, const std::string& prefix,
                                    const RankBody& body, const std::function<void()>& on_failure = {},
                                    std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(20000)) {
  std::barrier<> sync(size);
  std::mutex mu;
  std::string failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto o = options_for(transport, r, size, store, prefix);
        o.connect_timeout = connect_timeout;
        auto t = create_transport(o);
        Rank rk{r, size, *t, sync};
        body(rk, t);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          failures += "\n  rank " + std::to_string(r) + ": " + e.what();
        }
        if (on_failure) on_failure();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& th : threads) th.join();
  return failures;
}

// Runs fn on `size` threads (one transport each); the test fails with every rank's error.
inline void run_ranks(const std::string& transport, int size, const std::function<void(Rank&)>& fn) {
  const VariantEnv env(transport);
  MemoryStore store;
  std::atomic<int> finished{0};
  const std::string failures = run_rank_threads(
      transport, size, store, unique_prefix(transport),
      [&](Rank& rk, std::unique_ptr<Transport>& t) {
        fn(rk);
        // Keep progressing until every rank is done: a completed receive may still owe its sender
        // an acknowledgement (UCX rendezvous), and nobody tears down while a peer needs it.
        finished.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + kWaitDeadline;
        while (finished.load() < size && std::chrono::steady_clock::now() < until)
          t->wait_for_progress(std::chrono::milliseconds(1));
      },
      [&] { finished.fetch_add(1); });
  BOOST_TEST(failures.empty(), transport << " with " << size << " ranks failed:" << failures);
}

// Deterministic payload byte for (src, dst, seq, i).
inline unsigned char pattern(int src, int dst, int seq, size_t i) {
  return static_cast<unsigned char>((src * 131 + dst * 31 + seq * 7 + i * 13 + (i >> 9)) & 0xff);
}

inline std::vector<unsigned char> payload(int src, int dst, int seq, size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(src, dst, seq, i);
  return v;
}

}  // namespace tandem::transports::testing
