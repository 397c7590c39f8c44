/* tandem_store_serve / tandem_store_port / tandem_store_destroy from C99 (-pedantic -Werror), issue #17: a
 * rendezvous store served by this process, not by rank 0, so that rank 0's death is survived. Three rank processes
 * (forked before the store's thread exists) meet over tcp through it (TANDEM_STORE); rank 0 is SIGKILLed after an
 * allreduce; ranks 1 and 2 see the failure, shrink to a world of 2 (old rank 1 becomes rank 0) and allreduce
 * correctly. Also: a wrong secret is refused by the store (TANDEM_ERR_AUTH), a taken port and bad arguments are
 * refused naming what was wrong. Every process is bounded (alarm) and reaped by pid. */
#define _POSIX_C_SOURCE 200809L /* fork, kill, setenv, alarm */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <tandem/tandem.h>
#include <unistd.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

static int g_rank = -1;

#include "../common/c_expect.h"

#define SECRET "c-store-test-secret"
#define RANKS 3

static double sum_over(tandem_comm_t* comm, double v) {
  double out = -1;
  EXPECT_OK(tandem_comm_allreduce(comm, &v, &out, 1, TANDEM_F64, TANDEM_SUM));
  return out;
}

static tandem_status_t tcp_comm(tandem_context_t* ctx, int rank, int size, int port, const char* secret,
                                int64_t timeout_ms, tandem_comm_t** comm) {
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  p.field_mask = TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_TRANSPORT |
                 TANDEM_COMM_PARAM_TIMEOUT_MS | TANDEM_COMM_PARAM_MASTER_ADDR | TANDEM_COMM_PARAM_MASTER_PORT |
                 TANDEM_COMM_PARAM_SECRET;
  p.rank = rank;
  p.size = size;
  p.transport = "tcp";
  p.timeout_ms = timeout_ms;
  p.master_addr = "127.0.0.1";
  p.master_port = port;
  p.secret = secret;
  return tandem_comm_create(ctx, &p, comm);
}

/* One rank's process: waits for the store's port on `in`, then works; rank 0 reports on `out` and is killed. */
static int run_rank(int rank, int in, int out) {
  int32_t port = 0, r = -1, n = -1;
  char store[64];
  tandem_context_t* ctx = NULL;
  tandem_comm_t *comm = NULL, *shrunk = NULL;
  tandem_status_t st;
  g_rank = rank;
  alarm(60); /* never outlive a broken test */
  EXPECT(read(in, &port, sizeof(port)) == (ssize_t)sizeof(port) && port > 0);
  snprintf(store, sizeof(store), "127.0.0.1:%d", (int)port);
  EXPECT(setenv("TANDEM_STORE", store, 1) == 0); /* read into the context's snapshot below */
  EXPECT_OK(tandem_context_create(NULL, &ctx));
  EXPECT_OK(tcp_comm(ctx, rank, RANKS, port, SECRET, 4000, &comm));
  EXPECT(sum_over(comm, rank + 1.0) == 6.0);
  if (rank == 0) {
    const char ready = 'r';
    EXPECT(write(out, &ready, 1) == 1);
    for (;;) pause(); /* SIGKILLed by the parent, holding the communicator */
  }
  /* Rank 0 is gone: the next collective fails, naming it or the peer that saw it. */
  st = tandem_comm_allreduce(comm, &port, &r, 1, TANDEM_I32, TANDEM_SUM);
  EXPECT(st == TANDEM_ERR_PEER_FAILURE || st == TANDEM_ERR_TIMEOUT);
  EXPECT_OK(tandem_comm_shrink(comm, &shrunk));
  EXPECT_OK(tandem_comm_rank(shrunk, &r));
  EXPECT_OK(tandem_comm_size(shrunk, &n));
  EXPECT(n == 2 && r == rank - 1); /* the lowest survivor is rank 0 now */
  EXPECT(sum_over(shrunk, rank + 1.0) == 5.0); /* old ranks 1 and 2 */
  EXPECT(sum_over(shrunk, 1.0) == 2.0);
  EXPECT_OK(tandem_comm_barrier(shrunk));
  tandem_comm_destroy(shrunk);
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  return 0;
}

