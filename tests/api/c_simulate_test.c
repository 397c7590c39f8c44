/* The simulation section of the C ABI, compiled as C99: clusters, a typed job (the header's enums, a model
 * handle, an optimizer handle), simulate, typed results (summary groups, nodes, stage cut; JSON only as an
 * extra), a resize for sweeps, a plan search and its candidates, a trace, and errors that name what was wrong. */
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

/* LeNet-5 on Fashion-MNIST at batch 32 with `strategy`, no baseline: the small jobs of the strategy checks. */
static void lenet_job(tandem_sim_job_params_t* f, tandem_model_t* lenet, tandem_strategy_t strategy) {
  f->field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_STRATEGY |
                  TANDEM_SIM_JOB_BASELINE;
  f->model = lenet;
  f->dataset = "fashion-mnist";
  f->batch = 32;
  f->strategy = strategy;
  f->baseline = 0;
}

/* The simulated step time of job `f` on `cluster`, or -1 (the error printed) when the simulation or its query fails. */
static double step_time_of(tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* f) {
  tandem_sim_result_t* r = NULL;
  tandem_sim_summary_t q = TANDEM_SIM_SUMMARY_INIT;
  double step = -1;
  q.field_mask = TANDEM_SIM_SUMMARY_TIMES;
  if (tandem_simulate(cluster, f, &r) == TANDEM_OK && tandem_sim_result_query(r, &q) == TANDEM_OK)
    step = q.step_time_s;
  else
    fprintf(stderr, "step_time_of: %s\n", tandem_last_error_message());
  tandem_sim_result_destroy(r);
  return step;
}

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_sim_cluster_t* cluster = NULL;
  tandem_sim_cluster_t* bigger = NULL;
  tandem_sim_result_t* result = NULL;
  tandem_sim_result_t* plan = NULL;
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* mobilenet = NULL;
  tandem_model_t* lenet = NULL;
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  tandem_optimizer_t* adam = NULL;
  tandem_sim_node_t node = TANDEM_SIM_NODE_INIT;
  int32_t cut[8];
  size_t ncut = 0;
  int64_t samples = 0, channels = 0, height = 0, width = 0, classes = 0;
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

  /* models are handles: the "none" backend holds the spec alone, shaped for the dataset */
  CHECK(tandem_sim_dataset_info("cifar10", &samples, &channels, &height, &width, &classes) == TANDEM_OK &&
            samples == 50000 && channels == 3 && height == 32 && width == 32 && classes == 10,
        "cifar10 info");
  CHECK(tandem_sim_dataset_info("svhn", NULL, NULL, NULL, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "fashion-mnist") != NULL,
        "unknown dataset lists the known ones");
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "mobilenetv2";
  mp.backend = "none";
  CHECK(tandem_model_create(ctx, &mp, &mobilenet) == TANDEM_OK, "mobilenetv2 spec");
  mp.name = "lenet5";
  CHECK(tandem_model_create(ctx, &mp, &lenet) == TANDEM_OK, "lenet5 spec");

  /* the seed paper's four-node case */
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_EPOCHS |
                   TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_EPOCH_TIME | TANDEM_SIM_JOB_TRACE;
  job.model = mobilenet;
  job.dataset = "cifar10";
  job.batch = 256;
  job.epochs = 10;
  job.strategy = TANDEM_STRATEGY_DDP;
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
  CHECK(sum.cost_usd > 0 && fabs(sum.epoch_time_s * 10 - sum.total_time_s) < 1e-12 * sum.total_time_s, "cost/epochs");
  CHECK(sum.baseline_total_time_s > sum.total_time_s && sum.nodes_used == 4 && sum.num_nodes == 4, "0.2 fields");

  /* typed results: the job as compiled and timed, names, nodes, the cut -- no JSON to parse */
  sum.field_mask = TANDEM_SIM_SUMMARY_JOB | TANDEM_SIM_SUMMARY_NAMES;
  CHECK(tandem_sim_result_query(result, &sum) == TANDEM_OK, "query job");
  CHECK(sum.strategy == TANDEM_STRATEGY_DDP && sum.schedule == TANDEM_SCHEDULE_1F1B &&
            sum.compression == TANDEM_COMPRESSION_NONE && sum.batch == 256 && sum.global_batch == 1024 &&
            sum.samples == 50000 && sum.epochs == 10 && sum.num_stages == 1,
        "job fields");
  CHECK(sum.algorithm != TANDEM_ALGO_AUTO, "the all-reduce as resolved, got %d", (int)sum.algorithm);
  CHECK(sum.bottleneck != NULL && strlen(sum.bottleneck) > 0 && sum.scaling_note != NULL &&
            strstr(sum.scaling_note, "super-linear") != NULL,
        "bottleneck '%s', note '%s'", sum.bottleneck, sum.scaling_note);
  CHECK(strcmp(sum.model, "mobilenetv2") == 0 && strstr(sum.cluster, "t2.micro") != NULL &&
            strcmp(sum.dataset, "cifar10") == 0 && strstr(sum.allreduce, "world=4") != NULL &&
            strcmp(sum.compute_source, "roofline") == 0,
        "names: %s %s %s %s", sum.model, sum.cluster, sum.dataset, sum.allreduce);
  node.field_mask = TANDEM_SIM_NODE_MEMORY | TANDEM_SIM_NODE_CREDITS;
  CHECK(tandem_sim_result_node(result, 3, &node) == TANDEM_OK && node.ranks == 1 && node.memory_bytes > 0 &&
            node.memory_capacity_bytes > 0 && strcmp(node.preset, "t2.micro") == 0 && node.credits_start > 0,
        "node 3");
  CHECK(tandem_sim_result_node(result, 4, &node) == TANDEM_ERR_INVALID_ARGUMENT, "node out of range");
  ncut = sizeof cut / sizeof cut[0];
  CHECK(tandem_sim_result_stage_cut(result, cut, &ncut) == TANDEM_OK && ncut == 2 && cut[0] == 0 && cut[1] > 100,
        "cut of one stage");

  /* compression on the wire is a typed job field: fp16 sends half the bytes */
  {
    tandem_sim_result_t* f16 = NULL;
    tandem_sim_job_params_t j16 = job;
    tandem_sim_summary_t a = TANDEM_SIM_SUMMARY_INIT, b = TANDEM_SIM_SUMMARY_INIT;
    j16.field_mask = (job.field_mask & ~TANDEM_SIM_JOB_TRACE) | TANDEM_SIM_JOB_COMPRESSION;
    j16.compression = TANDEM_COMPRESSION_FP16;
    CHECK(tandem_simulate(cluster, &j16, &f16) == TANDEM_OK, "fp16");
    a.field_mask = b.field_mask = TANDEM_SIM_SUMMARY_SPLIT | TANDEM_SIM_SUMMARY_JOB;
    CHECK(tandem_sim_result_query(result, &a) == TANDEM_OK && tandem_sim_result_query(f16, &b) == TANDEM_OK, "q");
    CHECK(b.compression == TANDEM_COMPRESSION_FP16 && b.comm_exposed_s < a.comm_exposed_s,
          "fp16 exposed comm %f vs %f", b.comm_exposed_s, a.comm_exposed_s);
    tandem_sim_result_destroy(f16);
  }

  /* the run's seed is a typed job field: it cuts FedAvg's Dirichlet shares as the trainer does, so another seed
     times other client sizes (a round waits for its largest client), and seed 0 is the default */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r[3] = {NULL, NULL, NULL};
    double round_s[3];
    lenet_job(&f, lenet, TANDEM_STRATEGY_FEDAVG);
    f.field_mask |= TANDEM_SIM_JOB_DIRICHLET_ALPHA;
    f.dirichlet_alpha = 0.5;
    for (int k = 0; k < 3; ++k) {
      tandem_sim_summary_t q = TANDEM_SIM_SUMMARY_INIT;
      if (k > 0) f.field_mask |= TANDEM_SIM_JOB_SEED;
      f.seed = (uint64_t)(k - 1 > 0 ? 1 : 0); /* default, explicit 0, 1 */
      CHECK(tandem_simulate(cluster, &f, &r[k]) == TANDEM_OK, "fedavg seed case %d: %s", k, tandem_last_error_message());
      q.field_mask = TANDEM_SIM_SUMMARY_TIMES;
      CHECK(tandem_sim_result_query(r[k], &q) == TANDEM_OK && q.step_time_s > 0, "fedavg round %d", k);
      round_s[k] = q.step_time_s;
      tandem_sim_result_destroy(r[k]);
    }
    CHECK(round_s[0] == round_s[1], "seed 0 is the default: %f vs %f", round_s[0], round_s[1]);
    CHECK(round_s[2] != round_s[1], "seed 1 cuts other shares: %f vs %f", round_s[2], round_s[1]);
  }

  /* the run's --limit-batches is a typed job field: a FedAvg client's local epoch stops after that many batches
     (a shorter round), a DDP epoch too (fewer steps per epoch, the same step); a negative count is refused by name */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r[2] = {NULL, NULL};
    tandem_sim_summary_t q[2] = {TANDEM_SIM_SUMMARY_INIT, TANDEM_SIM_SUMMARY_INIT};
    int k;
    for (int s = 0; s < 2; ++s) {
      lenet_job(&f, lenet, s == 0 ? TANDEM_STRATEGY_FEDAVG : TANDEM_STRATEGY_DDP);
      for (k = 0; k < 2; ++k) {
        f.field_mask = k == 0 ? f.field_mask & ~TANDEM_SIM_JOB_LIMIT_BATCHES : f.field_mask | TANDEM_SIM_JOB_LIMIT_BATCHES;
        f.limit_batches = 50;
        CHECK(tandem_simulate(cluster, &f, &r[k]) == TANDEM_OK, "limit_batches case %d/%d: %s", s, k,
              tandem_last_error_message());
        q[k].field_mask = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_JOB;
        CHECK(tandem_sim_result_query(r[k], &q[k]) == TANDEM_OK && q[k].step_time_s > 0, "limit_batches query %d", k);
        tandem_sim_result_destroy(r[k]);
      }
      if (s == 0) {
        /* 60,000 / 4 clients / 32 = 469 batches a client: capped at 50, the round is far shorter */
        CHECK(q[1].step_time_s < 0.2 * q[0].step_time_s, "fedavg round with 50 batches %f vs %f", q[1].step_time_s,
              q[0].step_time_s);
      } else {
        CHECK(q[1].steps_per_epoch == 50 && q[0].steps_per_epoch == 469 && q[1].step_time_s == q[0].step_time_s,
              "ddp: %lld vs %lld steps per epoch", (long long)q[1].steps_per_epoch, (long long)q[0].steps_per_epoch);
      }
    }
    f.limit_batches = -1;
    CHECK(tandem_simulate(cluster, &f, &r[0]) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "limit_batches") != NULL,
          "negative limit_batches: %s", tandem_last_error_message());
  }

  /* PyTorch DDP's buffer broadcast is a typed job field: mobilenetv2 (BatchNorm buffers) under pytorch-ddp on
     t2.micro links takes longer per step with it (unset = 1, DDP's default) than with 0; lenet5 has no buffers and
     is unchanged; a value other than 0 or 1 is refused by name */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r = NULL;
    double step[2][3];
    int m, k;
    for (m = 0; m < 2; ++m) {
      for (k = 0; k < 3; ++k) { /* unset, 1, 0 */
        tandem_sim_summary_t q = TANDEM_SIM_SUMMARY_INIT;
        lenet_job(&f, m == 0 ? mobilenet : lenet, TANDEM_STRATEGY_DDP);
        if (m == 0) f.dataset = "cifar10"; /* the spec above is shaped for it */
        f.field_mask |= TANDEM_SIM_JOB_FRAMEWORK | (k > 0 ? TANDEM_SIM_JOB_BROADCAST_BUFFERS : 0);
        f.framework = TANDEM_FRAMEWORK_PYTORCH_DDP;
        f.broadcast_buffers = k == 1 ? 1 : 0;
        CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_OK, "broadcast_buffers %d/%d", m, k);
        q.field_mask = TANDEM_SIM_SUMMARY_TIMES;
        CHECK(tandem_sim_result_query(r, &q) == TANDEM_OK && q.step_time_s > 0, "broadcast_buffers query %d/%d", m, k);
        step[m][k] = q.step_time_s;
        tandem_sim_result_destroy(r);
        r = NULL;
      }
    }
    CHECK(step[0][0] == step[0][1] && step[0][2] < step[0][0], "mobilenetv2: unset %f, 1 %f, 0 %f", step[0][0],
          step[0][1], step[0][2]);
    CHECK(step[1][0] == step[1][2], "lenet5 has no buffers: %f vs %f", step[1][0], step[1][2]);
    f.broadcast_buffers = 2;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "broadcast_buffers") != NULL,
          "broadcast_buffers 2: %s", tandem_last_error_message());
  }

  /* The bucket policy is a typed job field (BUCKETS): PyTorch DDP's 1 MiB first bucket is the framework's default and
     nothing else -- Tandem's own job with first_bucket_mb 1, or with the explicit sizes {1}, is timed as pytorch-ddp's
     (mobilenetv2's BatchNorm buffers broadcast off, so the two frameworks differ in their buckets alone), and
     pytorch-ddp with first_bucket_mb 0 as Tandem's own; many small explicit buckets change the step; bad fields are
     refused by name */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r = NULL;
    const double one[1] = {1.0}, small[4] = {0.05, 0.05, 0.05, 0.05}, bad[2] = {0.5, -1.0};
    double step[6];
    int k;
    for (k = 0; k < 6; ++k) {
      tandem_sim_summary_t q = TANDEM_SIM_SUMMARY_INIT;
      lenet_job(&f, mobilenet, TANDEM_STRATEGY_DDP);
      f.dataset = "cifar10";
      f.field_mask |= TANDEM_SIM_JOB_FRAMEWORK | TANDEM_SIM_JOB_BROADCAST_BUFFERS;
      f.broadcast_buffers = 0;
      /* 0 pytorch-ddp unset, 1 tandem first 1, 2 tandem sizes {1}, 3 tandem unset, 4 pytorch-ddp first 0,
         5 tandem four 0.05 MiB buckets first */
      f.framework = k == 0 || k == 4 ? TANDEM_FRAMEWORK_PYTORCH_DDP : TANDEM_FRAMEWORK_TANDEM;
      if (k == 1 || k == 2 || k == 4 || k == 5) f.field_mask |= TANDEM_SIM_JOB_BUCKETS;
      f.first_bucket_mb = k == 1 ? 1.0 : 0.0;
      f.bucket_sizes_mb = k == 2 ? one : k == 5 ? small : NULL;
      f.num_bucket_sizes = k == 2 ? 1 : k == 5 ? 4 : 0;
      CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_OK, "buckets %d: %s", k, tandem_last_error_message());
      q.field_mask = TANDEM_SIM_SUMMARY_TIMES;
      CHECK(tandem_sim_result_query(r, &q) == TANDEM_OK && q.step_time_s > 0, "buckets query %d", k);
      step[k] = q.step_time_s;
      tandem_sim_result_destroy(r);
      r = NULL;
    }
    CHECK(step[0] == step[1] && step[1] == step[2], "a 1 MiB first bucket: pytorch-ddp %.9f, first %.9f, sizes %.9f",
          step[0], step[1], step[2]);
    CHECK(step[3] == step[4] && step[3] != step[0], "no first bucket: tandem %.9f, pytorch-ddp first 0 %.9f (1 MiB: "
          "%.9f)", step[3], step[4], step[0]);
    CHECK(step[5] != step[3], "four 0.05 MiB buckets first %.9f vs one 25 MiB %.9f", step[5], step[3]);
    f.framework = TANDEM_FRAMEWORK_TANDEM;
    f.first_bucket_mb = 1.0;
    f.bucket_sizes_mb = one;
    f.num_bucket_sizes = 1;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "not both") != NULL,
          "first bucket and sizes: %s", tandem_last_error_message());
    f.first_bucket_mb = 0;
    f.bucket_sizes_mb = NULL;
    f.num_bucket_sizes = 2;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "bucket_sizes_mb") != NULL,
          "NULL sizes: %s", tandem_last_error_message());
    f.bucket_sizes_mb = bad;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "bucket size 1") != NULL,
          "a negative size: %s", tandem_last_error_message());
    CHECK(r == NULL, "no result on errors");
  }

  /* A framework's collective cycle (COMM_CYCLE): Horovod's 5 ms loop makes ready buckets wait for its next tick, so
     a data-parallel step takes longer than with none (0, also the unset default); a negative cycle is refused by
     name */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r = NULL;
    double step[3];
    int k;
    for (k = 0; k < 3; ++k) {
      lenet_job(&f, mobilenet, TANDEM_STRATEGY_DDP);
      f.dataset = "cifar10";
      if (k > 0) f.field_mask |= TANDEM_SIM_JOB_COMM_CYCLE;
      f.comm_cycle_ms = k == 2 ? 5.0 : 0.0;
      step[k] = step_time_of(cluster, &f);
      CHECK(step[k] > 0, "cycle %d", k);
    }
    CHECK(step[0] == step[1], "no cycle: unset %.9f, 0 ms %.9f", step[0], step[1]);
    CHECK(step[2] > step[0], "a 5 ms cycle %.9f is not longer than none %.9f", step[2], step[0]);
    f.comm_cycle_ms = -1.0;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "comm_cycle_ms") != NULL,
          "a negative cycle: %s", tandem_last_error_message());
    CHECK(r == NULL, "no result on errors");
  }

  /* A cycle's negotiation (COMM_NEGOTIATION) and host staging (HOST_STAGING): each lengthens a DDP step of the same
     job; unset equals 0; a negotiation without a cycle and a negative staging rate are refused by name */
  {
    tandem_sim_job_params_t f = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r = NULL;
    double step[5];
    int k;
    for (k = 0; k < 5; ++k) {
      lenet_job(&f, mobilenet, TANDEM_STRATEGY_DDP);
      f.dataset = "cifar10";
      f.field_mask |= TANDEM_SIM_JOB_COMM_CYCLE;
      f.comm_cycle_ms = 5.0;
      if (k == 1 || k == 2) f.field_mask |= TANDEM_SIM_JOB_COMM_NEGOTIATION;
      f.comm_negotiation_ms = k == 2 ? 2.0 : 0.0;
      if (k == 3 || k == 4) f.field_mask |= TANDEM_SIM_JOB_HOST_STAGING;
      f.host_staging_gbps = k == 4 ? 8.0 : 0.0;
      step[k] = step_time_of(cluster, &f);
      CHECK(step[k] > 0, "negotiation/staging %d", k);
    }
    CHECK(step[0] == step[1] && step[0] == step[3], "unset %.9f, negotiation 0 %.9f, staging 0 %.9f", step[0],
          step[1], step[3]);
    CHECK(step[2] > step[0], "a 2 ms negotiation %.9f is not longer than none %.9f", step[2], step[0]);
    CHECK(step[4] > step[0], "staging at 8 Gbit/s %.9f is not longer than none %.9f", step[4], step[0]);
    f.host_staging_gbps = -1.0;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "host_staging_gbps") != NULL,
          "a negative staging rate: %s", tandem_last_error_message());
    CHECK(r == NULL, "no result on errors");
    f.field_mask &= ~(TANDEM_SIM_JOB_COMM_CYCLE | TANDEM_SIM_JOB_HOST_STAGING);
    f.field_mask |= TANDEM_SIM_JOB_COMM_NEGOTIATION;
    f.comm_negotiation_ms = 2.0;
    CHECK(tandem_simulate(cluster, &f, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "comm_negotiation_ms") != NULL,
          "a negotiation without a cycle: %s", tandem_last_error_message());
    CHECK(r == NULL, "no result on errors");
  }

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
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND;
  op.kind = TANDEM_OPTIMIZER_ADAM;
  CHECK(tandem_optimizer_create(ctx, &op, &adam) == TANDEM_OK, "adam");
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_OPTIMIZER;
  job.model = lenet;
  job.dataset = "fashion-mnist";
  job.batch = 64;
  job.optimizer = adam;
  CHECK(tandem_sim_plan(cluster, &job, 3, &plan) == TANDEM_OK, "plan");
  sum.field_mask = TANDEM_SIM_SUMMARY_LAYOUT | TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SEARCH;
  CHECK(tandem_sim_result_query(plan, &sum) == TANDEM_OK && sum.dp * sum.pp == 4, "plan layout");
  CHECK(sum.candidates == 3 && sum.evaluated >= 3 && sum.fitting >= 1, "search: %d of %d", sum.candidates,
        sum.evaluated);
  {
    tandem_sim_summary_t best = TANDEM_SIM_SUMMARY_INIT, third = TANDEM_SIM_SUMMARY_INIT;
    best.field_mask = third.field_mask = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_LAYOUT;
    CHECK(tandem_sim_result_candidate(plan, 0, &best) == TANDEM_OK && best.step_time_s == sum.step_time_s, "best");
    CHECK(tandem_sim_result_candidate(plan, 2, &third) == TANDEM_OK && third.total_time_s >= best.total_time_s,
          "ordered");
    CHECK(tandem_sim_result_candidate(plan, 3, &third) == TANDEM_ERR_INVALID_ARGUMENT, "candidate range");
    CHECK(tandem_sim_result_candidate(result, 0, &third) == TANDEM_ERR_INVALID_ARGUMENT, "not a plan");
  }

  /* a job as JSON text; a model named there is built for its data; a path is not JSON (never sniffed) */
  {
    tandem_sim_result_t* r2 = NULL;
    tandem_sim_job_params_t jj = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_summary_t s2 = TANDEM_SIM_SUMMARY_INIT;
    jj.field_mask = TANDEM_SIM_JOB_JSON | TANDEM_SIM_JOB_BASELINE;
    jj.job_json = "{\"model\": \"lenet5\", \"dataset\": \"fashion-mnist\", \"strategy\": \"pipeline\", "
                  "\"micro_batches\": 4, \"schedule\": \"gpipe\"}";
    CHECK(tandem_simulate(cluster, &jj, &r2) == TANDEM_OK, "json job");
    s2.field_mask = TANDEM_SIM_SUMMARY_JOB | TANDEM_SIM_SUMMARY_NAMES | TANDEM_SIM_SUMMARY_LAYOUT;
    CHECK(tandem_sim_result_query(r2, &s2) == TANDEM_OK && s2.strategy == TANDEM_STRATEGY_PIPELINE &&
              s2.schedule == TANDEM_SCHEDULE_GPIPE && s2.pp == 4 && s2.micro_batches == 4 &&
              strcmp(s2.model, "lenet5") == 0,
          "json job fields");
    ncut = 0;
    CHECK(tandem_sim_result_stage_cut(r2, NULL, &ncut) == TANDEM_OK && ncut == 5, "4 stages: %zu", ncut);
    tandem_sim_result_destroy(r2);
    r2 = NULL;
    jj.job_json = "/tmp/job.json";
    CHECK(tandem_simulate(cluster, &jj, &r2) == TANDEM_ERR_INVALID_ARGUMENT && r2 == NULL &&
              strstr(tandem_last_error_message(), "job JSON") != NULL,
          "a path given as JSON text");
  }

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
    job.field_mask = TANDEM_SIM_JOB_STRATEGY;
    job.strategy = (tandem_strategy_t)11; /* one past TANDEM_STRATEGY_LOCALSGD */
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_INVALID_ARGUMENT && none == NULL &&
              strstr(tandem_last_error_message(), "tandem_strategy_t") != NULL,
          "a value outside the enum");
    job.field_mask = TANDEM_SIM_JOB_MODEL;
    job.model = (const tandem_model_t*)ctx; /* not a model */
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "job.model") != NULL,
          "a foreign handle as the model");
    job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET;
    job.model = lenet; /* 1x28x28 against cifar10's 3x32x32 */
    job.dataset = "cifar10";
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_INVALID_ARGUMENT &&
              strstr(tandem_last_error_message(), "3x32x32") != NULL,
          "model and data disagree");
    job.field_mask = UINT64_C(1) << 62;
    CHECK(tandem_simulate(cluster, &job, &none) == TANDEM_ERR_UNSUPPORTED, "unknown bit");
    sum.field_mask = UINT64_C(1) << 62;
    CHECK(tandem_sim_result_query(result, &sum) == TANDEM_ERR_UNSUPPORTED, "unknown summary bit");
    CHECK(tandem_sim_result_write_trace(plan, trace_path) == TANDEM_ERR_INVALID_ARGUMENT, "trace without asking");
  }

  /* the strategies of issue #13: a synchronous parameter server (3 workers + 1 server on the 4 nodes) and FedAvg
   * with a deadline; their figures in the STRATEGY group */
  {
    tandem_sim_job_params_t ps = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_result_t* r = NULL;
    tandem_sim_summary_t s = TANDEM_SIM_SUMMARY_INIT;
    double model_bytes = 61706.0 * 4; /* lenet5's parameters */
    ps.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_EPOCHS |
                    TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_SERVERS | TANDEM_SIM_JOB_BASELINE;
    ps.model = lenet;
    ps.dataset = "fashion-mnist";
    ps.batch = 64;
    ps.epochs = 0.1;
    ps.strategy = TANDEM_STRATEGY_PS;
    ps.servers = 1;
    ps.baseline = 0;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_OK, "ps");
    s.field_mask = TANDEM_SIM_SUMMARY_STRATEGY | TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_JOB |
                   TANDEM_SIM_SUMMARY_NAMES;
    CHECK(tandem_sim_result_query(r, &s) == TANDEM_OK, "ps summary");
    CHECK(s.strategy == TANDEM_STRATEGY_PS && s.workers == 3 && s.servers == 1 && s.busiest_nic_rank == 3 &&
              fabs(s.busiest_nic_bytes - 3 * model_bytes) < 1.0 && strcmp(s.exchange, "push-pull") == 0 &&
              s.step_time_s > 0 && strstr(s.note, "time to accuracy") != NULL,
          "ps: %d workers %d servers, busiest NIC rank %d %.0f bytes, %s", s.workers, s.servers, s.busiest_nic_rank,
          s.busiest_nic_bytes, s.exchange);
    tandem_sim_result_destroy(r);
    r = NULL;
    ps.field_mask = (ps.field_mask & ~TANDEM_SIM_JOB_SERVERS) | TANDEM_SIM_JOB_CLIENTS |
                    TANDEM_SIM_JOB_CLIENT_FRACTION | TANDEM_SIM_JOB_ROUND_DEADLINE | TANDEM_SIM_JOB_LOCAL_EPOCHS;
    ps.strategy = TANDEM_STRATEGY_FEDAVG;
    ps.clients = 8;
    ps.client_fraction = 0.5;
    ps.local_epochs = 1;
    ps.round_deadline_s = 1000;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_OK, "fedavg");
    CHECK(tandem_sim_result_query(r, &s) == TANDEM_OK, "fedavg summary");
    CHECK(s.strategy == TANDEM_STRATEGY_FEDAVG && s.workers == 4 && s.servers == 0 && s.clients_sampled == 4 &&
              s.clients_counted == 4 && s.clients_dropped == 0 && s.round_time_s == s.step_time_s &&
              s.round_time_s > 0 && strcmp(s.exchange, "round") == 0,
          "fedavg: %g sampled %g counted %g dropped, round %g s", s.clients_sampled, s.clients_counted,
          s.clients_dropped, s.round_time_s);
    ps.round_deadline_s = s.round_time_s / 4; /* nobody makes it */
    tandem_sim_result_destroy(r);
    r = NULL;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_OK, "fedavg with a short deadline");
    CHECK(tandem_sim_result_query(r, &s) == TANDEM_OK && s.clients_dropped >= 3, "fedavg drops: %g", s.clients_dropped);
    tandem_sim_result_destroy(r);
    r = NULL;
    /* A field the strategy does not read (here SSP's staleness, then PS's servers, with FedAvg) was simulated as if it
     * were not given: refused naming it; so are more clients than the data set's 60,000 training samples. */
    ps.field_mask |= TANDEM_SIM_JOB_STALENESS;
    ps.staleness = 3;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_ERR_INVALID_ARGUMENT && r == NULL &&
              strstr(tandem_last_error_message(), "job.staleness (TANDEM_SIM_JOB_STALENESS) is read by strategy ssp "
                                                  "only, not by fedavg") != NULL,
          "staleness with fedavg: %s", tandem_last_error_message());
    ps.field_mask = (ps.field_mask & ~TANDEM_SIM_JOB_STALENESS) | TANDEM_SIM_JOB_SERVERS;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_ERR_INVALID_ARGUMENT && r == NULL &&
              strstr(tandem_last_error_message(), "job.servers (TANDEM_SIM_JOB_SERVERS)") != NULL,
          "servers with fedavg: %s", tandem_last_error_message());
    ps.field_mask &= ~TANDEM_SIM_JOB_SERVERS;
    ps.clients = 60001;
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_ERR_INVALID_ARGUMENT && r == NULL &&
              strstr(tandem_last_error_message(), "job.clients = 60001 is more than the 60000 training samples") != NULL,
          "clients beyond the data: %s", tandem_last_error_message());
    /* The same key in job_json (applied first) is refused alike. */
    ps.clients = 8;
    ps.field_mask |= TANDEM_SIM_JOB_JSON;
    ps.job_json = "{\"staleness\": 3}";
    CHECK(tandem_simulate(cluster, &ps, &r) == TANDEM_ERR_INVALID_ARGUMENT && r == NULL &&
              strstr(tandem_last_error_message(), "job.staleness (a key of job_json)") != NULL,
          "staleness in job_json with fedavg: %s", tandem_last_error_message());
  }

  tandem_optimizer_destroy(adam);
  tandem_model_destroy(lenet);
  tandem_model_destroy(mobilenet);
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
