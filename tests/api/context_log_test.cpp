// Contexts created, used and destroyed concurrently, each with its own log sink and settings: every
// sink gets only its own context's messages (run under the tsan preset for the race check).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/tandem.h"

namespace {

struct Sink {
  std::mutex mu;  // the library serializes calls per context; this only guards the final read
  std::vector<std::string> lines;
};

void collect(tandem_log_level_t /*level*/, const char* message, void* user) {
  auto* s = static_cast<Sink*>(user);
  std::lock_guard lock(s->mu);
  s->lines.emplace_back(message);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(context_logging)

BOOST_AUTO_TEST_CASE(concurrent_contexts_keep_their_own_sinks_and_settings) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 20;
  std::vector<Sink> sinks(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string timeout = "TANDEM_TIMEOUT_MS=" + std::to_string(7100 + t);
      const char* settings[] = {"TANDEM_LOG_LEVEL=debug", timeout.c_str()};
      for (int r = 0; r < kRounds; ++r) {
        tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
        p.field_mask = TANDEM_CONTEXT_PARAM_LOG_SINK | TANDEM_CONTEXT_PARAM_SETTINGS;
        p.log_sink = collect;
        p.log_user_data = &sinks[t];
        p.settings = settings;
        p.num_settings = 2;
        tandem_context_t* ctx = nullptr;
        tandem_comm_t* comm = nullptr;
        if (tandem_context_create(&p, &ctx) != TANDEM_OK || tandem_comm_create(ctx, nullptr, &comm) != TANDEM_OK) {
          ++failures;
        }
        tandem_comm_destroy(comm);
        tandem_context_destroy(ctx);
      }
    });
  }
  for (auto& th : threads) th.join();
  BOOST_TEST(failures.load() == 0);
  for (int t = 0; t < kThreads; ++t) {
    const std::string mine = "timeout " + std::to_string(7100 + t) + " ms";
    int own = 0;
    for (const auto& line : sinks[t].lines) {
      if (line.find(mine) != std::string::npos) ++own;
      for (int o = 0; o < kThreads; ++o)
        if (o != t) BOOST_TEST(line.find("timeout " + std::to_string(7100 + o)) == std::string::npos, line);
    }
    BOOST_TEST(own >= kRounds, "context " << t << " logged its communicator " << own << " times");
  }
}

BOOST_AUTO_TEST_SUITE_END()
