/* Elastic DDP through the C ABI (issue #17), from C99 (-pedantic -Werror): three ranks as POSIX threads over the
 * inproc transport with TANDEM_PARALLEL_PARAM_ELASTIC; rank 2 leaves after two steps (its trainer and communicator
 * destroyed), the two survivors step on and report the new grid, the lost rank and the learning-rate factor.
 * Bad elastic settings are refused naming the field. Exits non-zero on the first failed check. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

static int g_rank = -1; /* printed by failed checks; threads share it, so it names some rank */

#include "../common/c_expect.h"

#define WORLD 3
#define DEAD 2
#define BEFORE 2
#define AFTER 4

static tandem_context_t* g_ctx = NULL;
static tandem_dataset_t* g_train = NULL;
static tandem_optimizer_t* g_opt = NULL;

static tandem_model_t* make_model(void) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* m = NULL;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES |
                  TANDEM_MODEL_PARAM_SEED;
  mp.name = "lenet5";
  mp.input_channels = 1;
  mp.input_height = 12;
  mp.input_width = 12;
  mp.num_classes = 4;
  mp.seed = 3;
  EXPECT_OK(tandem_model_create(g_ctx, &mp, &m));
  return m;
}

static tandem_trainer_params_t trainer_params(void) {
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_SEED | TANDEM_TRAINER_PARAM_PREFETCH;
  tp.batch_size = 4;
  tp.seed = 7;
  tp.prefetch = 0;
  return tp;
}

static tandem_parallel_params_t elastic_params(int32_t min_ranks) {
  tandem_parallel_params_t pp = TANDEM_PARALLEL_PARAMS_INIT;
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_ELASTIC;
  pp.strategy = TANDEM_STRATEGY_DDP;
  pp.elastic = 1;
  pp.min_ranks = min_ranks;
  pp.elastic_checkpoint = NULL;
  return pp;
}

static void* rank_main(void* arg) {
  const int rank = (int)(intptr_t)arg;
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  tandem_comm_t* comm = NULL;
  tandem_model_t* model = make_model();
  tandem_trainer_t *trainer = NULL, *bad = NULL;
  tandem_trainer_params_t tp = trainer_params();
  tandem_parallel_params_t pp = elastic_params(2);
  tandem_parallel_attr_t a = TANDEM_PARALLEL_ATTR_INIT;
  tandem_step_result_t sr = TANDEM_STEP_RESULT_INIT;
  int i;
  p.field_mask = TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_TRANSPORT |
                 TANDEM_COMM_PARAM_TIMEOUT_MS | TANDEM_COMM_PARAM_MASTER_PORT | TANDEM_COMM_PARAM_SECRET;
  p.rank = rank;
  p.size = WORLD;
  p.transport = "inproc";
  p.timeout_ms = 4000;
  p.master_port = 29873;
  p.secret = "c-elastic-test";
  EXPECT_OK(tandem_comm_create(g_ctx, &p, &comm));

  /* Refused before any communication, on every rank: min_ranks 0, above the world, and elastic hybrid. */
  pp = elastic_params(0);
  EXPECT_FAIL(tandem_trainer_create_parallel(model, g_train, NULL, g_opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "parallel->min_ranks must be >= 1");
  pp = elastic_params(WORLD + 1);
  EXPECT_FAIL(tandem_trainer_create_parallel(model, g_train, NULL, g_opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "min_ranks must be in [1, 3]");
  pp = elastic_params(1);
  pp.field_mask |= TANDEM_PARALLEL_PARAM_COMPRESSION;
  pp.compression = TANDEM_COMPRESSION_FP16;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, g_train, NULL, g_opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_UNSUPPORTED, "does not support gradient compression");
  EXPECT(bad == NULL);

  pp = elastic_params(2);
  EXPECT_OK(tandem_trainer_create_parallel(model, g_train, NULL, g_opt, &tp, &pp, comm, &trainer));
  for (i = 0; i < BEFORE; ++i) EXPECT_OK(tandem_trainer_step(trainer, &sr));
  if (rank == DEAD) { /* leaves the job: its trainer, communicator and transport go away */
    tandem_trainer_destroy(trainer);
    tandem_comm_destroy(comm);
    tandem_model_destroy(model);
    return NULL;
  }
  for (i = 0; i < AFTER; ++i) {
    sr.field_mask = TANDEM_STEP_RESULT_LOSS | TANDEM_STEP_RESULT_LR;
    EXPECT_OK(tandem_trainer_step(trainer, &sr));
    EXPECT(sr.samples == 4); /* the per-replica batch is kept */
    EXPECT(fabs(sr.lr - 0.05 * 2.0 / 3.0) < 1e-6); /* the learning rate x 2/3 */
  }
  a.field_mask = TANDEM_PARALLEL_ATTR_GRID | TANDEM_PARALLEL_ATTR_ELASTIC;
  EXPECT_OK(tandem_trainer_parallel_query(trainer, &a));
  EXPECT(a.world == WORLD - 1 && a.dp == WORLD - 1 && a.rank == rank);
  EXPECT(a.elastic == 1 && a.min_ranks == 2 && a.lost_ranks == 1 && a.world_rank == rank);
  EXPECT(fabs(a.lr_scale - 2.0 / 3.0) < 1e-12);
  tandem_trainer_destroy(trainer);
  tandem_comm_destroy(comm);
  tandem_model_destroy(model);
  return NULL;
}

int main(void) {
  tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  pthread_t threads[WORLD];
  int r;
  EXPECT_OK(tandem_context_create(NULL, &g_ctx));
  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_SHAPE | TANDEM_DATASET_PARAM_NUM_CLASSES |
                  TANDEM_DATASET_PARAM_COUNT | TANDEM_DATASET_PARAM_SEED;
  dp.kind = "synthetic";
  dp.channels = 1;
  dp.height = 12;
  dp.width = 12;
  dp.num_classes = 4;
  dp.count = 256;
  dp.seed = 1;
  EXPECT_OK(tandem_dataset_create(g_ctx, &dp, &g_train));
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_LR | TANDEM_OPTIMIZER_PARAM_MOMENTUM;
  op.kind = TANDEM_OPTIMIZER_SGD;
  op.lr = 0.05f;
  op.momentum = 0.9f;
  EXPECT_OK(tandem_optimizer_create(g_ctx, &op, &g_opt));
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_create(&threads[r], NULL, rank_main, (void*)(intptr_t)r) == 0);
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_join(threads[r], NULL) == 0);
  tandem_optimizer_destroy(g_opt);
  tandem_dataset_destroy(g_train);
  tandem_context_destroy(g_ctx);
  printf("c_elastic_test: ok\n");
  return 0;
}
