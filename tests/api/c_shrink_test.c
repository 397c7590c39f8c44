/* tandem_comm_shrink from C99 (-pedantic -Werror): four ranks as POSIX threads over the inproc transport;
 * rank 3 aborts and leaves, the three survivors shrink and allreduce in the survivors' communicator;
 * shrinking a healthy communicator and bad arguments are refused with clear errors. */
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
#include "../common/c_comm.h"

#define WORLD 4
#define COUNT 1000

static tandem_context_t* g_ctx = NULL;

static float sum_over(tandem_comm_t* comm, float value, tandem_status_t* status) {
  static const size_t n = COUNT;
  float* in = (float*)malloc(n * sizeof(float));
  float* out = (float*)malloc(n * sizeof(float));
  float result;
  size_t i;
  EXPECT(in != NULL && out != NULL);
  for (i = 0; i < n; ++i) in[i] = value;
  *status = tandem_comm_allreduce(comm, in, out, n, TANDEM_F32, TANDEM_SUM);
  result = out[0];
  for (i = 0; *status == TANDEM_OK && i < n; ++i) EXPECT(out[i] == result);
  free(in);
  free(out);
  return result;
}

static void* rank_main(void* arg) {
  const int rank = (int)(intptr_t)arg;
  tandem_comm_t *comm = inproc_comm(g_ctx, rank, WORLD, 29871, "c-shrink-test", 4000), *survivors = NULL;
  tandem_status_t st = TANDEM_OK, async = TANDEM_OK;
  int32_t new_rank = -1, new_size = -1;
  EXPECT(sum_over(comm, 1.f, &st) == (float)WORLD && st == TANDEM_OK);
  /* Nobody died yet: nothing to remove, and the communicator stays usable. */
  EXPECT_FAIL(tandem_comm_shrink(comm, &survivors), TANDEM_ERR_INVALID_ARGUMENT, "has not failed");
  EXPECT(survivors == NULL);
  EXPECT(sum_over(comm, 1.f, &st) == (float)WORLD && st == TANDEM_OK);
  if (rank == WORLD - 1) {
    EXPECT_OK(tandem_comm_abort(comm, "rank 3 leaves the job"));
    tandem_comm_destroy(comm);
    return NULL;
  }
  sum_over(comm, 1.f, &st);
  EXPECT(st == TANDEM_ERR_PEER_FAILURE || st == TANDEM_ERR_TIMEOUT);
  EXPECT_FAIL(tandem_comm_shrink(NULL, &survivors), TANDEM_ERR_INVALID_ARGUMENT, "failed");
  EXPECT_FAIL(tandem_comm_shrink(comm, NULL), TANDEM_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_OK(tandem_comm_shrink(comm, &survivors));
  EXPECT_OK(tandem_comm_rank(survivors, &new_rank));
  EXPECT_OK(tandem_comm_size(survivors, &new_size));
  EXPECT(new_size == WORLD - 1 && new_rank == rank);
  /* The old communicator keeps its failure; the new one is healthy. */
  EXPECT_OK(tandem_comm_get_async_status(comm, &async, NULL, NULL));
  EXPECT(async != TANDEM_OK);
  EXPECT_OK(tandem_comm_get_async_status(survivors, &async, NULL, NULL));
  EXPECT(async == TANDEM_OK);
  EXPECT(sum_over(survivors, (float)(rank + 1), &st) == 6.f && st == TANDEM_OK); /* 1 + 2 + 3 */
  EXPECT_OK(tandem_comm_barrier(survivors));
  tandem_comm_destroy(survivors);
  tandem_comm_destroy(comm);
  return NULL;
}

int main(void) {
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  pthread_t threads[WORLD];
  int r;
  EXPECT_OK(tandem_context_create(&cp, &g_ctx));
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_create(&threads[r], NULL, rank_main, (void*)(intptr_t)r) == 0);
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_join(threads[r], NULL) == 0);
  tandem_context_destroy(g_ctx);
  printf("c_shrink_test: ok\n");
  return 0;
}
