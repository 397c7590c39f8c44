/* Gradient compression and the runtime allowance through the C ABI, compiled as C99:
 * TANDEM_SIM_JOB_COMPRESSION halves the all-reduced bytes of a DDP job, and a bad value names the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tandem/tandem.h>

#ifdef __cplusplus
#error "compile this file as C"
#endif

static int g_rank = -1;
#include "../common/c_expect.h"

static void simulate(tandem_sim_cluster_t* cluster, const tandem_model_t* model, tandem_compression_t compression,
                     tandem_sim_summary_t* sum, char* json, size_t json_cap) {
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_sim_result_t* result = NULL;
  size_t bytes = json_cap;
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_EPOCHS |
                   TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_OVERLAP | TANDEM_SIM_JOB_COMPRESSION;
  job.model = model;
  job.dataset = "cifar10";
  job.batch = 64;
  job.epochs = 0.05;
  job.strategy = TANDEM_STRATEGY_DDP;
  job.overlap = 0; /* all-reduces after backward: all of their time is exposed */
  job.compression = compression;
  EXPECT_OK(tandem_simulate(cluster, &job, &result));
  sum->field_mask = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SPLIT | TANDEM_SIM_SUMMARY_MEMORY |
                    TANDEM_SIM_SUMMARY_JOB;
  EXPECT_OK(tandem_sim_result_query(result, sum));
  EXPECT_OK(tandem_sim_result_json(result, json, &bytes));
  tandem_sim_result_destroy(result);
}

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_sim_cluster_t* cluster = NULL;
  tandem_sim_summary_t none = TANDEM_SIM_SUMMARY_INIT, fp16 = TANDEM_SIM_SUMMARY_INIT;
  tandem_sim_job_params_t bad = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_sim_result_t* result = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* resnet = NULL;
  static char json[1 << 16];
  double ratio;
  EXPECT_OK(tandem_context_create(NULL, &ctx));
  EXPECT_OK(tandem_sim_cluster_create(ctx, "c5.large:4", &cluster));
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "resnet18";
  mp.backend = "none";
  EXPECT_OK(tandem_model_create(ctx, &mp, &resnet));
  simulate(cluster, resnet, TANDEM_COMPRESSION_NONE, &none, json, sizeof json);
  EXPECT(strstr(json, "\"compression\":\"none\"") != NULL);
  EXPECT(none.compression == TANDEM_COMPRESSION_NONE);
  simulate(cluster, resnet, TANDEM_COMPRESSION_FP16, &fp16, json, sizeof json);
  EXPECT(strstr(json, "\"compression\":\"fp16\"") != NULL);
  EXPECT(fp16.compression == TANDEM_COMPRESSION_FP16);
  /* half the bytes on the wire: the exposed all-reduce time at least halves (less: a bucket's all-reduce
   * also runs while the training thread converts the next bucket) */
  ratio = fp16.comm_exposed_s / none.comm_exposed_s;
  if (!(ratio > 0.2 && ratio < 0.55)) fprintf(stderr, "exposed communication ratio %f\n", ratio);
  EXPECT(ratio > 0.2 && ratio < 0.55);
  EXPECT(fp16.compute_s > none.compute_s);                       /* the conversions */
  EXPECT(fp16.memory_per_node_bytes > none.memory_per_node_bytes); /* the 16-bit copies */
  bad.field_mask = TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_COMPRESSION;
  bad.strategy = TANDEM_STRATEGY_DDP;
  bad.compression = (tandem_compression_t)3;
  EXPECT_FAIL(tandem_simulate(cluster, &bad, &result), TANDEM_ERR_INVALID_ARGUMENT, "job.compression");
  bad.compression = (tandem_compression_t)-1;
  EXPECT_FAIL(tandem_simulate(cluster, &bad, &result), TANDEM_ERR_INVALID_ARGUMENT, "tandem_compression_t");
  EXPECT(result == NULL);
  tandem_model_destroy(resnet);
  tandem_sim_cluster_destroy(cluster);
  tandem_context_destroy(ctx);
  printf("compression: exposed communication %.3f s -> %.3f s, compute %.3f s -> %.3f s\n", none.comm_exposed_s,
         fp16.comm_exposed_s, none.compute_s, fp16.compute_s);
  return 0;
}
