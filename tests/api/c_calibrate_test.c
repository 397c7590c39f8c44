/* The calibration and prediction sections of the C ABI, from C: calibrate a model, read the figures back,
 * write the profile atomically, feed it to the simulator (a one-node prediction is then the calibrated step
 * itself), predict a trained job beside its measured figures, and the errors of each call. */
#define _XOPEN_SOURCE 700 /* mkdtemp, unlink, rmdir under -std=c99 */
#include <tandem/tandem.h>

#ifdef __cplusplus
#error "compile this file as C"
#endif

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                                                     \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond,         \
              tandem_last_error_message());                                                            \
      ++failures;                                                                                       \
    }                                                                                                   \
  } while (0)

static int contains(const char* s, const char* needle) { return s != NULL && strstr(s, needle) != NULL; }

/* The first two points of the profile's [[batch, bytes], ...] field `key` (quoted), as written by the library. */
static void first_two_points(const char* json, const char* key, double* b0, double* y0, double* b1, double* y1) {
  const char* p0 = strchr(strchr(strstr(json, key), '[') + 1, '[') + 1;
  char* end = NULL;
  *b0 = strtod(p0, &end);
  *y0 = strtod(strchr(end, ',') + 1, &end);
  *b1 = strtod(strchr(end, '[') + 1, &end);
  *y1 = strtod(strchr(end, ',') + 1, NULL);
}

/* Files in dir whose name contains `part` (a leftover temporary would). */
static int count_files(const char* dir, const char* part) {
  int n = 0;
  DIR* d = opendir(dir);
  struct dirent* e;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, part) != NULL) ++n;
  closedir(d);
  return n;
}

