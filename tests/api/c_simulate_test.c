/* The simulation section of the C ABI, compiled as C99: clusters, a job, simulate, results, a
 * resize for sweeps, a plan search, a trace, and errors that name what was wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tandem/tandem.h>

#ifdef __cplusplus
#error "compile this file as C"
#endif

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, " (last error: %s)\n", tandem_last_error_message()); \
      return 1;                                           \
    }                                                     \
  } while (0)

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_sim_cluster_t* cluster = NULL;
  tandem_sim_cluster_t* bigger = NULL;
  tandem_sim_result_t* result = NULL;
  tandem_sim_result_t* plan = NULL;
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_sim_summary_t sum = TANDEM_SIM_SUMMARY_INIT;
  int32_t nodes = 0, devices = 0;
  size_t bytes = 0;
  char small[16];
  char* json = NULL;
  FILE* f = NULL;
  const char* trace_path = "/tmp/tandem_c_simulate_trace.json";

  CHECK(tandem_context_create(NULL, &ctx) == TANDEM_OK, "context");
  CHECK(tandem_sim_cluster_create(ctx, "t2.micro:4", &cluster) == TANDEM_OK, "cluster");
  CHECK(tandem_sim_cluster_info(cluster, &nodes, &devices) == TANDEM_OK && nodes == 4 && devices == 4,
        "info: %d nodes %d devices", nodes, devices);

  /* the seed paper's four-node case */
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_EPOCHS |
                   TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_EPOCH_TIME | TANDEM_SIM_JOB_TRACE;
  job.model = "mobilenetv2";
  job.dataset = "cifar10";
  job.batch = 256;
  job.epochs = 10;
  job.strategy = "ddp";
  job.epoch_time_s = 252.5;
  job.trace = 1;
  CHECK(tandem_simulate(cluster, &job, &result) == TANDEM_OK, "simulate");
  sum.field_mask = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SCALING | TANDEM_SIM_SUMMARY_SPLIT |
                   TANDEM_SIM_SUMMARY_MEMORY | TANDEM_SIM_SUMMARY_COST | TANDEM_SIM_SUMMARY_LAYOUT;
  CHECK(tandem_sim_result_query(result, &sum) == TANDEM_OK, "query");
  CHECK(sum.dp == 4 && sum.pp == 1 && sum.ranks == 4, "layout %d x %d", sum.dp, sum.pp);
  CHECK(sum.speedup > 4.0, "super-linear speedup expected, got %f", sum.speedup);
  CHECK(fabs(sum.compute_s + sum.comm_exposed_s + sum.bubble_s + sum.throttled_s + sum.idle_s - sum.total_time_s) <
            1e-6 * sum.total_time_s,
        "time split does not add up");
  CHECK(sum.cost_usd > 0 && sum.epoch_time_s * 10 == sum.total_time_s, "cost/epochs");

  /* JSON: size query, truncation, full text */
  CHECK(tandem_sim_result_json(result, NULL, &bytes) == TANDEM_OK && bytes > 100, "json size %zu", bytes);
  json = (char*)malloc(bytes);
  CHECK(json != NULL, "malloc");
  CHECK(tandem_sim_result_json(result, json, &bytes) == TANDEM_OK, "json");
  CHECK(strstr(json, "\"step_time_s\"") && strstr(json, "\"comm_exposed_s\"") && strstr(json, "\"fits\""),
        "json lacks fields: %.200s", json);
  bytes = sizeof small;
  CHECK(tandem_sim_result_json(result, small, &bytes) == TANDEM_OK && strlen(small) == sizeof small - 1 &&
            bytes > sizeof small,
        "truncation");
  free(json);

  /* trace */
  remove(trace_path);
  CHECK(tandem_sim_result_write_trace(result, trace_path) == TANDEM_OK, "trace");
  f = fopen(trace_path, "r");
  CHECK(f != NULL, "trace file missing");
  fclose(f);
  remove(trace_path);

  /* sweeps resize the cluster */
  CHECK(tandem_sim_cluster_resize(cluster, 8, &bigger) == TANDEM_OK, "resize");
  CHECK(tandem_sim_cluster_info(bigger, &nodes, NULL) == TANDEM_OK && nodes == 8, "resized to %d", nodes);

  /* plan search on the small model */
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH;
  job.model = "lenet5";
  job.dataset = "fashion-mnist";
  job.batch = 64;
  CHECK(tandem_sim_plan(cluster, &job, 3, &plan) == TANDEM_OK, "plan");
  sum.field_mask = TANDEM_SIM_SUMMARY_LAYOUT | TANDEM_SIM_SUMMARY_TIMES;
  CHECK(tandem_sim_result_query(plan, &sum) == TANDEM_OK && sum.dp * sum.pp == 4, "plan layout");

  /* errors name what was wrong and leave outputs alone */
  {
    tandem_sim_cluster_t* bad = NULL;
    tandem_sim_result_t* none = NULL;
    CHECK(tandem_sim_cluster_create(ctx, "{\"nodes\": [{\"preset\": \"t2.micro\", \"nic_mbps\": \"fast\"}]}", &bad) ==
                  TANDEM_ERR_INVALID_ARGUMENT &&
              bad == NULL && strstr(tandem_last_error_message(), "nodes[0].nic_mbps") != NULL,
          "bad cluster");
    job.field_mask = TANDEM_SIM_JOB_MICRO_BATCHES;
    job.micro_batches = -2;
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_INVALID_ARGUMENT && none == NULL &&
              strstr(tandem_last_error_message(), "micro_batches") != NULL,
          "bad job");
    job.field_mask = UINT64_C(1) << 40;
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_UNSUPPORTED, "unknown bit");
    sum.field_mask = UINT64_C(1) << 30;
    CHECK(tandem_sim_result_query(result, &sum) == TANDEM_ERR_UNSUPPORTED, "unknown summary bit");
    CHECK(tandem_sim_result_write_trace(plan, trace_path) == TANDEM_ERR_INVALID_ARGUMENT, "trace without asking");
  }

  tandem_sim_result_destroy(plan);
  tandem_sim_result_destroy(result);
  tandem_sim_cluster_destroy(bigger);
  tandem_sim_cluster_destroy(cluster);
  tandem_sim_result_destroy(NULL);
  tandem_sim_cluster_destroy(NULL);
  tandem_context_destroy(ctx);
  printf("c_simulate_test: ok\n");
  return 0;
}
