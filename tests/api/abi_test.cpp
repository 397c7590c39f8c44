#define BOOST_TEST_MODULE tandem_api
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdio>
#include <string>

#include "tandem/tandem.h"

// Public structs are ABI: their sizes and offsets may only grow at the end.
static_assert(sizeof(tandem_status_t) == 4);
static_assert(sizeof(tandem_dtype_t) == 4);
static_assert(offsetof(tandem_context_params_t, field_mask) == 0);
static_assert(offsetof(tandem_context_params_t, num_threads) == 8);
static_assert(offsetof(tandem_context_params_t, log_sink) == 16);
static_assert(offsetof(tandem_context_params_t, log_user_data) == 24);
static_assert(offsetof(tandem_context_params_t, log_level) == 32);
static_assert(offsetof(tandem_context_params_t, settings) == 40);
static_assert(offsetof(tandem_context_params_t, num_settings) == 48);
static_assert(sizeof(tandem_context_params_t) == 56);
static_assert(sizeof(tandem_algo_t) == 4);
static_assert(sizeof(tandem_op_t) == 4);
static_assert(offsetof(tandem_comm_params_t, field_mask) == 0);
static_assert(offsetof(tandem_comm_params_t, rank) == 8);
static_assert(offsetof(tandem_comm_params_t, size) == 12);
static_assert(offsetof(tandem_comm_params_t, master_addr) == 16);
static_assert(offsetof(tandem_comm_params_t, secret) == 24);
static_assert(offsetof(tandem_comm_params_t, transport) == 32);
static_assert(offsetof(tandem_comm_params_t, master_port) == 40);
static_assert(offsetof(tandem_comm_params_t, allreduce_algo) == 44);
static_assert(offsetof(tandem_comm_params_t, timeout_ms) == 48);
static_assert(offsetof(tandem_comm_params_t, deterministic) == 56);
static_assert(sizeof(tandem_comm_params_t) == 64);
// Enum values are wire- and ABI-stable.
static_assert(TANDEM_ALGO_RING == 1 && TANDEM_ALGO_HIERARCHICAL == 4 && TANDEM_ALGO_DETERMINISTIC == 6);
static_assert(TANDEM_COMM_PARAM_DETERMINISTIC == (UINT64_C(1) << 8));
// The strategies of issue #13: fields appended to the parallel params and attributes, each behind a new bit.
static_assert(offsetof(tandem_parallel_params_t, trace) == 72);
static_assert(offsetof(tandem_parallel_params_t, servers) == 76);
static_assert(offsetof(tandem_parallel_params_t, staleness) == 80);
static_assert(offsetof(tandem_parallel_params_t, tau) == 84);
static_assert(offsetof(tandem_parallel_params_t, alpha) == 88);
static_assert(offsetof(tandem_parallel_params_t, easgd_async) == 96);
static_assert(offsetof(tandem_parallel_params_t, clients) == 100);
static_assert(offsetof(tandem_parallel_params_t, dirichlet_alpha) == 104);
static_assert(offsetof(tandem_parallel_params_t, client_fraction) == 112);
static_assert(offsetof(tandem_parallel_params_t, local_epochs) == 120);
static_assert(offsetof(tandem_parallel_params_t, round_deadline_s) == 128);
static_assert(offsetof(tandem_parallel_params_t, average_every) == 136);
static_assert(offsetof(tandem_parallel_params_t, warmup_steps) == 140);
static_assert(offsetof(tandem_parallel_params_t, elastic) == 144);
static_assert(offsetof(tandem_parallel_params_t, elastic_checkpoint) == 152);
static_assert(offsetof(tandem_parallel_params_t, max_ranks) == 160);
static_assert(offsetof(tandem_parallel_params_t, join_poll_steps) == 164);
static_assert(offsetof(tandem_parallel_params_t, joining) == 168);
static_assert(offsetof(tandem_parallel_params_t, server_replicas) == 172);
// The bucket policy (issue #16), appended behind TANDEM_PARALLEL_PARAM_BUCKETS.
static_assert(offsetof(tandem_parallel_params_t, first_bucket_mb) == 176);
static_assert(offsetof(tandem_parallel_params_t, bucket_sizes_mb) == 184);
static_assert(offsetof(tandem_parallel_params_t, num_bucket_sizes) == 192);
// ps-async's staleness-scaled rate (issue #13), appended behind TANDEM_PARALLEL_PARAM_STALENESS_LR.
static_assert(offsetof(tandem_parallel_params_t, staleness_lr) == 200);
static_assert(sizeof(tandem_parallel_params_t) == 208);
static_assert(TANDEM_PARALLEL_PARAM_STALENESS_LR == (UINT64_C(1) << 19) && sizeof(tandem_staleness_lr_t) == 4);
static_assert(offsetof(tandem_parallel_attr_t, max_bubble_fraction) == 144);
static_assert(offsetof(tandem_parallel_attr_t, workers) == 152);
static_assert(offsetof(tandem_parallel_attr_t, warmup_steps) == 220);
static_assert(offsetof(tandem_parallel_attr_t, elastic) == 224);
static_assert(offsetof(tandem_parallel_attr_t, lr_scale) == 240);
static_assert(offsetof(tandem_parallel_attr_t, server_replicas) == 248);
static_assert(offsetof(tandem_parallel_attr_t, shards) == 252);
// ps-async's staleness rule as run (issue #13), appended behind TANDEM_PARALLEL_ATTR_ASYNC.
static_assert(offsetof(tandem_parallel_attr_t, staleness_lr) == 256);
static_assert(sizeof(tandem_parallel_attr_t) == 264);
static_assert(TANDEM_PARALLEL_ATTR_ASYNC == (UINT64_C(1) << 6));
static_assert(TANDEM_PARALLEL_PARAM_SERVERS == (UINT64_C(1) << 10) && TANDEM_PARALLEL_PARAM_LOCALSGD == (UINT64_C(1) << 14) &&
              TANDEM_PARALLEL_PARAM_ELASTIC == (UINT64_C(1) << 15));
