/* tandem_comm_pending_joins, tandem_comm_grow and tandem_comm_join from C99 (-pedantic -Werror): a job of two
 * ranks (POSIX threads, inproc transport) with max_ranks 3; two joiners ask, the ranks admit them at their next
 * "step boundary": the first joins (a world of three that allreduces), the second is refused naming the bound.
 * Bad arguments are refused with clear errors. */
#define _POSIX_C_SOURCE 200112L /* nanosleep */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>
#include <time.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

static int g_rank = -1; /* printed by failed checks; threads share it, so it names some rank */

#include "../common/c_expect.h"
#include "../common/c_comm.h"

#define PORT 29873
#define SECRET "c-grow-test"

static tandem_context_t* g_ctx = NULL;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_ready = 0, g_admitted = 0, g_refused = 0;

static void nap(void) {
  struct timespec ts = {0, 5000000}; /* 5 ms */
  nanosleep(&ts, NULL);
}

static double sum_over(tandem_comm_t* comm, double v) {
  double out = 0;
  EXPECT_OK(tandem_comm_allreduce(comm, &v, &out, 1, TANDEM_F64, TANDEM_SUM));
  return out;
}

static void* old_rank(void* arg) {
  const int rank = (int)(intptr_t)arg;
  tandem_comm_t *comm = inproc_comm(g_ctx, rank, 2, PORT, SECRET, 10000), *grown = NULL;
  int64_t pending = -1;
  int i;
  int32_t r = -1, n = -1;
  pthread_mutex_lock(&g_mu);
  ++g_ready;
  pthread_mutex_unlock(&g_mu);
  EXPECT_FAIL(tandem_comm_pending_joins(comm, NULL), TANDEM_ERR_INVALID_ARGUMENT, "pending is NULL");
  EXPECT_FAIL(tandem_comm_grow(comm, 3, NULL), TANDEM_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_FAIL(tandem_comm_grow(comm, -1, &grown), TANDEM_ERR_INVALID_ARGUMENT, "max_ranks");
  for (i = 0; i < 2000; ++i) { /* bounded: the joiners ask within 10 s */
    EXPECT_OK(tandem_comm_pending_joins(comm, &pending));
    if (pending >= 2) break;
    nap();
  }
  EXPECT(pending == 2);
  EXPECT_OK(tandem_comm_grow(comm, 3, &grown));
  EXPECT(grown != NULL);
  EXPECT_OK(tandem_comm_rank(grown, &r));
  EXPECT_OK(tandem_comm_size(grown, &n));
  EXPECT(r == rank && n == 3);
  EXPECT(sum_over(grown, 1.0) == 3.0);
  EXPECT(sum_over(comm, 1.0) == 2.0); /* the old communicator is still usable */
  /* Nobody waits now: no admission, comm unchanged. */
  EXPECT_OK(tandem_comm_pending_joins(comm, &pending));
  EXPECT(pending == 0);
  {
    tandem_comm_t* none = comm; /* overwritten with NULL */
    EXPECT_OK(tandem_comm_grow(comm, 3, &none));
    EXPECT(none == NULL);
  }
  EXPECT_OK(tandem_comm_barrier(grown));
  tandem_comm_destroy(grown);
  tandem_comm_destroy(comm);
  return NULL;
}

static void* joiner(void* arg) {
  const int index = (int)(intptr_t)arg;
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  tandem_comm_t* comm = NULL;
  tandem_status_t st;
  int ready = 0, i;
  for (i = 0; i < 2000 && ready < 2; ++i) {
    pthread_mutex_lock(&g_mu);
    ready = g_ready;
    pthread_mutex_unlock(&g_mu);
    nap();
  }
  p.field_mask = TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_TRANSPORT |
                 TANDEM_COMM_PARAM_TIMEOUT_MS | TANDEM_COMM_PARAM_MASTER_PORT | TANDEM_COMM_PARAM_SECRET;
  p.rank = index;
  p.size = 2; /* inproc: the job's size at creation */
  p.transport = "inproc";
  p.timeout_ms = 10000;
  p.master_port = PORT;
  p.secret = SECRET;
  EXPECT_FAIL(tandem_comm_join(g_ctx, &p, 0, &comm), TANDEM_ERR_INVALID_ARGUMENT, "wait_ms");
  EXPECT_FAIL(tandem_comm_join(g_ctx, &p, 1000, NULL), TANDEM_ERR_INVALID_ARGUMENT, "out is NULL");
  st = tandem_comm_join(g_ctx, &p, 20000, &comm);
  if (st == TANDEM_OK) {
    int32_t r = -1;
    EXPECT_OK(tandem_comm_rank(comm, &r));
    EXPECT(r == 2);
    EXPECT(sum_over(comm, 1.0) == 3.0);
    EXPECT_OK(tandem_comm_barrier(comm));
    tandem_comm_destroy(comm);
    pthread_mutex_lock(&g_mu);
    ++g_admitted;
    pthread_mutex_unlock(&g_mu);
  } else {
    EXPECT(st == TANDEM_ERR_UNSUPPORTED && strstr(tandem_last_error_message(), "--max-ranks is 3") != NULL);
    EXPECT(comm == NULL);
    pthread_mutex_lock(&g_mu);
    ++g_refused;
    pthread_mutex_unlock(&g_mu);
  }
  return NULL;
}

int main(void) {
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  pthread_t threads[4];
  int t;
  EXPECT_OK(tandem_context_create(&cp, &g_ctx));
  for (t = 0; t < 2; ++t) EXPECT(pthread_create(&threads[t], NULL, old_rank, (void*)(intptr_t)t) == 0);
  for (t = 2; t < 4; ++t) EXPECT(pthread_create(&threads[t], NULL, joiner, (void*)(intptr_t)(t - 2)) == 0);
  for (t = 0; t < 4; ++t) EXPECT(pthread_join(threads[t], NULL) == 0);
  EXPECT(g_admitted == 1 && g_refused == 1);
  tandem_context_destroy(g_ctx);
  printf("c_grow_test: ok (1 admitted, 1 refused at max_ranks 3)\n");
  return 0;
}
