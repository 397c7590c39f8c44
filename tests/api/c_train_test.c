/* The training section of the C ABI, compiled as C99 with -pedantic -Werror: models, datasets,
 * optimizers, trainers, checkpoints and their errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

#define EXPECT(cond)                                                                                   \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      fprintf(stderr, "%s:%d: failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond,              \
              tandem_last_error_message());                                                            \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

static int progress_calls = 0;
static void on_progress(const tandem_progress_t* p, void* user) {
  (void)user;
  if (p->batch >= 1 && p->batch <= p->batches) ++progress_calls;
}

int main(void) {
  const char* ckpt = "c_train_test.ckpt";
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* model = NULL;
  tandem_model_t* spec_only = NULL;
  tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
  tandem_layer_attr_t la = TANDEM_LAYER_ATTR_INIT;
  tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
  tandem_dataset_t* train = NULL;
  tandem_dataset_t* test = NULL;
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  tandem_optimizer_t* opt = NULL;
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  tandem_trainer_t* trainer = NULL;
  tandem_trainer_t* resumed = NULL;
  tandem_step_result_t sr = TANDEM_STEP_RESULT_INIT;
  tandem_epoch_result_t er = TANDEM_EPOCH_RESULT_INIT;
  int64_t size = 0, epochs = 0, steps = 0;
  double loss = 0, acc = 0, acc_before = 0;
  float* saved = NULL;
  float* after = NULL;
  float logits[20];
  float input[2 * 64];
  size_t i, n;

  cp.field_mask = TANDEM_CONTEXT_PARAM_NUM_THREADS;
  cp.num_threads = 1;
  EXPECT(tandem_context_create(&cp, &ctx) == TANDEM_OK);

  /* A spec-only model: summaries without parameters. */
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "resnet18";
  mp.backend = "none";
  EXPECT(tandem_model_create(ctx, &mp, &spec_only) == TANDEM_OK);
  ma.field_mask = TANDEM_MODEL_ATTR_NAME | TANDEM_MODEL_ATTR_SHAPE | TANDEM_MODEL_ATTR_COST;
  EXPECT(tandem_model_query(spec_only, &ma) == TANDEM_OK);
  EXPECT(strcmp(ma.name, "resnet18") == 0 && strcmp(ma.backend, "none") == 0);
  EXPECT(ma.params == 11173962 && ma.macs == 555422720 && ma.num_classes == 10 && ma.input_height == 32);
  la.field_mask = TANDEM_LAYER_ATTR_NAME | TANDEM_LAYER_ATTR_SHAPE | TANDEM_LAYER_ATTR_COST;
  EXPECT(tandem_model_layer_query(spec_only, 0, &la) == TANDEM_OK);
  EXPECT(strcmp(la.kind, "conv2d") == 0 && la.inputs[0] == -1 && la.out_channels == 64 && la.params == 1728);
  EXPECT(tandem_model_layer_query(spec_only, ma.num_layers, &la) == TANDEM_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(tandem_last_error_message(), "out of range") != NULL);
  saved = (float*)malloc(sizeof(float));
  EXPECT(tandem_model_get_params(spec_only, saved, 1) == TANDEM_ERR_INVALID_ARGUMENT);
  free(saved);
  saved = NULL;

  /* Errors name what is wrong. */
  mp.field_mask = TANDEM_MODEL_PARAM_NAME;
  mp.name = "resnet19";
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_ERR_INVALID_ARGUMENT && model == NULL);
  EXPECT(strstr(tandem_last_error_message(), "resnet19") != NULL);
  /* A width multiplier is mobilenetv2's: given to another zoo model it was ignored (the full model); refused. */
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND | TANDEM_MODEL_PARAM_WIDTH_MULT;
  mp.name = "resnet18";
  mp.width_mult = 0.5;
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_ERR_INVALID_ARGUMENT && model == NULL);
  EXPECT(strstr(tandem_last_error_message(),
                "model 'resnet18': width_mult 0.5 applies to mobilenetv2 and mobilenetv2_imagenet only") != NULL);
  mp.name = "mobilenetv2";
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_OK);
  tandem_model_destroy(model);
  model = NULL;
  mp.field_mask = TANDEM_MODEL_PARAM_SPEC_JSON;
  mp.spec_json = "{\"input\": [1, 4, 4], \"layers\": [{\"type\": \"linear\"}]}";
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(tandem_last_error_message(), "layers[0].out_features") != NULL);
  mp.field_mask = TANDEM_MODEL_PARAM_SPEC_PATH;
  mp.spec_path = "/nonexistent/spec.json";
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_ERR_IO);
  mp.field_mask = UINT64_C(1) << 50;
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_ERR_UNSUPPORTED);

  /* A small custom model from JSON on 8x8 synthetic data. */
  mp.field_mask = TANDEM_MODEL_PARAM_SPEC_JSON | TANDEM_MODEL_PARAM_SEED | TANDEM_MODEL_PARAM_BACKEND;
  mp.spec_json = "{\"name\": \"tiny\", \"input\": [1, 8, 8], \"layers\": ["
                 "{\"type\": \"conv2d\", \"out_channels\": 4, \"kernel\": 3, \"padding\": 1},"
                 "{\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
                 "{\"type\": \"linear\", \"out_features\": 10}]}";
  mp.seed = 3;
  mp.backend = "reference";
  EXPECT(tandem_model_create(ctx, &mp, &model) == TANDEM_OK);
  ma.field_mask = TANDEM_MODEL_ATTR_COST | TANDEM_MODEL_ATTR_SHAPE | TANDEM_MODEL_ATTR_HELD;
  EXPECT(tandem_model_query(model, &ma) == TANDEM_OK);
  EXPECT(ma.params == 4 * 9 + 4 + 64 * 10 + 10);
  /* Not a pipeline stage: the model holds every layer. */
  EXPECT(ma.held_first_layer == 0 && ma.held_end_layer == ma.num_layers && ma.held_params == ma.params);
  ma.field_mask = UINT64_C(1) << 4;
  EXPECT(tandem_model_query(model, &ma) == TANDEM_ERR_UNSUPPORTED);

  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_SHAPE | TANDEM_DATASET_PARAM_COUNT |
                  TANDEM_DATASET_PARAM_SEED;
  dp.kind = "synthetic";
  dp.channels = 1;
  dp.height = 8;
  dp.width = 8;
  dp.count = 512;
  dp.seed = 1;
  EXPECT(tandem_dataset_create(ctx, &dp, &train) == TANDEM_OK);
  dp.count = 128;
  dp.seed = 1; /* same class templates, other draws: the same task */
  EXPECT(tandem_dataset_create(ctx, &dp, &test) == TANDEM_OK);
  EXPECT(tandem_dataset_info(train, &size, NULL, NULL, NULL, NULL) == TANDEM_OK && size == 512);
  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_PATH;
  dp.kind = "cifar10";
  dp.path = "/nonexistent/cifar";
  {
    tandem_dataset_t* bad = NULL;
    EXPECT(tandem_dataset_create(ctx, &dp, &bad) == TANDEM_ERR_IO && bad == NULL);
    EXPECT(strstr(tandem_last_error_message(), "data_batch_1.bin") != NULL);
  }

  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_LR | TANDEM_OPTIMIZER_PARAM_MOMENTUM |
                  TANDEM_OPTIMIZER_PARAM_SCHEDULE;
  op.kind = TANDEM_OPTIMIZER_SGD;
  op.lr = 0.05f;
  op.momentum = 0.9f;
  op.schedule = "cosine";
  EXPECT(tandem_optimizer_create(ctx, &op, &opt) == TANDEM_OK);
  {
    tandem_optimizer_t* bad = NULL;
    op.schedule = "sometimes";
    EXPECT(tandem_optimizer_create(ctx, &op, &bad) == TANDEM_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(tandem_last_error_message(), "sometimes") != NULL);
  }

  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_EPOCHS | TANDEM_TRAINER_PARAM_SEED |
                  TANDEM_TRAINER_PARAM_PROGRESS | TANDEM_TRAINER_PARAM_NORMALIZE;
  tp.batch_size = 32;
  tp.epochs = 3;
  tp.seed = 7;
  tp.progress = on_progress;
  tp.normalize = 0;
  EXPECT(tandem_trainer_create(model, train, test, opt, &tp, &trainer) == TANDEM_OK);
  EXPECT(tandem_trainer_evaluate(trainer, test, 0, &loss, &acc_before) == TANDEM_OK);

  sr.field_mask = TANDEM_STEP_RESULT_LOSS | TANDEM_STEP_RESULT_LR | TANDEM_STEP_RESULT_EPOCH_END;
  EXPECT(tandem_trainer_step(trainer, &sr) == TANDEM_OK);
  EXPECT(sr.samples == 32 && sr.loss > 0 && sr.lr > 0.049f && !sr.epoch_end);

  er.field_mask = TANDEM_EPOCH_RESULT_TRAIN | TANDEM_EPOCH_RESULT_TEST | TANDEM_EPOCH_RESULT_TIME;
  EXPECT(tandem_trainer_epoch(trainer, &er) == TANDEM_OK);
  EXPECT(er.epoch == 1 && er.train_samples == 512 - 32 && progress_calls == 15);
  EXPECT(er.test_accuracy > acc_before && er.test_accuracy > 0.5 && er.images_per_sec > 0);
  EXPECT(tandem_trainer_progress(trainer, &epochs, &steps) == TANDEM_OK && epochs == 1 && steps == 16);

  /* Checkpoint after epoch 1; a second trainer resumes and both train epoch 2 identically. */
  EXPECT(tandem_trainer_save_checkpoint(trainer, ckpt) == TANDEM_OK);
  EXPECT(tandem_trainer_epoch(trainer, &er) == TANDEM_OK);
  n = (size_t)ma.params;
  saved = (float*)malloc(n * sizeof(float));
  after = (float*)malloc(n * sizeof(float));
  EXPECT(saved != NULL && after != NULL);
  EXPECT(tandem_model_get_params(model, saved, n) == TANDEM_OK);
  EXPECT(tandem_model_get_params(model, saved, n + 1) == TANDEM_ERR_INVALID_ARGUMENT);
  tandem_trainer_destroy(trainer);
  trainer = NULL;
  for (i = 0; i < n; ++i) after[i] = 0.0f;
  EXPECT(tandem_model_set_params(model, after, n) == TANDEM_OK); /* wipe: the checkpoint must restore */
  EXPECT(tandem_trainer_create(model, train, test, opt, &tp, &resumed) == TANDEM_OK);
  EXPECT(tandem_trainer_load_checkpoint(resumed, ckpt) == TANDEM_OK);
  EXPECT(tandem_trainer_epoch(resumed, &er) == TANDEM_OK && er.epoch == 2);
  EXPECT(tandem_model_get_params(model, after, n) == TANDEM_OK);
  EXPECT(memcmp(saved, after, n * sizeof(float)) == 0);

  EXPECT(tandem_trainer_load_checkpoint(resumed, "/nonexistent/x.ckpt") == TANDEM_ERR_IO);
  EXPECT(strstr(tandem_last_error_message(), "/nonexistent/x.ckpt") != NULL);
  EXPECT(tandem_trainer_evaluate(resumed, test, 2, &loss, &acc) == TANDEM_OK && loss > 0 && acc >= 0 && acc <= 1);

  for (i = 0; i < 2 * 64; ++i) input[i] = (float)(i % 7) * 0.1f;
  EXPECT(tandem_model_forward(model, input, 2, logits, 20) == TANDEM_OK);
  EXPECT(!isnan(logits[0]) && !isnan(logits[19]));
  EXPECT(tandem_model_forward(model, input, 2, logits, 19) == TANDEM_ERR_INVALID_ARGUMENT);

  /* Loss scaling (issue #14): off reports scale 1; dynamic starts at its init and keeps it over finite f32 steps;
   * bad values are refused naming the field; NULL outs are fine. */
  {
    tandem_trainer_params_t lp = TANDEM_TRAINER_PARAMS_INIT;
    tandem_trainer_t* scaled = NULL;
    tandem_trainer_t* bad = NULL;
    double scale = 0;
    int64_t skipped = -1;
    EXPECT(tandem_trainer_loss_scale(resumed, &scale, &skipped) == TANDEM_OK && scale == 1.0 && skipped == 0);
    EXPECT(tandem_trainer_loss_scale(resumed, NULL, NULL) == TANDEM_OK);
    EXPECT(tandem_trainer_loss_scale(NULL, &scale, &skipped) == TANDEM_ERR_INVALID_ARGUMENT);
    lp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_LOSS_SCALE | TANDEM_TRAINER_PARAM_LOSS_SCALER;
    lp.batch_size = 32;
    lp.loss_scale = TANDEM_LOSS_SCALE_DYNAMIC;
    lp.loss_scale_init = 4096;
    lp.loss_scale_growth = 2;
    lp.loss_scale_backoff = 0.5;
    lp.loss_scale_growth_interval = 100;
    EXPECT(tandem_trainer_create(model, train, NULL, opt, &lp, &scaled) == TANDEM_OK);
    EXPECT(tandem_trainer_loss_scale(scaled, &scale, &skipped) == TANDEM_OK && scale == 4096.0 && skipped == 0);
    EXPECT(tandem_trainer_step(scaled, &sr) == TANDEM_OK && sr.samples == 32 && sr.loss > 0);
    EXPECT(tandem_trainer_loss_scale(scaled, &scale, &skipped) == TANDEM_OK && scale == 4096.0 && skipped == 0);
    EXPECT(tandem_trainer_progress(scaled, NULL, &steps) == TANDEM_OK && steps == 1);
    tandem_trainer_destroy(scaled);
    lp.loss_scale = -2;
    EXPECT(tandem_trainer_create(model, train, NULL, opt, &lp, &bad) == TANDEM_ERR_INVALID_ARGUMENT && bad == NULL);
    EXPECT(strstr(tandem_last_error_message(), "loss_scale") != NULL);
    lp.loss_scale = TANDEM_LOSS_SCALE_DYNAMIC;
    lp.loss_scale_backoff = 1.0;
    EXPECT(tandem_trainer_create(model, train, NULL, opt, &lp, &bad) == TANDEM_ERR_INVALID_ARGUMENT && bad == NULL);
    EXPECT(strstr(tandem_last_error_message(), "backoff") != NULL);
    lp.loss_scale = 128; /* fixed: the dynamic fields are still checked when flagged */
    EXPECT(tandem_trainer_create(model, train, NULL, opt, &lp, &bad) == TANDEM_ERR_INVALID_ARGUMENT && bad == NULL);
    lp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_LOSS_SCALE;
    EXPECT(tandem_trainer_create(model, train, NULL, opt, &lp, &scaled) == TANDEM_OK);
    EXPECT(tandem_trainer_loss_scale(scaled, &scale, NULL) == TANDEM_OK && scale == 128.0);
    tandem_trainer_destroy(scaled);
  }

  tandem_trainer_destroy(resumed);
  tandem_trainer_destroy(NULL);
  tandem_optimizer_destroy(opt);
  tandem_dataset_destroy(train);
  tandem_dataset_destroy(test);
  tandem_model_destroy(model);
  tandem_model_destroy(spec_only);
  tandem_model_destroy(NULL);
  tandem_context_destroy(ctx);
  free(saved);
  free(after);
  remove(ckpt);
  return 0;
}
