/* Issue #16's memory options through the C ABI, compiled as C99: precision, recomputation, ZeRO sharding and the
 * framework's runtime allowance in tandem_sim_job_params_t (mask bits 38-41), the breakdown and advice of a job that
 * does not fit (TANDEM_SIM_SUMMARY_MEMORY_DETAIL), and errors that name the field. */
#include <math.h>
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

static const double kMiB = 1048576.0;

/* Simulates `job` on `cluster` and fills the memory groups of `s`; the result is returned for its strings. */
static tandem_status_t run(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                           tandem_sim_result_t** out, tandem_sim_summary_t* s) {
  tandem_status_t st = tandem_simulate(cluster, job, out);
  if (st != TANDEM_OK) return st;
  s->field_mask = TANDEM_SIM_SUMMARY_MEMORY | TANDEM_SIM_SUMMARY_MEMORY_DETAIL | TANDEM_SIM_SUMMARY_NAMES;
  return tandem_sim_result_query(*out, s);
}

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_sim_cluster_t* v100 = NULL;
  tandem_sim_cluster_t* c5 = NULL;
  tandem_sim_result_t* r = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* resnet50 = NULL;
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_sim_summary_t f32 = TANDEM_SIM_SUMMARY_INIT, mixed = TANDEM_SIM_SUMMARY_INIT, s = TANDEM_SIM_SUMMARY_INIT;
  double rt_tandem = 0, need_tandem = 0, act_tandem = 0, parts = 0;

  CHECK(tandem_context_create(NULL, &ctx) == TANDEM_OK, "context");
  CHECK(tandem_sim_cluster_create(ctx, "p3.2xlarge:1", &v100) == TANDEM_OK, "cluster");
  CHECK(tandem_sim_cluster_create(ctx, "c5.large:1", &c5) == TANDEM_OK, "cluster");
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND | TANDEM_MODEL_PARAM_INPUT_SHAPE |
                  TANDEM_MODEL_PARAM_NUM_CLASSES;
  mp.name = "resnet50";
  mp.backend = "none";
  mp.input_channels = 3;
  mp.input_height = 224;
  mp.input_width = 224;
  mp.num_classes = 1000;
  CHECK(tandem_model_create(ctx, &mp, &resnet50) == TANDEM_OK, "resnet50");

  /* ResNet-50, batch 256, one 16 GB V100: f32 does not fit, and the verdict says why and what fits */
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_EPOCHS |
                   TANDEM_SIM_JOB_BASELINE;
  job.model = resnet50;
  job.dataset = "imagenet";
  job.batch = 256;
  job.epochs = 0.001;
  job.baseline = 0;
  CHECK(run(v100, &job, &r, &f32) == TANDEM_OK, "f32 run");
  CHECK(!f32.fits, "resnet50 batch 256 in f32 fits a 16 GB V100");
  parts = f32.memory_param_bytes + f32.memory_grad_bytes + f32.memory_optimizer_bytes + f32.memory_activation_bytes +
          f32.memory_runtime_bytes + f32.memory_buffer_bytes;
  CHECK(fabs(parts - f32.memory_per_node_bytes) < 1.0, "breakdown %.0f vs need %.0f", parts, f32.memory_per_node_bytes);
  CHECK(f32.memory_param_bytes == f32.memory_grad_bytes && f32.memory_param_bytes > 25e6 * 4,
        "f32: 4 bytes per parameter and gradient (%.0f)", f32.memory_param_bytes);
  CHECK(strstr(f32.memory_advice, "fits with") != NULL, "advice: %s", f32.memory_advice);
  CHECK(strstr(f32.bottleneck, "activations") != NULL, "bottleneck: %s", f32.bottleneck);
  tandem_sim_result_destroy(r);

  /* fp16 mixed precision with every 2nd output kept: fits (fp16 alone does not in this model: every layer's output,
   * ReLU's included, is counted); weights and gradients halve, master weights join the optimizer state */
  job.field_mask |= TANDEM_SIM_JOB_PRECISION | TANDEM_SIM_JOB_RECOMPUTE;
  job.precision = TANDEM_PRECISION_FP16;
  job.recompute = TANDEM_RECOMPUTE_EVERY_K;
  job.recompute_every = 2;
  CHECK(run(v100, &job, &r, &mixed) == TANDEM_OK, "fp16 run");
  CHECK(mixed.fits, "resnet50 batch 256 in fp16 does not fit: %s", mixed.bottleneck);
  CHECK(mixed.memory_param_bytes * 2 == f32.memory_param_bytes, "fp16 weights %.0f", mixed.memory_param_bytes);
  CHECK(fabs(mixed.memory_optimizer_bytes - f32.memory_optimizer_bytes - f32.memory_param_bytes) < 1.0,
        "master weights: %.0f vs %.0f", mixed.memory_optimizer_bytes, f32.memory_optimizer_bytes);
  CHECK(mixed.memory_advice[0] == '\0', "advice for a job that fits: %s", mixed.memory_advice);
  tandem_sim_result_destroy(r);

  /* keeping every 4th output keeps fewer activations than every 2nd */
  job.recompute_every = 4;
  CHECK(run(v100, &job, &r, &s) == TANDEM_OK, "recompute run");
  CHECK(s.memory_activation_bytes < mixed.memory_activation_bytes, "recompute: %.0f vs %.0f",
        s.memory_activation_bytes, mixed.memory_activation_bytes);
  tandem_sim_result_destroy(r);

  /* the framework's runtime allowance on a CPU node */
  job.field_mask = TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_EPOCHS | TANDEM_SIM_JOB_BASELINE;
  job.dataset = "cifar10";
  CHECK(run(c5, &job, &r, &s) == TANDEM_OK, "tandem run");
  rt_tandem = s.memory_runtime_bytes;
  need_tandem = s.memory_per_node_bytes;
  act_tandem = s.memory_activation_bytes;
  tandem_sim_result_destroy(r);
  job.field_mask |= TANDEM_SIM_JOB_FRAMEWORK;
  job.framework = TANDEM_FRAMEWORK_PYTORCH_DDP;
  CHECK(run(c5, &job, &r, &s) == TANDEM_OK, "pytorch run");
  CHECK(s.memory_runtime_bytes == 340 * kMiB, "pytorch runtime %.0f", s.memory_runtime_bytes);
  /* and by Tandem's cpu backend peak over the activations (nn::kCpuActivationOverhead, 1.25, over the padded outputs,
     plus backward's scratch), which PyTorch's counted activations lack */
  CHECK(act_tandem > 1.25 * s.memory_activation_bytes, "activations %.0f vs %.0f", act_tandem,
        s.memory_activation_bytes);
  CHECK(fabs(s.memory_per_node_bytes - need_tandem - (340 * kMiB - rt_tandem) - (s.memory_activation_bytes - act_tandem)) < 1.0,
        "need moves by the difference");
  tandem_sim_result_destroy(r);
  r = NULL;

  /* bad values name the field */
  job.field_mask |= TANDEM_SIM_JOB_ZERO;
  job.zero = 3;
  CHECK(tandem_simulate(c5, &job, &r) == TANDEM_ERR_INVALID_ARGUMENT && r == NULL &&
            strstr(tandem_last_error_message(), "job.zero") != NULL,
        "zero 3 accepted");
  job.zero = 0;
  job.framework = (tandem_framework_t)7;
  CHECK(tandem_simulate(c5, &job, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "framework") != NULL,
        "framework 7 accepted");
  job.framework = TANDEM_FRAMEWORK_TANDEM;
  job.field_mask |= TANDEM_SIM_JOB_RECOMPUTE;
  job.recompute = TANDEM_RECOMPUTE_EVERY_K;
  job.recompute_every = 0;
  CHECK(tandem_simulate(c5, &job, &r) == TANDEM_ERR_INVALID_ARGUMENT &&
            strstr(tandem_last_error_message(), "recompute_every") != NULL,
        "every 0 layers accepted");
  job.field_mask = (UINT64_C(1) << 42);
  CHECK(tandem_simulate(c5, &job, &r) == TANDEM_ERR_UNSUPPORTED, "unknown bit 42 accepted");

  tandem_model_destroy(resnet50);
  tandem_sim_cluster_destroy(v100);
  tandem_sim_cluster_destroy(c5);
  tandem_context_destroy(ctx);
  printf("c_sim_memory_test: ok\n");
  return 0;
}
