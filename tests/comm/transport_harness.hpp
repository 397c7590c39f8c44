#pragma once
// For unit tests of the communicator's parts: `n` ranks as threads, each with its own inproc
// transport (wrapped in a SharedTransport) over one MemoryStore. Rank bodies report failures by
// throwing (EXPECT in comm_harness.hpp); run_on_transports reports them from the test's thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/shared_transport.hpp"
#include "tests/comm/comm_harness.hpp"

namespace tandem::testing {

template <typename Fn>
void run_on_transports(int n, Fn fn) {
  auto store = std::make_shared<transports::MemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        transports::TransportOptions to;
        to.name = "inproc";
        to.rank = r;
        to.size = n;
        to.store = store.get();
        to.key_prefix = "unit/";
        to.connect_timeout = std::chrono::milliseconds(10000);
        engine::comm::SharedTransport shared(transports::create_transport(to));
        fn(r, shared);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty()) BOOST_ERROR("rank " << r << ": " << errors[r]);
}

// Waits (up to 5 s) until `count` reaches `want`: a sender keeps its transport alive until every
// receiver has what it sent.
inline void wait_for(const std::atomic<int>& count, int want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (count.load() < want && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace tandem::testing
