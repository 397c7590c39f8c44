/* The parameters of the parameter-server and averaging strategies through the C ABI, from C99 (-pedantic -Werror):
 * each field of tandem_parallel_params_t behind TANDEM_PARALLEL_PARAM_SERVERS .. _LOCALSGD round-trips through
 * tandem_trainer_parallel_query (TANDEM_PARALLEL_ATTR_SYNC); a bad value is refused with
 * TANDEM_ERR_INVALID_ARGUMENT naming the field, and so is a field given (its bit set) to a strategy that does not
 * read it, or more FedAvg clients than training samples; an unknown bit with TANDEM_ERR_UNSUPPORTED; defaults resolve
 * (alpha 0 -> 0.9 / workers, clients 0 -> one per worker). One rank (comm NULL), then a 2-rank ps-async job (a
 * server and a worker as POSIX threads over the inproc transport) that reports its staleness rule
 * (TANDEM_PARALLEL_ATTR_ASYNC) and trains an epoch. Exits non-zero on the first failed check. */
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

static int g_rank = 0;

#include "../common/c_expect.h"

typedef struct {
  tandem_context_t* ctx;
  tandem_model_t* model;
  tandem_dataset_t* data;
  tandem_optimizer_t* opt;
  tandem_trainer_params_t tp;
} Env;

/* The model every job here trains: an MLP on 1x6x6 inputs, 3 classes, seed 3. */
static tandem_model_t* make_model(tandem_context_t* ctx) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_t* m = NULL;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES |
                  TANDEM_MODEL_PARAM_SEED;
  mp.name = "mlp";
  mp.input_channels = 1;
  mp.input_height = 6;
  mp.input_width = 6;
  mp.num_classes = 3;
  mp.seed = 3;
  EXPECT_OK(tandem_model_create(ctx, &mp, &m));
  return m;
}

static void make_env(Env* e) {
  tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  memset(e, 0, sizeof *e);
  EXPECT_OK(tandem_context_create(NULL, &e->ctx));
  e->model = make_model(e->ctx);
  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_SHAPE | TANDEM_DATASET_PARAM_NUM_CLASSES |
                  TANDEM_DATASET_PARAM_COUNT | TANDEM_DATASET_PARAM_SEED;
  dp.kind = "synthetic";
  dp.channels = 1;
  dp.height = 6;
  dp.width = 6;
  dp.num_classes = 3;
  dp.count = 64;
  dp.seed = 5;
  EXPECT_OK(tandem_dataset_create(e->ctx, &dp, &e->data));
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_LR;
  op.kind = TANDEM_OPTIMIZER_SGD;
  op.lr = 0.05f;
  EXPECT_OK(tandem_optimizer_create(e->ctx, &op, &e->opt));
  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_SEED | TANDEM_TRAINER_PARAM_PREFETCH;
  tp.batch_size = 8;
  tp.seed = 7;
  tp.prefetch = 0;
  e->tp = tp;
}

static void free_env(Env* e) {
  tandem_optimizer_destroy(e->opt);
  tandem_dataset_destroy(e->data);
  tandem_model_destroy(e->model);
  tandem_context_destroy(e->ctx);
}

static tandem_status_t create(Env* e, const tandem_parallel_params_t* pp, tandem_trainer_t** out) {
  return tandem_trainer_create_parallel(e->model, e->data, NULL, e->opt, &e->tp, pp, NULL, out);
}

