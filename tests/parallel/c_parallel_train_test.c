/* Parallel training through the C ABI, from C99 (-pedantic -Werror). Alone it is a one-rank job
 * (strategy single); CTest also runs it as `tandem launch -n 2` (DDP) and `-n 4` (hybrid 2x2).
 * Each rank checks: configuration errors come back on every rank before any communication; an
 * epoch's global figures; the grid; that its stage's parameters equal those of a single-process
 * trainer on the global batch (1e-5 relative); a checkpoint round trip; the merged trace.
 * Exits non-zero on the first failed check. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

static int g_rank = -1;

#include "../common/c_expect.h"

enum { kBatch = 8, kBatches = 4 };
static const double kBucketSizes[2] = {0.002, 0.004}, kBadBucketSizes[2] = {0.002, 5000.0};

static tandem_model_t* make_model(tandem_context_t* ctx) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* m = NULL;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES |
                  TANDEM_MODEL_PARAM_SEED | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "lenet5";
  mp.input_channels = 1;
  mp.input_height = 12;
  mp.input_width = 12;
  mp.num_classes = 4;
  mp.seed = 3;
  mp.backend = "cpu";
  EXPECT_OK(tandem_model_create(ctx, &mp, &m));
  return m;
}

static tandem_dataset_t* make_data(tandem_context_t* ctx, int64_t count, uint64_t seed) {
  tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
  tandem_dataset_t* d = NULL;
  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_SHAPE | TANDEM_DATASET_PARAM_NUM_CLASSES |
                  TANDEM_DATASET_PARAM_COUNT | TANDEM_DATASET_PARAM_SEED;
  dp.kind = "synthetic";
  dp.channels = 1;
  dp.height = 12;
  dp.width = 12;
  dp.num_classes = 4;
  dp.count = count;
  dp.seed = seed;
  EXPECT_OK(tandem_dataset_create(ctx, &dp, &d));
  return d;
}

static tandem_trainer_params_t trainer_params(int64_t batch) {
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_SEED | TANDEM_TRAINER_PARAM_LIMIT_BATCHES |
                  TANDEM_TRAINER_PARAM_PREFETCH;
  tp.batch_size = batch;
  tp.seed = 7;
  tp.limit_batches = kBatches;
  tp.prefetch = 0;
  return tp;
}

/* Offset of layer `layer`'s parameters in the flat buffer. */
static int64_t param_offset(const tandem_model_t* m, int32_t layer) {
  int64_t off = 0;
  int32_t i;
  for (i = 0; i < layer; ++i) {
    tandem_layer_attr_t la = TANDEM_LAYER_ATTR_INIT;
    la.field_mask = TANDEM_LAYER_ATTR_COST;
    EXPECT_OK(tandem_model_layer_query(m, (size_t)i, &la));
    off += la.params;
  }
  return off;
}

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_comm_t* comm = NULL;
  tandem_model_t *model = NULL, *ref_model = NULL;
  tandem_dataset_t *train = NULL, *test = NULL;
  tandem_optimizer_t* opt = NULL;
  tandem_trainer_t *trainer = NULL, *ref = NULL, *bad = NULL;
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  tandem_parallel_params_t pp = TANDEM_PARALLEL_PARAMS_INIT;
  tandem_trainer_params_t tp;
  tandem_epoch_result_t er = TANDEM_EPOCH_RESULT_INIT;
  tandem_parallel_attr_t pa = TANDEM_PARALLEL_ATTR_INIT;
  tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
  int32_t rank = 0, world = 1, i;
  int64_t epochs = 0, steps = 0, begin, end;
  float *got, *want;
  double num = 0, den = 0;
  char ckpt[256], trace[256];
  FILE* f;

  EXPECT_OK(tandem_context_create(NULL, &ctx));
  EXPECT_OK(tandem_comm_create(ctx, NULL, &comm));
  EXPECT_OK(tandem_comm_rank(comm, &rank));
  EXPECT_OK(tandem_comm_size(comm, &world));
  g_rank = rank;
  model = make_model(ctx);
  train = make_data(ctx, 512, 1);
  test = make_data(ctx, 96, 2);
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_LR | TANDEM_OPTIMIZER_PARAM_MOMENTUM;
  op.kind = TANDEM_OPTIMIZER_SGD;
  op.lr = 0.05f;
  op.momentum = 0.9f;
  EXPECT_OK(tandem_optimizer_create(ctx, &op, &opt));
  tp = trainer_params(kBatch);

  /* Configuration errors: on every rank, before any communication (so nobody waits for anybody). */
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_GRID;
  pp.strategy = TANDEM_STRATEGY_HYBRID;
  pp.dp = 3;
  pp.pp = 1;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, world % 3 == 0 ? "is not dp x pp" : "is not divisible by dp");
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_MICRO_BATCHES;
  pp.strategy = world == 1 ? TANDEM_STRATEGY_SINGLE : TANDEM_STRATEGY_DDP;
  pp.micro_batches = kBatch + 1;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "micro-batches are more than the 8 samples");
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_GRID;
  pp.strategy = TANDEM_STRATEGY_PIPELINE;
  pp.dp = 0;
  pp.pp = 64;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, world == 64 ? "stages but the model has only" : "pp = world");
  /* the bucket policy: a first-bucket cap and explicit sizes together, a NULL list, a size out of range */
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_BUCKETS;
  pp.strategy = world == 1 ? TANDEM_STRATEGY_SINGLE : TANDEM_STRATEGY_DDP;
  pp.first_bucket_mb = 1.0;
  pp.bucket_sizes_mb = kBucketSizes;
  pp.num_bucket_sizes = 2;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "not both");
  pp.first_bucket_mb = 0;
  pp.bucket_sizes_mb = NULL;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "bucket_sizes_mb is NULL");
  pp.bucket_sizes_mb = kBadBucketSizes;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad),
              TANDEM_ERR_INVALID_ARGUMENT, "bucket size 1 (of the bucket sizes) must be in (0, 4096] MiB");
  pp.field_mask = 1u << 30;
  EXPECT_FAIL(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &bad), TANDEM_ERR_UNSUPPORTED,
              "unknown field_mask");
  EXPECT(bad == NULL);

  /* The job: single alone, DDP on 2 ranks, hybrid 2x2 on 4 (2 micro-batches, GPipe). */
  memset(&pp, 0, sizeof pp);
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_GRID | TANDEM_PARALLEL_PARAM_MICRO_BATCHES |
                  TANDEM_PARALLEL_PARAM_SCHEDULE | TANDEM_PARALLEL_PARAM_BUCKET_MB | TANDEM_PARALLEL_PARAM_TRACE |
                  TANDEM_PARALLEL_PARAM_BUCKETS;
  pp.strategy = world == 1 ? TANDEM_STRATEGY_SINGLE : world == 4 ? TANDEM_STRATEGY_HYBRID : TANDEM_STRATEGY_DDP;
  pp.dp = world == 4 ? 2 : 0;
  pp.pp = world == 4 ? 2 : 0;
  pp.micro_batches = 2;
  pp.schedule = TANDEM_SCHEDULE_GPIPE;
  pp.bucket_mb = 0.01;
  pp.bucket_sizes_mb = kBucketSizes; /* two small buckets first (the last layers' gradients), then 0.01 MiB ones */
  pp.num_bucket_sizes = 2;
  pp.trace = 1;
  EXPECT_OK(tandem_trainer_create_parallel(model, train, test, opt, &tp, &pp, comm, &trainer));
  pa.field_mask = TANDEM_PARALLEL_ATTR_GRID | TANDEM_PARALLEL_ATTR_PLAN | TANDEM_PARALLEL_ATTR_SPLIT;
  EXPECT_OK(tandem_trainer_parallel_query(trainer, &pa));
  EXPECT(pa.world == world && pa.rank == rank && pa.dp * pa.pp == world && pa.stage == rank % pa.pp &&
         pa.replica == rank / pa.pp && pa.micro_batches == 2 && strcmp(pa.schedule, "gpipe") == 0);
  EXPECT(strstr(pa.partition, "stage 0: layers [0, ") == pa.partition);
  EXPECT(pa.first_layer < pa.end_layer);

  er.field_mask = TANDEM_EPOCH_RESULT_TRAIN | TANDEM_EPOCH_RESULT_TEST | TANDEM_EPOCH_RESULT_TIME;
  EXPECT_OK(tandem_trainer_epoch(trainer, &er));
  EXPECT(er.epoch == 1 && er.train_samples == (int64_t)kBatch * kBatches * pa.dp);
  EXPECT(er.train_accuracy >= 0 && er.train_accuracy <= 1 && er.test_accuracy >= 0 && er.test_accuracy <= 1);
  EXPECT(er.images_per_sec > 0 && isfinite(er.train_loss));
  EXPECT_OK(tandem_trainer_progress(trainer, &epochs, &steps));
  EXPECT(epochs == 1 && steps == kBatches);
  EXPECT_OK(tandem_trainer_parallel_query(trainer, &pa));
  EXPECT(pa.steps == kBatches && pa.step_s > 0 && pa.compute_s > 0 && pa.compute_s <= pa.step_s * 1.0001);
  EXPECT(pa.bubble_fraction >= 0 && pa.bubble_fraction < 1);

  /* The same steps on one process with the global batch: this rank's stage must match. */
  ref_model = make_model(ctx);
  tp = trainer_params((int64_t)kBatch * pa.dp);
  EXPECT_OK(tandem_trainer_create(ref_model, train, NULL, opt, &tp, &ref));
  for (i = 0; i < kBatches; ++i) EXPECT_OK(tandem_trainer_step(ref, NULL));
  ma.field_mask = TANDEM_MODEL_ATTR_COST | TANDEM_MODEL_ATTR_HELD;
  EXPECT_OK(tandem_model_query(model, &ma));
  /* The model reports the stage the trainer made it hold, and the parameters get_params takes. */
  EXPECT(ma.held_first_layer == (size_t)pa.first_layer && ma.held_end_layer == (size_t)pa.end_layer);
  got = malloc(sizeof(float) * (size_t)ma.params);
  want = malloc(sizeof(float) * (size_t)ma.params);
  EXPECT(got != NULL && want != NULL);
  begin = param_offset(model, pa.first_layer);
  end = param_offset(model, pa.end_layer);
  EXPECT(end > begin);
  EXPECT(ma.held_params == end - begin);
  /* A pipeline stage's model holds only its stage's layers: its parameters are that slice. */
  if (end - begin < ma.params)
    EXPECT(tandem_model_get_params(model, got, (size_t)ma.params) == TANDEM_ERR_INVALID_ARGUMENT);
  EXPECT_OK(tandem_model_get_params(model, got, (size_t)(end - begin)));
  EXPECT_OK(tandem_model_get_params(ref_model, want, (size_t)ma.params));
  for (i = (int32_t)begin; i < (int32_t)end; ++i) {
    double d = fabs((double)got[i - begin] - want[i]);
    num = d > num ? d : num;
    den = fabs(want[i]) > den ? fabs(want[i]) : den;
  }
  if (num > 1e-5 * den) {
    fprintf(stderr, "rank %d: stage parameters differ from single-process training by %g (max |w| %g)\n", rank, num,
            den);
    return 1;
  }

  /* Checkpoint round trip (collective), then the merged trace. */
  snprintf(ckpt, sizeof ckpt, "c_parallel_train_test_%d.ckpt", (int)world);
  snprintf(trace, sizeof trace, "c_parallel_train_test_%d.trace.json", (int)world);
  EXPECT_OK(tandem_trainer_save_checkpoint(trainer, ckpt));
  EXPECT_OK(tandem_trainer_load_checkpoint(trainer, ckpt));
  EXPECT_OK(tandem_trainer_progress(trainer, &epochs, &steps));
  EXPECT(epochs == 1 && steps == kBatches);
  EXPECT_OK(tandem_trainer_write_trace(trainer, trace));
  if (rank == 0) {
    char head[32] = {0};
    f = fopen(trace, "r");
    EXPECT(f != NULL);
    EXPECT(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    EXPECT(strstr(head, "{\"displayTimeUnit\"") == head);
  }
  EXPECT_FAIL(tandem_trainer_parallel_query(ref, &pa), TANDEM_ERR_INVALID_ARGUMENT, "tandem_trainer_create");

  free(got);
  free(want);
  tandem_trainer_destroy(ref);
  tandem_trainer_destroy(trainer);
  tandem_optimizer_destroy(opt);
  tandem_dataset_destroy(test);
  tandem_dataset_destroy(train);
  tandem_model_destroy(ref_model);
  tandem_model_destroy(model);
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  if (rank == 0) printf("c_parallel_train_test: %d rank(s) passed\n", (int)world);
  return 0;
}