int main(void) {
  int to_rank[RANKS][2], from_zero[2], i, status = 0;
  pid_t pid[RANKS];
  int32_t port = 0;
  char ready = 0;
  tandem_context_t* ctx = NULL;
  tandem_store_t *store = NULL, *second = NULL;
  tandem_comm_t* intruder = NULL;

  /* The ranks first, while this process has no threads (a forked child then uses the library safely). */
  EXPECT(pipe(from_zero) == 0);
  for (i = 0; i < RANKS; ++i) {
    EXPECT(pipe(to_rank[i]) == 0);
    pid[i] = fork();
    EXPECT(pid[i] >= 0);
    if (pid[i] == 0) {
      close(to_rank[i][1]);
      close(from_zero[0]);
      exit(run_rank(i, to_rank[i][0], from_zero[1]));
    }
    close(to_rank[i][0]);
  }
  close(from_zero[1]);
  alarm(90);

  EXPECT_OK(tandem_context_create(NULL, &ctx));
  /* Bad arguments, each named. */
  EXPECT_FAIL(tandem_store_serve(NULL, NULL, 0, SECRET, &store), TANDEM_ERR_INVALID_ARGUMENT, "context");
  EXPECT_FAIL(tandem_store_serve(ctx, NULL, 0, SECRET, NULL), TANDEM_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_FAIL(tandem_store_serve(ctx, NULL, 0, NULL, &store), TANDEM_ERR_INVALID_ARGUMENT, "secret is NULL");
  EXPECT_FAIL(tandem_store_serve(ctx, NULL, 0, "", &store), TANDEM_ERR_INVALID_ARGUMENT, "secret is empty");
  EXPECT_FAIL(tandem_store_serve(ctx, NULL, 70000, SECRET, &store), TANDEM_ERR_INVALID_ARGUMENT, "70000");
  EXPECT_FAIL(tandem_store_serve(ctx, "", 0, SECRET, &store), TANDEM_ERR_INVALID_ARGUMENT, "bind_addr");
  EXPECT_FAIL(tandem_store_port(NULL, &port), TANDEM_ERR_INVALID_ARGUMENT, "store");
  tandem_store_destroy(NULL); /* a no-op */

  EXPECT_OK(tandem_store_serve(ctx, "127.0.0.1", 0, SECRET, &store));
  EXPECT_FAIL(tandem_store_port(store, NULL), TANDEM_ERR_INVALID_ARGUMENT, "port is NULL");
  EXPECT_OK(tandem_store_port(store, &port));
  EXPECT(port > 0 && port <= 65535);
  /* The port is taken now: a second store there is refused, naming the address. */
  EXPECT_FAIL(tandem_store_serve(ctx, "127.0.0.1", port, SECRET, &second), TANDEM_ERR_TRANSPORT, "127.0.0.1");
  EXPECT(second == NULL);
  /* A wrong secret is refused by the store (this process is "rank 1 of 2", so it serves nothing itself). */
  EXPECT_FAIL(tcp_comm(ctx, 1, 2, port, "not-the-secret", 3000, &intruder), TANDEM_ERR_AUTH, "secret");
  EXPECT(intruder == NULL);

  for (i = 0; i < RANKS; ++i) {
    EXPECT(write(to_rank[i][1], &port, sizeof(port)) == (ssize_t)sizeof(port));
    close(to_rank[i][1]);
  }
  /* Rank 0 allreduced with the others; now it dies, holding its communicator. */
  EXPECT(read(from_zero[0], &ready, 1) == 1 && ready == 'r');
  EXPECT(kill(pid[0], SIGKILL) == 0);
  for (i = 0; i < RANKS; ++i) {
    EXPECT(waitpid(pid[i], &status, 0) == pid[i]);
    if (i == 0) {
      EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "c_store_test: surviving rank %d failed (status %d)\n", i, status);
      return 1;
    }
  }
  tandem_store_destroy(store);
  tandem_store_destroy(store); /* destroyed: a no-op */
  tandem_context_destroy(ctx);
  printf("c_store_test: rank 0 killed; ranks 1 and 2 shrank to 2 and allreduced through the process's store\n");
  return 0;
}
