/* The simulation summary's versioned calls, compiled as C99: tandem_sim_result_query_v and _candidate_v are told the
 * caller's sizeof(tandem_sim_summary_t), so a caller built against an older, shorter struct gets the fields it knows
 * and nothing past its struct is written (guard bytes around it stay as they were); a caller of this header gets the
 * 0.5 field memory_data_bytes; the 0.4 calls fill 0.4's struct only. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <tandem/tandem.h>

#ifdef __cplusplus
#error "compile this file as C"
#endif

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);                \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, " (last error: %s)\n", tandem_last_error_message()); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

enum { kGuard = 0xA5, kSlack = 64 };

/* A summary with guard bytes behind it: the struct as a caller of any size lays it out, then kSlack more. */
typedef union {
  tandem_sim_summary_t s;
  unsigned char bytes[sizeof(tandem_sim_summary_t) + kSlack];
} guarded_summary_t;

static void fill_guard(guarded_summary_t* g, uint64_t mask) {
  memset(g->bytes, kGuard, sizeof(g->bytes));
  g->s.field_mask = mask;
}

/* The first byte at or past `from` that is no longer the guard pattern, or -1. */
static long first_written(const guarded_summary_t* g, size_t from) {
  size_t i;
  for (i = from; i < sizeof(g->bytes); ++i)
    if (g->bytes[i] != kGuard) return (long)i;
  return -1;
}