static_assert(TANDEM_PARALLEL_ATTR_SYNC == (UINT64_C(1) << 3));

BOOST_AUTO_TEST_SUITE(abi_guards)

BOOST_AUTO_TEST_CASE(every_exported_symbol_starts_with_tandem) {
  const std::string cmd = std::string("nm -D --defined-only ") + TANDEM_LIB_PATH;
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_TEST_REQUIRE(p != nullptr);
  char line[4096];
  int exported = 0;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    const auto sp = s.rfind(' ');
    const std::string type = s.substr(sp - 1, 1);
    const std::string name = s.substr(sp + 1);
    if (type != "T" && type != "D" && type != "B" && type != "W" && type != "V" && type != "R") continue;
    if (name.rfind("_init", 0) == 0 || name.rfind("_fini", 0) == 0) continue;
    ++exported;
    BOOST_TEST(name.rfind("tandem_", 0) == 0, "exported symbol without tandem_ prefix: " << name);
  }
  pclose(p);
  BOOST_TEST(exported > 5);
}

BOOST_AUTO_TEST_CASE(wrong_major_version_is_refused) {
  tandem_context_t* ctx = nullptr;
  BOOST_TEST(tandem_context_create_v((TANDEM_VERSION_MAJOR + 1) * 10000, nullptr, &ctx) == TANDEM_ERR_UNSUPPORTED);
  BOOST_TEST(ctx == nullptr);
  BOOST_TEST(std::string(tandem_last_error_message()).find("newer") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(create_with_only_known_bits_succeeds) {
  tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
  p.field_mask = TANDEM_CONTEXT_PARAM_NUM_THREADS;
  p.num_threads = 1;
  tandem_context_t* ctx = nullptr;
  BOOST_TEST(tandem_context_create(&p, &ctx) == TANDEM_OK);
  tandem_context_destroy(ctx);
  p.num_threads = -3;
  BOOST_TEST(tandem_context_create(&p, &ctx) == TANDEM_ERR_INVALID_ARGUMENT);
  BOOST_TEST(std::string(tandem_last_error_message()).find("num_threads") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
