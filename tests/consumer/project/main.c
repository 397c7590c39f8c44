/* Links the installed libtandem from outside its tree: the version it was built against, a context, a model
 * spec and a one-node simulation through the C ABI. Prints "consumer ok <version> <params>". */
#include <stdio.h>
#include <string.h>

#include <tandem/tandem.h>

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_model_t* model = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_attr_t attr = TANDEM_MODEL_ATTR_INIT;
  tandem_sim_cluster_t* cluster = NULL;
  tandem_sim_result_t* result = NULL;
  tandem_sim_job_params_t job = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_sim_summary_t sum = TANDEM_SIM_SUMMARY_INIT;
  if (tandem_version() != TANDEM_VERSION) {
    fprintf(stderr, "header %d but library %u\n", TANDEM_VERSION, tandem_version());
    return 1;
  }
  if (tandem_context_create(NULL, &ctx) != TANDEM_OK) return 2;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "lenet5";
  mp.backend = "none";
  attr.field_mask = TANDEM_MODEL_ATTR_COST;
  if (tandem_model_create(ctx, &mp, &model) != TANDEM_OK || tandem_model_query(model, &attr) != TANDEM_OK) return 3;
  job.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET;
  job.model = model;
  job.dataset = "fashion-mnist";
  sum.field_mask = TANDEM_SIM_SUMMARY_TIMES;
  if (tandem_sim_cluster_create(ctx, "c5.large:1", &cluster) != TANDEM_OK ||
      tandem_simulate(cluster, &job, &result) != TANDEM_OK || tandem_sim_result_query(result, &sum) != TANDEM_OK ||
      !(sum.step_time_s > 0)) {
    fprintf(stderr, "simulation failed: %s\n", tandem_last_error_message());
    return 4;
  }
  printf("consumer ok %s %lld\n", tandem_version_string(), (long long)attr.params);
  tandem_sim_result_destroy(result);
  tandem_sim_cluster_destroy(cluster);
  tandem_model_destroy(model);
  tandem_context_destroy(ctx);
  return 0;
}