/* 0.4's struct ends with memory_advice; this header appends memory_data_bytes. */
static const size_t kOld = offsetof(tandem_sim_summary_t, memory_data_bytes);
/* 0.1's struct: up to ranks (0.2 appended baseline_total_time_s). */
static const size_t kOldest = offsetof(tandem_sim_summary_t, baseline_total_time_s);
/* what the 0.4 bits ask for: TIMES .. MEMORY_DETAIL */
static const uint64_t kOldBits = (TANDEM_SIM_SUMMARY_MEMORY_DETAIL << 1) - 1;

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_sim_cluster_t* cluster = NULL;
  tandem_sim_result_t* r = NULL;
  tandem_sim_result_t* plan = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* lenet = NULL;
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  guarded_summary_t g, h;
  /* fashion-mnist as a rank loads it: 60,000 training and 10,000 test images, 1 byte a value and a 4-byte label */
  const double data_bytes = (60000.0 + 10000.0) * (28 * 28 + 4);
  long w;

  CHECK(kOld == sizeof(tandem_sim_summary_t) - sizeof(double), "memory_data_bytes is the last field");
  CHECK(tandem_context_create(NULL, &ctx) == TANDEM_OK, "context");
  CHECK(tandem_sim_cluster_create(ctx, "c5.large:2", &cluster) == TANDEM_OK, "cluster");
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "lenet5";
  mp.backend = "none";
  CHECK(tandem_model_create(ctx, &mp, &lenet) == TANDEM_OK, "lenet5 spec");
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_STRATEGY;
  job.model = lenet;
  job.dataset = "fashion-mnist";
  job.batch = 64;
  job.strategy = TANDEM_STRATEGY_DDP;
  CHECK(tandem_simulate(cluster, &job, &r) == TANDEM_OK, "simulate");

  /* a caller built against 0.4 (the old call): every 0.4 group filled, nothing at or past its struct's end written */
  fill_guard(&g, kOldBits);
  CHECK(tandem_sim_result_query(r, &g.s) == TANDEM_OK, "0.4 query");
  CHECK(g.s.step_time_s > 0 && g.s.dp == 2 && g.s.num_nodes == 2 && g.s.strategy == TANDEM_STRATEGY_DDP &&
            strcmp(g.s.model, "lenet5") == 0 && g.s.workers == 2 && g.s.memory_runtime_bytes > data_bytes &&
            g.s.memory_advice != NULL && g.s.fits == 1,
        "0.4 fields: step %g dp %d nodes %d workers %d runtime %g", g.s.step_time_s, g.s.dp, g.s.num_nodes,
        g.s.workers, g.s.memory_runtime_bytes);
  w = first_written(&g, kOld);
  CHECK(w < 0, "the 0.4 call wrote byte %ld, past 0.4's %zu-byte struct", w, kOld);
  /* the same through the _v call told 0.4's size */
  fill_guard(&h, kOldBits);
  CHECK(tandem_sim_result_query_v(kOld, r, &h.s) == TANDEM_OK, "_v at 0.4's size");
  CHECK(memcmp(g.bytes, h.bytes, sizeof(g.bytes)) == 0, "_v at 0.4's size differs from the 0.4 call");
  /* and the 0.4 call cannot be asked for the new group: refused, nothing written */
  fill_guard(&g, TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_MEMORY_DATA);
  CHECK(tandem_sim_result_query(r, &g.s) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "MEMORY_DATA") != NULL,
        "the 0.4 call must refuse MEMORY_DATA naming it");
  w = first_written(&g, sizeof(g.s.field_mask));
  CHECK(w < 0, "a refused query wrote byte %ld", w);

  /* a caller built against 0.1 (up to ranks): its groups filled, nothing past them; a 0.2 group is refused */
  fill_guard(&g, TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SPLIT | TANDEM_SIM_SUMMARY_MEMORY);
  CHECK(tandem_sim_result_query_v(kOldest, r, &g.s) == TANDEM_OK, "_v at 0.1's size");
  CHECK(g.s.step_time_s > 0 && g.s.compute_s > 0 && g.s.fits == 1, "0.1 fields");
  w = first_written(&g, offsetof(tandem_sim_summary_t, cost_usd));  /* COST was not asked for */
  CHECK(w < 0, "_v at 0.1's size wrote byte %ld", w);
  fill_guard(&g, TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SCALING);
  CHECK(tandem_sim_result_query_v(kOldest, r, &g.s) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "SCALING") != NULL,
        "SCALING lies past 0.1's struct (baseline_total_time_s): refused naming it");
  w = first_written(&g, sizeof(g.s.field_mask));
  CHECK(w < 0, "a refused query wrote byte %ld", w);

  /* a caller of this header: the new field, and nothing past its struct */
  fill_guard(&g, TANDEM_SIM_SUMMARY_MEMORY_DETAIL | TANDEM_SIM_SUMMARY_MEMORY_DATA);
  CHECK(tandem_sim_result_query_v(sizeof(tandem_sim_summary_t), r, &g.s) == TANDEM_OK, "_v");
  CHECK(g.s.memory_data_bytes == data_bytes, "memory_data_bytes %.0f, expected %.0f", g.s.memory_data_bytes,
        data_bytes);
  CHECK(g.s.memory_runtime_bytes > g.s.memory_data_bytes, "runtime %g includes the data %g",
        g.s.memory_runtime_bytes, g.s.memory_data_bytes);
  w = first_written(&g, sizeof(tandem_sim_summary_t));
  CHECK(w < 0, "_v wrote byte %ld past the struct", w);
  /* TIMES was not asked for: left as it was */
  CHECK(first_written(&g, offsetof(tandem_sim_summary_t, step_time_s)) ==
            (long)offsetof(tandem_sim_summary_t, memory_node),
        "only the groups asked for are written");
  /* a newer header's larger struct: accepted, its tail untouched */
  fill_guard(&h, TANDEM_SIM_SUMMARY_MEMORY_DATA);
  CHECK(tandem_sim_result_query_v(sizeof(h.bytes), r, &h.s) == TANDEM_OK && h.s.memory_data_bytes == data_bytes,
        "a larger size");
  CHECK(first_written(&h, sizeof(tandem_sim_summary_t)) < 0, "a larger struct's unknown tail was written");
  /* FedAvg's client subsets are one more copy of the training set */
  {
    tandem_sim_result_t* fed = NULL;
    tandem_sim_summary_t s = TANDEM_SIM_SUMMARY_INIT;
    job.field_mask |= TANDEM_SIM_JOB_CLIENTS;
    job.strategy = TANDEM_STRATEGY_FEDAVG;
    job.clients = 8;
    CHECK(tandem_simulate(cluster, &job, &fed) == TANDEM_OK, "fedavg");
    s.field_mask = TANDEM_SIM_SUMMARY_MEMORY_DATA;
    CHECK(tandem_sim_result_query_v(sizeof s, fed, &s) == TANDEM_OK &&
              s.memory_data_bytes == data_bytes + 60000.0 * (28 * 28 + 4),
          "fedavg data %.0f", s.memory_data_bytes);
    tandem_sim_result_destroy(fed);
  }

  /* bad calls */
  fill_guard(&g, UINT64_C(1) << 12);
  CHECK(tandem_sim_result_query_v(sizeof(tandem_sim_summary_t), r, &g.s) == TANDEM_ERR_UNSUPPORTED,
        "unknown bit");
  fill_guard(&g, 0);
  CHECK(tandem_sim_result_query_v(4, r, &g.s) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "summary_size 4") != NULL,
        "a size below field_mask");
  CHECK(tandem_sim_result_query_v(sizeof(tandem_sim_summary_t), r, NULL) == TANDEM_ERR_INVALID_ARGUMENT, "NULL");
  CHECK(tandem_sim_result_query_v(sizeof(tandem_sim_summary_t), NULL, &g.s) == TANDEM_ERR_INVALID_ARGUMENT,
        "NULL result");

  /* a plan search's candidates, the same way */
  CHECK(tandem_sim_plan(cluster, &job, 2, &plan) == TANDEM_OK, "plan");
  fill_guard(&g, kOldBits & ~TANDEM_SIM_SUMMARY_SEARCH);
  CHECK(tandem_sim_result_candidate(plan, 1, &g.s) == TANDEM_OK && g.s.step_time_s > 0, "0.4 candidate");
  w = first_written(&g, kOld);
  CHECK(w < 0, "the 0.4 candidate call wrote byte %ld, past 0.4's struct", w);
  fill_guard(&h, kOldBits & ~TANDEM_SIM_SUMMARY_SEARCH);
  CHECK(tandem_sim_result_candidate_v(kOld, plan, 1, &h.s) == TANDEM_OK, "_v candidate at 0.4's size");
  CHECK(memcmp(g.bytes, h.bytes, sizeof(g.bytes)) == 0, "_v candidate at 0.4's size differs from the 0.4 call");
  fill_guard(&g, TANDEM_SIM_SUMMARY_MEMORY_DATA);
  CHECK(tandem_sim_result_candidate(plan, 0, &g.s) == TANDEM_ERR_INVALID_ARGUMENT, "0.4 candidate: MEMORY_DATA");
  CHECK(tandem_sim_result_candidate_v(sizeof(tandem_sim_summary_t), plan, 0, &g.s) == TANDEM_OK &&
            g.s.memory_data_bytes > 0,
        "candidate memory_data_bytes %g", g.s.memory_data_bytes);
  CHECK(first_written(&g, sizeof(tandem_sim_summary_t)) < 0, "_v candidate wrote past the struct");
  CHECK(tandem_sim_result_candidate_v(sizeof(tandem_sim_summary_t), plan, 2, &g.s) == TANDEM_ERR_INVALID_ARGUMENT,
        "candidate range");
  CHECK(tandem_sim_result_candidate_v(sizeof(tandem_sim_summary_t), r, 0, &g.s) == TANDEM_ERR_INVALID_ARGUMENT,
        "not a plan");

  tandem_sim_result_destroy(plan);
  tandem_sim_result_destroy(r);
  tandem_model_destroy(lenet);
  tandem_sim_cluster_destroy(cluster);
  tandem_context_destroy(ctx);
  printf("c_sim_summary_test: ok\n");
  return 0;
}