/* Every new field set to a value other than its default; the bits set are those `s` reads. */
static tandem_parallel_params_t all_fields(tandem_strategy_t s) {
  tandem_parallel_params_t p = TANDEM_PARALLEL_PARAMS_INIT;
  p.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY;
  if (s == TANDEM_STRATEGY_PS || s == TANDEM_STRATEGY_PS_ASYNC || s == TANDEM_STRATEGY_SSP)
    p.field_mask |= TANDEM_PARALLEL_PARAM_SERVERS;
  if (s == TANDEM_STRATEGY_SSP) p.field_mask |= TANDEM_PARALLEL_PARAM_STALENESS;
  if (s == TANDEM_STRATEGY_PS_ASYNC) p.field_mask |= TANDEM_PARALLEL_PARAM_STALENESS_LR;
  if (s == TANDEM_STRATEGY_EASGD) p.field_mask |= TANDEM_PARALLEL_PARAM_EASGD;
  if (s == TANDEM_STRATEGY_FEDAVG) p.field_mask |= TANDEM_PARALLEL_PARAM_FEDAVG;
  if (s == TANDEM_STRATEGY_LOCALSGD) p.field_mask |= TANDEM_PARALLEL_PARAM_LOCALSGD;
  p.strategy = s;
  p.servers = 3;
  p.staleness = 5;
  p.staleness_lr = TANDEM_STALENESS_LR_INVERSE;
  p.tau = 6;
  p.alpha = 0.25;
  p.easgd_async = 0;
  p.clients = 7;
  p.dirichlet_alpha = 0.5;
  p.client_fraction = 0.75;
  p.local_epochs = 2;
  p.round_deadline_s = 1.5;
  p.average_every = 9;
  p.warmup_steps = 4;
  return p;
}

static tandem_parallel_attr_t query(tandem_trainer_t* t) {
  tandem_parallel_attr_t a = TANDEM_PARALLEL_ATTR_INIT;
  a.field_mask = TANDEM_PARALLEL_ATTR_SYNC | TANDEM_PARALLEL_ATTR_PLAN;
  EXPECT_OK(tandem_trainer_parallel_query(t, &a));
  return a;
}

/* One rank of the 2-rank ps-async job (rank 0 the server, rank 1 the worker), `staleness_lr` MOMENTUM: the rule is
 * reported as given on both ranks, and the epoch trains. */
static Env g_job;

static void* ps_async_rank(void* arg) {
  const int rank = (int)(intptr_t)arg;
  tandem_comm_params_t cp = TANDEM_COMM_PARAMS_INIT;
  tandem_comm_t* comm = NULL;
  tandem_model_t* model = NULL;
  tandem_trainer_t* t = NULL;
  tandem_parallel_params_t p = TANDEM_PARALLEL_PARAMS_INIT;
  tandem_parallel_attr_t a = TANDEM_PARALLEL_ATTR_INIT;
  tandem_epoch_result_t er = TANDEM_EPOCH_RESULT_INIT;
  cp.field_mask = TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_TRANSPORT |
                  TANDEM_COMM_PARAM_TIMEOUT_MS | TANDEM_COMM_PARAM_MASTER_PORT | TANDEM_COMM_PARAM_SECRET;
  cp.rank = rank;
  cp.size = 2;
  cp.transport = "inproc";
  cp.timeout_ms = 10000;
  cp.master_port = 29874;
  cp.secret = "c-strategy-params-test";
  EXPECT_OK(tandem_comm_create(g_job.ctx, &cp, &comm));
  model = make_model(g_job.ctx); /* each rank its own (a trainer holds and trains it), the same seed */
  p.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_SERVERS | TANDEM_PARALLEL_PARAM_STALENESS_LR;
  p.strategy = TANDEM_STRATEGY_PS_ASYNC;
  p.servers = 1;
  p.staleness_lr = TANDEM_STALENESS_LR_MOMENTUM;
  EXPECT_OK(tandem_trainer_create_parallel(model, g_job.data, NULL, g_job.opt, &g_job.tp, &p, comm, &t));
  a.field_mask = TANDEM_PARALLEL_ATTR_ASYNC | TANDEM_PARALLEL_ATTR_SYNC | TANDEM_PARALLEL_ATTR_PLAN;
  a.staleness_lr = (tandem_staleness_lr_t)-3;
  EXPECT_OK(tandem_trainer_parallel_query(t, &a));
  EXPECT(a.staleness_lr == TANDEM_STALENESS_LR_MOMENTUM);
  EXPECT(strcmp(a.strategy, "ps-async") == 0 && a.servers == 1 && a.workers == 1);
  er.field_mask = TANDEM_EPOCH_RESULT_TRAIN;
  EXPECT_OK(tandem_trainer_epoch(t, &er));
  EXPECT(er.epoch == 1 && isfinite(er.train_loss));
  tandem_trainer_destroy(t);
  tandem_model_destroy(model);
  tandem_comm_destroy(comm);
  return NULL;
}

/* A bad value of one field, given to a strategy that reads it: refused before any trainer exists, the message naming
 * the field. */
