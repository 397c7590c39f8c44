/* One rank of a fault scenario, run under `tandem launch` by test_faults.py. Every line it prints
 * starts with a keyword the driver looks for. Usage: fault_rank MODE, where MODE is
 *   kill           the last rank SIGKILLs itself mid-allreduce; the others must fail in time.
 *                  They ignore SIGTERM: the launcher stops the rest as soon as one rank dies, and
 *                  this scenario is about the library noticing, so they must outlive that signal
 *                  (the driver gives the launcher a long --grace-ms; SIGKILL still ends them).
 *   mismatch-kind  rank 0 broadcasts while the others allreduce; all must get TANDEM_ERR_MISMATCH
 *   mismatch-count rank 0 allreduces one element more than the others; likewise
 *   intruder       ranks 0..n-2 form a job of n-1 ranks; the last rank tries to join it as rank 1
 *                  with a wrong secret and must be refused (TANDEM_ERR_AUTH) while the job works
 * Exit status: 0 when this rank saw what it should, 1 otherwise (2: bad usage). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <tandem/tandem.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int fail(const char* what, tandem_status_t s) {
  printf("UNEXPECTED rank %d: %s returned %s: %s\n", g_rank, what, tandem_status_string(s),
         tandem_last_error_message());
  fflush(stdout);
  return 1;
}

/* Creates the communicator; explicit rank/size/secret when given (size > 0). */
static tandem_status_t create(tandem_context_t* ctx, int32_t rank, int32_t size, const char* secret,
                              tandem_comm_t** comm) {
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  if (size > 0) {
    p.field_mask |= TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE;
    p.rank = rank;
    p.size = size;
  }
  if (secret != NULL) {
    p.field_mask |= TANDEM_COMM_PARAM_SECRET;
    p.secret = secret;
  }
  return tandem_comm_create(ctx, &p, comm);
}

static int expect_status(const char* what, tandem_status_t got, tandem_status_t want, double t0) {
  if (got != want) {
    if (got == TANDEM_OK) {
      printf("UNEXPECTED rank %d: %s succeeded, expected %s\n", g_rank, what, tandem_status_string(want));
      fflush(stdout);
      return 1;
    }
    return fail(what, got);
  }
  printf("EXPECTED rank %d: %s -> %s after %.0f ms: %s\n", g_rank, what, tandem_status_string(got), now_ms() - t0,
         tandem_last_error_message());
  fflush(stdout);
  return 0;
}