int main(void) {
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* model = NULL;
  tandem_model_t* spec_only = NULL;
  tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
  tandem_calibrate_params_t p = TANDEM_CALIBRATE_PARAMS_INIT;
  const int64_t curve[3] = {4, 1, 4}, bad_curve[2] = {2, 0};
  tandem_calibration_t* cal = NULL;
  tandem_calibration_t* untouched = (tandem_calibration_t*)&failures; /* must stay as it is on failure */
  tandem_calibration_attr_t a = TANDEM_CALIBRATION_ATTR_INIT;
  char dir[] = "/tmp/tandem_c_calibrate_XXXXXX";
  char path[256], bad[300];
  size_t i, bytes = 0;
  char* json = NULL;
  double sum;

  cp.field_mask = TANDEM_CONTEXT_PARAM_NUM_THREADS;
  cp.num_threads = 1;
  if (tandem_context_create(&cp, &ctx) != TANDEM_OK) return 1;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND | TANDEM_MODEL_PARAM_SEED;
  mp.name = "lenet5";
  mp.backend = "cpu";
  mp.seed = 1;
  CHECK(tandem_model_create(ctx, &mp, &model) == TANDEM_OK);
  ma.field_mask = TANDEM_MODEL_ATTR_SHAPE;
  CHECK(tandem_model_query(model, &ma) == TANDEM_OK);

  /* ---- errors ---- */
  p.field_mask = TANDEM_CALIBRATE_PARAM_BATCH;
  p.batch = 0;
  CHECK(tandem_calibrate(model, &p, NULL, &untouched) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "calibrate.batch"));
  CHECK(untouched == (tandem_calibration_t*)&failures);
  p.field_mask = UINT64_C(1) << 40;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_ERR_UNSUPPORTED);
  CHECK(tandem_calibrate(NULL, NULL, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(tandem_calibrate(model, NULL, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT);
  mp.backend = "none";
  CHECK(tandem_model_create(ctx, &mp, &spec_only) == TANDEM_OK);
  CHECK(tandem_calibrate(spec_only, NULL, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "none"));
  tandem_model_destroy(spec_only);
  p.field_mask = TANDEM_CALIBRATE_PARAM_CURVE;
  p.curve_batches = bad_curve;
  p.num_curve_batches = 2;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "curve_batches: 0"));
  p.curve_batches = NULL;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "curve_batches is NULL"));
  p.field_mask = TANDEM_CALIBRATE_PARAM_WAKEUP;
  p.wakeup_burst_s = 0.5;
  p.wakeup_ranks_per_core = 2;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "wakeup_burst_s must be in [0, 0.1] s"));
  p.wakeup_burst_s = 1e-3;
  p.wakeup_ranks_per_core = 1;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_ERR_INVALID_ARGUMENT);
  CHECK(contains(tandem_last_error_message(), "wakeup_ranks_per_core must be in [2, 8], got 1"));

  /* ---- a calibration, with the per-sample cost curve at 1 and 4 samples (8, the batch, is always a point) ---- */
  p.field_mask = TANDEM_CALIBRATE_PARAM_BATCH | TANDEM_CALIBRATE_PARAM_WARMUP | TANDEM_CALIBRATE_PARAM_ITERS |
                 TANDEM_CALIBRATE_PARAM_MACHINE | TANDEM_CALIBRATE_PARAM_CURVE | TANDEM_CALIBRATE_PARAM_WAKEUP;
  p.wakeup_burst_s = 5e-4;
  p.wakeup_ranks_per_core = 2;
  p.batch = 8;
  p.warmup = 1;
  p.iters = 3;
  p.machine = "c test machine";
  p.curve_batches = curve;
  p.num_curve_batches = 3;
  CHECK(tandem_calibrate(model, &p, NULL, &cal) == TANDEM_OK);
  if (cal == NULL) return 1;
  a.field_mask = TANDEM_CALIBRATION_ATTR_SHAPE | TANDEM_CALIBRATION_ATTR_TIMES | TANDEM_CALIBRATION_ATTR_P2P |
                 TANDEM_CALIBRATION_ATTR_CURVE;
  CHECK(tandem_calibration_query(cal, &a) == TANDEM_OK);
  CHECK(a.num_curve_points == 3); /* 4, 1, 8: ascending, the duplicate 4 once, the batch included */
  {
    int64_t b[3] = {0, 0, 0};
    double t[3] = {0, 0, 0};
    for (i = 0; i < 3; ++i) CHECK(tandem_calibration_curve(cal, i, &b[i], &t[i]) == TANDEM_OK);
    CHECK(b[0] == 1 && b[1] == 4 && b[2] == 8);
    CHECK(t[0] > 0 && t[1] > 0 && t[2] > 0);
    CHECK(tandem_calibration_curve(cal, 3, &b[0], NULL) == TANDEM_ERR_INVALID_ARGUMENT);
    CHECK(b[0] == 1); /* untouched on failure */
    CHECK(contains(tandem_last_error_message(), "3 curve points"));
  }
  CHECK(a.batch == 8);
  CHECK(a.num_layers == ma.num_layers);
  CHECK(a.threads == 1);
  CHECK(a.ranks == 1);
  CHECK(a.has_p2p == 0); /* no communicator, no point-to-point figures */
  CHECK(a.forward_s > 0 && a.backward_s > 0 && a.optimizer_step_s > 0);
  sum = a.forward_s + a.backward_s + a.optimizer_step_s;
  CHECK(fabs(sum - a.step_mean_s) <= 1e-9 * a.step_mean_s); /* the layers are scaled to the whole step */
  CHECK(a.memory_bytes_per_s > 1e8);
  for (i = 0; i < a.num_layers; ++i) {
    tandem_layer_attr_t la = TANDEM_LAYER_ATTR_INIT;
    const char* name = NULL;
    double f = -1, b = -1;
    la.field_mask = TANDEM_LAYER_ATTR_NAME;
    CHECK(tandem_model_layer_query(model, i, &la) == TANDEM_OK);
    CHECK(tandem_calibration_layer(cal, i, &name, &f, &b) == TANDEM_OK);
    CHECK(name != NULL && strcmp(name, la.name) == 0);
    CHECK(f >= 0 && b >= 0);
  }
  CHECK(tandem_calibration_layer(cal, a.num_layers, NULL, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT);
  a.field_mask = UINT64_C(1) << 30;
  CHECK(tandem_calibration_query(cal, &a) == TANDEM_ERR_UNSUPPORTED);

  /* JSON: size query, then the text. */
  CHECK(tandem_calibration_json(cal, NULL, &bytes) == TANDEM_OK);
  CHECK(bytes > 100);
  json = (char*)malloc(bytes);
  CHECK(json != NULL && tandem_calibration_json(cal, json, &bytes) == TANDEM_OK);
  CHECK(contains(json, "\"tandem-calibration\""));
  CHECK(contains(json, "\"c test machine\""));
  CHECK(contains(json, "\"optimizer_step_s\""));
  /* The runtime's 16-bit gradient conversion, timed for the simulator's compression model. */
  CHECK(contains(json, "\"fp16_convert_s\""));
  CHECK(contains(json, "\"bf16_convert_s\""));
  CHECK(contains(json, "\"batch_curve\""));
  /* Communication CPU (loopback here): per byte, and per wake-up of a paced transfer -- tens of microseconds on
   * common machines, more than a 2,896-byte write's per-byte share (simulator/comm_cpu.hpp). */
  CHECK(contains(json, "\"tcp_cpu_s_per_byte\""));
  CHECK(contains(json, "\"copy_cpu_s_per_byte\""));
  CHECK(contains(json, "\"tcp_cpu_s_per_wakeup\""));
  if (contains(json, "\"tcp_cpu_s_per_wakeup\"") && contains(json, "\"tcp_cpu_s_per_byte\"")) {
    const double wake = strtod(strchr(strstr(json, "\"tcp_cpu_s_per_wakeup\""), ':') + 1, NULL);
    const double per_byte = strtod(strchr(strstr(json, "\"tcp_cpu_s_per_byte\""), ':') + 1, NULL);
    CHECK(wake > 2896 * per_byte && wake > 1e-7 && wake < 1e-2);
  }
  /* The shared-core figures (simulator/compute/profile.hpp): a co-run table whose first point, one pass alone, is
   * 1 by definition, and a wake-up latency >= 0 (0 where the machine's own load hid it). */
  CHECK(contains(json, "\"corun_slowdown\""));
  if (contains(json, "\"corun_slowdown\"")) {
    const char* first = strchr(strchr(strstr(json, "\"corun_slowdown\""), '[') + 1, '[') + 1; /* [[x, f], ... */
    char* end = NULL;
    const double per_core = strtod(first, &end);
    const double slowdown = strtod(strchr(end, ',') + 1, NULL);
    CHECK(per_core > 0 && per_core <= 1 && slowdown == 1.0);
  }
  CHECK(contains(json, "\"wakeup_latency_s\""));
  if (contains(json, "\"wakeup_latency_s\"")) {
    const double lat = strtod(strchr(strstr(json, "\"wakeup_latency_s\""), ':') + 1, NULL);
    CHECK(lat >= 0 && lat < 0.1);
  }
  /* The activation peak, where this kernel lets the peak be reset: at the batch and at half of it, ascending, the
   * point at the batch the single figure (activation_peak_curve, simulator/compute/profile.hpp). */
  if (contains(json, "\"activation_peak_bytes\"")) {
    const double at_batch = strtod(strchr(strstr(json, "\"activation_peak_bytes\""), ':') + 1, NULL);
    CHECK(contains(json, "\"activation_peak_curve\""));
    if (contains(json, "\"activation_peak_curve\"")) {
      double b0 = 0, y0 = 0, b1 = 0, y1 = 0;
      first_two_points(json, "\"activation_peak_curve\"", &b0, &y0, &b1, &y1);
      CHECK(b0 == 4 && b1 == 8);
      CHECK(y1 == at_batch);
      CHECK(y0 > 0 && y0 < y1); /* half the samples, a lower peak */
    }
  }
  /* One more batch shape's primitives (primitive_bytes_curve, issue #16): the runtime figure's growth over the first
   * step at a quarter and at half the batch, ascending; resident bytes, never negative, well below the process. */
  if (contains(json, "\"runtime_rss_bytes\"")) {
    CHECK(contains(json, "\"primitive_bytes_curve\""));
    if (contains(json, "\"primitive_bytes_curve\"")) {
      double b0 = 0, y0 = 0, b1 = 0, y1 = 0;
      first_two_points(json, "\"primitive_bytes_curve\"", &b0, &y0, &b1, &y1);
      CHECK(b0 == 2 && b1 == 4);
      CHECK(y0 >= 0 && y1 >= 0 && y0 < 256e6 && y1 < 256e6);
    }
  }
  free(json);

  /* Atomic write: the file appears whole, no temporary is left behind; a bad directory is an I/O error. */
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/profile.json", dir);
  CHECK(tandem_calibration_write(cal, path) == TANDEM_OK);
  CHECK(tandem_calibration_write(cal, path) == TANDEM_OK); /* replaces it */
  CHECK(count_files(dir, "profile.json") == 1);
  CHECK(count_files(dir, ".tmp") == 0);
  snprintf(bad, sizeof bad, "%s/missing/profile.json", dir);
  CHECK(tandem_calibration_write(cal, bad) == TANDEM_ERR_IO);
  CHECK(contains(tandem_last_error_message(), "missing"));

  /* The simulator reads it: one node, one rank, nothing to communicate -- the predicted step is the calibrated
   * forward + backward + optimizer step. */
  {
    tandem_sim_cluster_t* cluster = NULL;
    tandem_sim_result_t* res = NULL;
    tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
    tandem_sim_summary_t s = TANDEM_SIM_SUMMARY_INIT;
    CHECK(tandem_sim_cluster_create(ctx, "t2.micro:1", &cluster) == TANDEM_OK);
    job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_PROFILE |
                     TANDEM_SIM_JOB_BASELINE;
    job.model = model; /* lenet5, 1x28x28 */
    job.dataset = "fashion-mnist";
    job.batch = 8;
    job.profile = path;
    job.baseline = 0;
    CHECK(tandem_simulate(cluster, &job, &res) == TANDEM_OK);
    s.field_mask = TANDEM_SIM_SUMMARY_TIMES;
    CHECK(res != NULL && tandem_sim_result_query(res, &s) == TANDEM_OK);
    CHECK(fabs(s.step_time_s - sum) <= 0.01 * sum + 1e-6);
    tandem_sim_result_destroy(res);
    res = NULL;
    mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
    mp.name = "mlp";
    mp.backend = "none";
    CHECK(tandem_model_create(ctx, &mp, &spec_only) == TANDEM_OK);
    job.model = spec_only; /* a profile of another model is refused */
    CHECK(tandem_simulate(cluster, &job, &res) == TANDEM_ERR_INVALID_ARGUMENT);
    tandem_model_destroy(spec_only);
    tandem_sim_cluster_destroy(cluster);
  }

  /* ---- prediction beside a trained job ---- */
  {
    tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
    tandem_dataset_t* data = NULL;
    tandem_optimizer_t* opt = NULL;
    tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
    tandem_trainer_t* single = NULL;
    tandem_trainer_t* par = NULL;
    tandem_epoch_result_t er = TANDEM_EPOCH_RESULT_INIT;
    tandem_predict_params_t pp = TANDEM_PREDICT_PARAMS_INIT;
    tandem_prediction_t r = TANDEM_PREDICTION_INIT;
    const uint64_t all = TANDEM_PREDICTION_STEP | TANDEM_PREDICTION_MEMORY | TANDEM_PREDICTION_LAYOUT |
                         TANDEM_PREDICTION_JOB;
    dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_COUNT;
    dp.kind = "synthetic";
    dp.count = 64;
    CHECK(tandem_dataset_create(ctx, &dp, &data) == TANDEM_OK);
    CHECK(tandem_optimizer_create(ctx, NULL, &opt) == TANDEM_OK);
    tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_LIMIT_BATCHES;
    tp.batch_size = 8;
    tp.limit_batches = 3;
    CHECK(tandem_trainer_create_parallel(model, data, NULL, opt, &tp, NULL, NULL, &par) == TANDEM_OK);
    pp.field_mask = TANDEM_PREDICT_PARAM_CLUSTER | TANDEM_PREDICT_PARAM_PROFILE;
    pp.cluster = "t2.micro:1";
    pp.profile = path;
    CHECK(tandem_trainer_predict(par, &pp, &r, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT); /* no epoch yet */
    CHECK(contains(tandem_last_error_message(), "epoch"));
    er.field_mask = TANDEM_EPOCH_RESULT_TRAIN;
    CHECK(tandem_trainer_epoch(par, &er) == TANDEM_OK);
    memset(&r, 0, sizeof r);
    r.field_mask = UINT64_C(1) << 40;
    CHECK(tandem_trainer_predict(par, &pp, &r, NULL, NULL) == TANDEM_ERR_UNSUPPORTED); /* a bit of a later version */
    r.field_mask = TANDEM_PREDICTION_STEP; /* only the groups asked for are filled */
    CHECK(tandem_trainer_predict(par, &pp, &r, NULL, NULL) == TANDEM_OK);
    CHECK(r.predicted_step_s > 0 && r.world == 0 && r.strategy == NULL && r.predicted_memory_bytes == 0);
    memset(&r, 0, sizeof r);
    r.field_mask = all;
    bytes = 0;
    CHECK(tandem_trainer_predict(par, &pp, &r, NULL, &bytes) == TANDEM_OK);
    CHECK(bytes > 100); /* the simulator's JSON, size only */
    CHECK(r.steps == 3);
    CHECK(r.measured_step_s > 0 && r.predicted_step_s > 0);
    CHECK(fabs(r.step_error - (r.predicted_step_s - r.measured_step_s) / r.measured_step_s) < 1e-12);
    CHECK(fabs(r.predicted_step_s - sum) <= 0.01 * sum + 1e-6); /* same profile, same batch, one rank */
    CHECK(r.measured_memory_bytes > 1e6 && r.predicted_memory_bytes > 1e6);
    CHECK(r.predicted_fits == 1);
    CHECK(r.world == 1 && r.dp == 1 && r.pp == 1);
    CHECK(r.strategy != NULL && strcmp(r.strategy, "single") == 0);
    CHECK(r.compute_source != NULL && strcmp(r.compute_source, "profile") == 0);
    CHECK(r.same_cut == 1); /* one stage: nothing to cut */
    CHECK(r.compression == TANDEM_COMPRESSION_NONE && r.num_buckets == 0 && r.allreduce_bytes_per_step == 0);
    pp.field_mask = TANDEM_PREDICT_PARAM_PROFILE;
    CHECK(tandem_trainer_predict(par, &pp, &r, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT); /* no cluster */
    CHECK(contains(tandem_last_error_message(), "cluster"));

    /* A single-process trainer keeps no split: it needs the caller's measured figures. */
    CHECK(tandem_trainer_create(model, data, NULL, opt, &tp, &single) == TANDEM_OK);
    pp.field_mask = TANDEM_PREDICT_PARAM_CLUSTER;
    CHECK(tandem_trainer_predict(single, &pp, &r, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT);
    CHECK(contains(tandem_last_error_message(), "measured_step_s"));
    pp.field_mask |= TANDEM_PREDICT_PARAM_MEASURED;
    pp.measured_step_s = 0.01;
    pp.measured_steps = 3;
    CHECK(tandem_trainer_predict(single, &pp, &r, NULL, NULL) == TANDEM_OK);
    CHECK(r.measured_step_s == 0.01 && r.predicted_step_s > 0);
    CHECK(r.compute_source != NULL && strcmp(r.compute_source, "roofline") == 0);
    tandem_trainer_destroy(single);
    tandem_trainer_destroy(par);
    tandem_optimizer_destroy(opt);
    tandem_dataset_destroy(data);
  }

  unlink(path);
  rmdir(dir);
  tandem_calibration_destroy(cal);
  tandem_calibration_destroy(NULL); /* NULL is a no-op */
  tandem_model_destroy(model);
  tandem_context_destroy(ctx);
  if (failures == 0) printf("c_calibrate_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