#define EXPECT_REFUSED(strategy, field, value, needle)                                      \
  do {                                                                                      \
    tandem_parallel_params_t bad_ = all_fields(strategy);                                   \
    tandem_trainer_t* t_ = NULL;                                                            \
    bad_.field = (value);                                                                   \
    EXPECT_FAIL(create(&e, &bad_, &t_), TANDEM_ERR_INVALID_ARGUMENT, needle);               \
    EXPECT(t_ == NULL);                                                                     \
  } while (0)

/* A field's bit set for a strategy that does not read it: refused, naming the field and its readers. */
#define EXPECT_NOT_READ(strategy, bit, needle)                                              \
  do {                                                                                      \
    tandem_parallel_params_t bad_ = all_fields(strategy);                                   \
    tandem_trainer_t* t_ = NULL;                                                            \
    bad_.field_mask |= (bit);                                                               \
    EXPECT_FAIL(create(&e, &bad_, &t_), TANDEM_ERR_INVALID_ARGUMENT, needle);               \
    EXPECT(t_ == NULL);                                                                     \
  } while (0)

int main(void) {
  Env e;
  tandem_trainer_t* t = NULL;
  tandem_parallel_params_t p;
  tandem_parallel_attr_t a;
  make_env(&e);

  /* Round trip: each one-rank job keeps the fields its strategy reads as given (the others keep their defaults). */
  p = all_fields(TANDEM_STRATEGY_LOCALSGD);
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(strcmp(a.strategy, "localsgd") == 0);
  EXPECT(a.workers == 1);
  EXPECT(a.servers == 0); /* localsgd has no server ranks */
  EXPECT(a.staleness == 2 && a.tau == 4 && a.easgd_async == 0 && a.local_epochs == 1);
  EXPECT(a.average_every == 9 && a.warmup_steps == 4);
  {
    tandem_step_result_t r = TANDEM_STEP_RESULT_INIT;
    r.field_mask = TANDEM_STEP_RESULT_LOSS;
    EXPECT_OK(tandem_trainer_step(t, &r));
    EXPECT(isfinite(r.loss));
  }
  tandem_trainer_destroy(t);
  t = NULL;
  p = all_fields(TANDEM_STRATEGY_EASGD);
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(strcmp(a.strategy, "easgd") == 0 && a.tau == 6 && a.alpha == 0.25 && a.easgd_async == 0);
  EXPECT(a.average_every == 8 && a.warmup_steps == 0);
  tandem_trainer_destroy(t);
  t = NULL;
  p = all_fields(TANDEM_STRATEGY_FEDAVG);
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(strcmp(a.strategy, "fedavg") == 0 && a.clients == 7 && a.dirichlet_alpha == 0.5);
  EXPECT(a.client_fraction == 0.75 && a.local_epochs == 2 && a.round_deadline_s == 1.5 && a.tau == 4);
  tandem_trainer_destroy(t);
  t = NULL;

  /* Defaults resolved: EASGD's alpha 0 -> 0.9 / workers; FedAvg's clients 0 -> one per worker. */
  p = all_fields(TANDEM_STRATEGY_EASGD);
  p.alpha = 0;
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(strcmp(a.strategy, "easgd") == 0 && fabs(a.alpha - 0.9) < 1e-12 && a.tau == 6);
  tandem_trainer_destroy(t);
  t = NULL;
  p = all_fields(TANDEM_STRATEGY_FEDAVG);
  p.clients = 0;
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(strcmp(a.strategy, "fedavg") == 0 && a.clients == 1 && a.local_epochs == 2);
  tandem_trainer_destroy(t);
  t = NULL;

  /* Bad values, each naming its field. */
  EXPECT_REFUSED(TANDEM_STRATEGY_PS, servers, 0, "parallel->servers");
  EXPECT_REFUSED(TANDEM_STRATEGY_SSP, staleness, -1, "parallel->staleness");
  EXPECT_REFUSED(TANDEM_STRATEGY_EASGD, tau, 0, "parallel->tau");
  EXPECT_REFUSED(TANDEM_STRATEGY_EASGD, alpha, 1.0, "parallel->alpha");
  EXPECT_REFUSED(TANDEM_STRATEGY_EASGD, alpha, -0.5, "parallel->alpha");
  EXPECT_REFUSED(TANDEM_STRATEGY_EASGD, alpha, NAN, "parallel->alpha");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, clients, -2, "parallel->clients");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, dirichlet_alpha, -1.0, "parallel->dirichlet_alpha");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, client_fraction, 0.0, "parallel->client_fraction");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, client_fraction, 1.5, "parallel->client_fraction");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, local_epochs, 0, "parallel->local_epochs");
  EXPECT_REFUSED(TANDEM_STRATEGY_FEDAVG, round_deadline_s, -1.0, "parallel->round_deadline_s");
  EXPECT_REFUSED(TANDEM_STRATEGY_LOCALSGD, average_every, 0, "parallel->average_every");
  EXPECT_REFUSED(TANDEM_STRATEGY_LOCALSGD, warmup_steps, -3, "parallel->warmup_steps");

  /* A strategy's field given to another strategy was silently ignored (the job ran as if it were not there): now
   * refused, naming the field and the strategies that read it. */
  EXPECT_NOT_READ(TANDEM_STRATEGY_PS_ASYNC, TANDEM_PARALLEL_PARAM_STALENESS,
                  "parallel->staleness (TANDEM_PARALLEL_PARAM_STALENESS) is read by strategy ssp only, not by ps-async");
  EXPECT_NOT_READ(TANDEM_STRATEGY_FEDAVG, TANDEM_PARALLEL_PARAM_EASGD,
                  "parallel->tau, alpha, easgd_async (TANDEM_PARALLEL_PARAM_EASGD) are read by strategy easgd only, "
                  "not by fedavg");
  EXPECT_NOT_READ(TANDEM_STRATEGY_EASGD, TANDEM_PARALLEL_PARAM_FEDAVG, "parallel->clients, dirichlet_alpha");
  EXPECT_NOT_READ(TANDEM_STRATEGY_EASGD, TANDEM_PARALLEL_PARAM_LOCALSGD,
                  "parallel->average_every, warmup_steps (TANDEM_PARALLEL_PARAM_LOCALSGD) are read by strategy localsgd");
  EXPECT_NOT_READ(TANDEM_STRATEGY_DDP, TANDEM_PARALLEL_PARAM_SERVERS,
                  "parallel->servers (TANDEM_PARALLEL_PARAM_SERVERS) is read by strategies ps, ps-async, ssp and easgd "
                  "with easgd_async only, not by ddp");
  EXPECT_NOT_READ(TANDEM_STRATEGY_EASGD, TANDEM_PARALLEL_PARAM_SERVERS, "not by easgd without easgd_async");
  EXPECT_NOT_READ(TANDEM_STRATEGY_LOCALSGD, TANDEM_PARALLEL_PARAM_STALENESS, "not by localsgd");
  {
    /* No strategy bit: the default, single, reads none of them. */
    tandem_parallel_params_t q = all_fields(TANDEM_STRATEGY_SSP);
    q.field_mask &= ~TANDEM_PARALLEL_PARAM_STRATEGY;
    EXPECT_FAIL(create(&e, &q, &t), TANDEM_ERR_INVALID_ARGUMENT, "not by single");
    EXPECT(t == NULL);
  }

  /* FedAvg: more clients than the 64 training samples leaves some with none: refused naming both counts. */
  p = all_fields(TANDEM_STRATEGY_FEDAVG);
  p.clients = 65;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT,
              "parallel->clients = 65 is more than the 64 training samples");
  EXPECT(t == NULL);
  p.clients = 64;
  EXPECT_OK(create(&e, &p, &t));
  tandem_trainer_destroy(t);
  t = NULL;

  /* A field whose bit is not set is not read: a bad value there is ignored. */
  p = all_fields(TANDEM_STRATEGY_LOCALSGD);
  p.tau = -7;
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  EXPECT(a.tau == 4); /* the default */
  tandem_trainer_destroy(t);
  t = NULL;

  /* server_replicas: negative, or on a strategy without servers, refused naming it; unset, the job reports none. */
  p = all_fields(TANDEM_STRATEGY_LOCALSGD);
  p.field_mask |= TANDEM_PARALLEL_PARAM_SERVER_REPLICAS;
  p.server_replicas = -1;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT, "parallel->server_replicas must be >= 0");
  EXPECT(t == NULL);
  p.server_replicas = 1;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT, "strategy localsgd has no parameter servers");
  EXPECT(t == NULL);
  p.field_mask &= ~TANDEM_PARALLEL_PARAM_SERVER_REPLICAS; /* not read without its bit */
  EXPECT_OK(create(&e, &p, &t));
  a = query(t);
  {
    tandem_parallel_attr_t r = TANDEM_PARALLEL_ATTR_INIT;
    r.field_mask = TANDEM_PARALLEL_ATTR_REPLICAS;
    r.server_replicas = r.shards = -5;
    EXPECT_OK(tandem_trainer_parallel_query(t, &r));
    EXPECT(r.server_replicas == 0 && r.shards == 0);
    /* a strategy without a staleness rule reports none */
    r.field_mask = TANDEM_PARALLEL_ATTR_ASYNC;
    r.staleness_lr = TANDEM_STALENESS_LR_INVERSE;
    EXPECT_OK(tandem_trainer_parallel_query(t, &r));
    EXPECT(r.staleness_lr == TANDEM_STALENESS_LR_NONE);
    r.field_mask = TANDEM_PARALLEL_ATTR_ASYNC << 1;
    EXPECT_FAIL(tandem_trainer_parallel_query(t, &r), TANDEM_ERR_UNSUPPORTED, "tandem_parallel_attr_t");
  }
  tandem_trainer_destroy(t);
  t = NULL;

  /* staleness_lr (PS_ASYNC only): a value outside tandem_staleness_lr_t refused naming it; its bit set for another
   * strategy refused naming its reader; read by PS_ASYNC, whose one-rank job then fails only for want of ranks (the
   * field passed). */
  EXPECT_REFUSED(TANDEM_STRATEGY_PS_ASYNC, staleness_lr, (tandem_staleness_lr_t)7, "parallel->staleness_lr");
  EXPECT_REFUSED(TANDEM_STRATEGY_PS_ASYNC, staleness_lr, (tandem_staleness_lr_t)-1, "parallel->staleness_lr");
  EXPECT_NOT_READ(TANDEM_STRATEGY_SSP, TANDEM_PARALLEL_PARAM_STALENESS_LR,
                  "parallel->staleness_lr (TANDEM_PARALLEL_PARAM_STALENESS_LR) is read by strategy ps-async only, not "
                  "by ssp");
  EXPECT_NOT_READ(TANDEM_STRATEGY_PS, TANDEM_PARALLEL_PARAM_STALENESS_LR, "not by ps ");
  EXPECT_NOT_READ(TANDEM_STRATEGY_LOCALSGD, TANDEM_PARALLEL_PARAM_STALENESS_LR, "not by localsgd");
  p = all_fields(TANDEM_STRATEGY_PS_ASYNC);
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT, "strategy ps-async with 3 server(s) needs at least 4 ranks");
  EXPECT(t == NULL);
  p.staleness_lr = TANDEM_STALENESS_LR_MOMENTUM;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT, "strategy ps-async with 3 server(s) needs at least 4 ranks");
  EXPECT(t == NULL);
  p.field_mask &= ~TANDEM_PARALLEL_PARAM_STALENESS_LR; /* not read without its bit: a bad value is ignored */
  p.staleness_lr = (tandem_staleness_lr_t)7;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_INVALID_ARGUMENT, "strategy ps-async with 3 server(s) needs at least 4 ranks");
  EXPECT(t == NULL);

  /* The next bit is unknown to this library. */
  p = all_fields(TANDEM_STRATEGY_LOCALSGD);
  p.field_mask |= TANDEM_PARALLEL_PARAM_STALENESS_LR << 1;
  EXPECT_FAIL(create(&e, &p, &t), TANDEM_ERR_UNSUPPORTED, "tandem_parallel_params_t");

  /* ps-async on 2 ranks: the rule given is the rule reported, on the server and on the worker. */
  {
    pthread_t threads[2];
    int r;
    g_job = e;
    for (r = 0; r < 2; ++r) EXPECT(pthread_create(&threads[r], NULL, ps_async_rank, (void*)(intptr_t)r) == 0);
    for (r = 0; r < 2; ++r) EXPECT(pthread_join(threads[r], NULL) == 0);
  }

  free_env(&e);
  printf("c_strategy_params_test: ok\n");
  return 0;
}