static int mode_kill(tandem_comm_t* comm, int rank, int n) {
  const size_t count = (size_t)1 << 22; /* 16 MiB of f32: long enough to be caught in flight */
  /* Pages of its own, unmapped as soon as the allreduce returned its error (issue #17: no transport may touch the
   * buffers of a failed operation any more): a late read by a transport then faults instead of going unnoticed. */
  void* pages = mmap(NULL, count * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  float* buf = pages == MAP_FAILED ? NULL : (float*)pages;
  tandem_status_t s;
  double t0;
  int i;
  if (buf == NULL) return 1;
  signal(SIGTERM, SIG_IGN);
  for (i = 0; i < 2; ++i) { /* the job works before the fault */
    s = tandem_comm_allreduce(comm, buf, buf, 1024, TANDEM_F32, TANDEM_SUM);
    if (s != TANDEM_OK) return fail("warm-up allreduce", s);
  }
  if (rank == n - 1) {
    tandem_request_t* req = NULL;
    int done = 0;
    s = tandem_comm_iallreduce(comm, buf, buf, count, TANDEM_F32, TANDEM_SUM, &req);
    if (s != TANDEM_OK) return fail("iallreduce", s);
    (void)tandem_request_test(req, &done);
    usleep(20000); /* let the others get into the allreduce */
    printf("KILLING rank %d pid %d\n", rank, (int)getpid());
    fflush(stdout);
    raise(SIGKILL);
  }
  t0 = now_ms();
  s = tandem_comm_allreduce(comm, buf, buf, count, TANDEM_F32, TANDEM_SUM);
  if (s == TANDEM_OK) s = tandem_comm_allreduce(comm, buf, buf, count, TANDEM_F32, TANDEM_SUM);
  munmap(pages, count * sizeof(float));
  if (s == TANDEM_OK) return expect_status("allreduce with a dead rank", s, TANDEM_ERR_PEER_FAILURE, t0);
  printf("EXPECTED rank %d: allreduce with a dead rank -> %s after %.0f ms: %s\n", rank, tandem_status_string(s),
         now_ms() - t0, tandem_last_error_message());
  {
    tandem_status_t async = TANDEM_OK;
    int32_t origin = -2, aborted = -1, blamed[8];
    size_t num_blamed = 8, i;
    s = tandem_comm_get_async_status(comm, &async, NULL, NULL);
    printf("ASYNC rank %d: %s\n", rank, tandem_status_string(async));
    if (tandem_comm_get_failure(comm, &origin, &aborted, blamed, &num_blamed) != TANDEM_OK) {
      printf("UNEXPECTED rank %d: tandem_comm_get_failure failed: %s\n", rank, tandem_last_error_message());
    } else {
      printf("FAILURE rank %d: origin %d aborted %d blamed", rank, (int)origin, (int)aborted);
      for (i = 0; i < num_blamed && i < 8; ++i) printf(" %d", (int)blamed[i]);
      printf("\n");
    }
  }
  fflush(stdout);
  return 0;
}

static int mode_mismatch(tandem_comm_t* comm, int rank, int by_kind) {
  enum { kCount = 1000 };
  static float buf[kCount + 1];
  const double t0 = now_ms();
  const char* what = by_kind && rank == 0 ? "broadcast against allreduce" : "allreduce with mismatched arguments";
  tandem_status_t s;
  if (rank == 0 && by_kind) {
    s = tandem_comm_broadcast(comm, buf, kCount, TANDEM_F32, 0);
  } else {
    s = tandem_comm_allreduce(comm, buf, buf, rank == 0 ? kCount + 1 : kCount, TANDEM_F32, TANDEM_SUM);
  }
  if (s == TANDEM_OK) {
    /* A rank whose part needed nothing from the others (the root of a broadcast only sends) may
     * finish before anyone notices; the failure then reaches it on its next call. */
    printf("NOTE rank %d: %s completed here; the mismatch must reach the next call\n", rank, what);
    what = "barrier after a mismatched collective";
    s = tandem_comm_barrier(comm);
  }
  return expect_status(what, s, TANDEM_ERR_MISMATCH, t0);
}

static int mode_intruder(tandem_context_t* ctx, int rank, int n) {
  tandem_comm_t* comm = NULL;
  const int job = n - 1;
  tandem_status_t s;
  if (rank == n - 1) {
    const double t0 = now_ms();
    usleep(500000); /* try while the job is running, not before it formed */
    s = create(ctx, 1, job, "not-the-job-secret", &comm);
    if (s == TANDEM_OK) tandem_comm_destroy(comm);
    return expect_status("joining with a wrong secret", s, TANDEM_ERR_AUTH, t0);
  }
  s = create(ctx, rank, job, NULL, &comm);
  if (s != TANDEM_OK) return fail("tandem_comm_create (job of the other ranks)", s);
  {
    double v = 0;
    int iters;
    /* Keep the job busy for ~1.5 s so that the intruder's attempt lands while it runs. */
    for (iters = 0; iters < 150; ++iters) {
      v = (double)rank + 1;
      s = tandem_comm_allreduce(comm, &v, &v, 1, TANDEM_F64, TANDEM_SUM);
      if (s != TANDEM_OK) return fail("allreduce in the job", s);
      if (v != (double)job * (job + 1) / 2) {
        printf("UNEXPECTED rank %d: allreduce gave %g, expected %g\n", rank, v, (double)job * (job + 1) / 2);
        return 1;
      }
      usleep(10000);
    }
    printf("JOB-OK rank %d: %d allreduces correct\n", rank, iters);
  }
  s = tandem_comm_barrier(comm);
  tandem_comm_destroy(comm);
  fflush(stdout);
  return s == TANDEM_OK ? 0 : fail("final barrier", s);
}

int main(int argc, char** argv) {
  tandem_context_t* ctx = NULL;
  tandem_comm_t* comm = NULL;
  int32_t rank = -1, n = 0;
  const char* mode = argc > 1 ? argv[1] : "";
  tandem_status_t s;
  int rc;
  const char* env_rank = getenv("TANDEM_RANK");
  g_rank = env_rank != NULL ? atoi(env_rank) : 0;
  printf("READY rank %d pid %d\n", g_rank, (int)getpid());
  fflush(stdout);
  if (tandem_context_create(NULL, &ctx) != TANDEM_OK) return fail("tandem_context_create", TANDEM_ERR_INTERNAL);
  if (strcmp(mode, "intruder") == 0) {
    const char* env_size = getenv("TANDEM_WORLD_SIZE");
    rc = mode_intruder(ctx, g_rank, env_size != NULL ? atoi(env_size) : 1);
    tandem_context_destroy(ctx);
    return rc;
  }
  s = create(ctx, 0, 0, NULL, &comm);
  if (s != TANDEM_OK) return fail("tandem_comm_create", s);
  tandem_comm_rank(comm, &rank);
  tandem_comm_size(comm, &n);
  g_rank = rank;
  if (strcmp(mode, "kill") == 0) {
    rc = mode_kill(comm, rank, n);
  } else if (strcmp(mode, "mismatch-kind") == 0) {
    rc = mode_mismatch(comm, rank, 1);
  } else if (strcmp(mode, "mismatch-count") == 0) {
    rc = mode_mismatch(comm, rank, 0);
  } else {
    fprintf(stderr, "usage: fault_rank kill|mismatch-kind|mismatch-count|intruder\n");
    rc = 2;
  }
  {
    const double t0 = now_ms();
    tandem_comm_destroy(comm);
    printf("DESTROYED rank %d after %.0f ms\n", rank, now_ms() - t0);
    fflush(stdout);
  }
  tandem_context_destroy(ctx);
  return rc;
}
