/* Every collective of the C ABI, from C99 (-pedantic -Werror), with result checks and bad-input
 * checks. Runs at any world size: alone it is a one-rank job; CTest also runs it as
 * `tandem launch -n 4 -- c_collectives_test`. Exits non-zero on the first failed check. */
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

/* ---- Typed element access (values used here are small integers, exact in every dtype) ---- */
static uint16_t f32_to_f16(float f) {
  uint32_t u, sign, mant;
  int32_t e;
  memcpy(&u, &f, 4);
  sign = (u >> 16) & 0x8000u;
  if ((u & 0x7fffffffu) == 0) return (uint16_t)sign;
  e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  mant = (u >> 13) & 0x3ffu;
  return (uint16_t)(sign | ((uint32_t)e << 10) | mant);
}
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  float f;
  if (e == 0 && mant == 0) {
    u = sign;
  } else {
    u = sign | ((e - 15 + 127) << 23) | (mant << 13);
  }
  memcpy(&f, &u, 4);
  return f;
}

static void put(void* buf, tandem_dtype_t t, size_t i, double v) {
  float f = (float)v;
  uint32_t u;
  switch (t) {
    case TANDEM_F32: ((float*)buf)[i] = f; break;
    case TANDEM_F64: ((double*)buf)[i] = v; break;
    case TANDEM_F16: ((uint16_t*)buf)[i] = f32_to_f16(f); break;
    case TANDEM_BF16: memcpy(&u, &f, 4); ((uint16_t*)buf)[i] = (uint16_t)(u >> 16); break;
    case TANDEM_I32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case TANDEM_I64: ((int64_t*)buf)[i] = (int64_t)v; break;
    default: EXPECT(!"unexpected dtype");
  }
}

static double get(const void* buf, tandem_dtype_t t, size_t i) {
  float f;
  uint32_t u;
  switch (t) {
    case TANDEM_F32: return ((const float*)buf)[i];
    case TANDEM_F64: return ((const double*)buf)[i];
    case TANDEM_F16: return f16_to_f32(((const uint16_t*)buf)[i]);
    case TANDEM_BF16: u = (uint32_t)((const uint16_t*)buf)[i] << 16; memcpy(&f, &u, 4); return f;
    case TANDEM_I32: return ((const int32_t*)buf)[i];
    case TANDEM_I64: return (double)((const int64_t*)buf)[i];
    default: EXPECT(!"unexpected dtype");
  }
  return 0;
}

static void* alloc(size_t count, tandem_dtype_t t) {
  void* p = calloc(count == 0 ? 1 : count, tandem_dtype_size(t));
  EXPECT(p != NULL);
  return p;
}

static const tandem_dtype_t kDtypes[] = {TANDEM_F32, TANDEM_F64, TANDEM_F16, TANDEM_BF16, TANDEM_I32, TANDEM_I64};
static const tandem_op_t kOps[] = {TANDEM_SUM, TANDEM_AVG, TANDEM_MIN, TANDEM_MAX, TANDEM_PROD};
#define NUM_DTYPES (sizeof kDtypes / sizeof kDtypes[0])
#define NUM_OPS (sizeof kOps / sizeof kOps[0])

/* Rank r's element i for op; expected(i) is the reduction over n ranks. Chosen so every result is
 * an exact small integer: sum/avg/min/max use i%5 + 2r, prod uses 1 or 2. */
static double input_value(tandem_op_t op, int r, size_t i) {
  if (op == TANDEM_PROD) return 1.0 + (double)(((size_t)r + i) % 2);
  return (double)(i % 5) + 2.0 * r;
}
static double expected_value(tandem_op_t op, int n, size_t i) {
  double base = (double)(i % 5);
  int r, twos = 0;
  switch (op) {
    case TANDEM_SUM: return n * base + (double)n * (n - 1);
    case TANDEM_AVG: return base + (n - 1);
    case TANDEM_MIN: return base;
    case TANDEM_MAX: return base + 2.0 * (n - 1);
    case TANDEM_PROD:
      for (r = 0; r < n; ++r) twos += (int)(((size_t)r + i) % 2);
      return (double)(1 << twos);
    default: return -1;
  }
}

static void check_allreduce(tandem_comm_t* comm, int rank, int n, tandem_dtype_t t, tandem_op_t op, size_t count,
                            int in_place, int nonblocking) {
  void* send = alloc(count, t);
  void* recv = in_place ? send : alloc(count, t);
  size_t i;
  for (i = 0; i < count; ++i) put(send, t, i, input_value(op, rank, i));
  if (nonblocking) {
    tandem_request_t* req = NULL;
    int done = 0, spins = 0;
    EXPECT_OK(tandem_comm_iallreduce(comm, send, recv, count, t, op, &req));
    EXPECT(req != NULL);
    while (!done && spins++ < 1000) EXPECT_OK(tandem_request_test(req, &done));
    EXPECT_OK(tandem_request_wait(req)); /* also fine after completion */
    EXPECT_OK(tandem_request_test(req, &done));
    EXPECT(done == 1);
    tandem_request_destroy(req);
  } else {
    EXPECT_OK(tandem_comm_allreduce(comm, send, recv, count, t, op));
  }
  for (i = 0; i < count; ++i) {
    const double got = get(recv, t, i), want = expected_value(op, n, i);
    if (got != want) {
      fprintf(stderr, "rank %d: allreduce dtype %d op %d count %lu in_place %d: element %lu = %g, expected %g\n",
              rank, (int)t, (int)op, (unsigned long)count, in_place, (unsigned long)i, got, want);
      exit(1);
    }
  }
  if (!in_place) free(recv);
  free(send);
}

static void test_allreduce(tandem_comm_t* comm, int rank, int n) {
  size_t d, o;
  for (d = 0; d < NUM_DTYPES; ++d)
    for (o = 0; o < NUM_OPS; ++o) check_allreduce(comm, rank, n, kDtypes[d], kOps[o], 1000, 0, 0);
  check_allreduce(comm, rank, n, TANDEM_F32, TANDEM_SUM, 1, 0, 0);
  check_allreduce(comm, rank, n, TANDEM_F32, TANDEM_SUM, 0, 0, 0);
  check_allreduce(comm, rank, n, TANDEM_F32, TANDEM_SUM, 4099, 1, 0);          /* in place, odd size */
  check_allreduce(comm, rank, n, TANDEM_F32, TANDEM_MAX, (size_t)1 << 20, 0, 0); /* 4 MiB: chunked */
  check_allreduce(comm, rank, n, TANDEM_I64, TANDEM_SUM, 777, 0, 1);
  check_allreduce(comm, rank, n, TANDEM_BF16, TANDEM_AVG, 64, 1, 1);
}

/* Several non-blocking allreduces in flight at once, completed in reverse order. */
static void test_overlapping_requests(tandem_comm_t* comm, int rank, int n) {
  enum { kReqs = 4, kCount = 3000 };
  float* bufs[kReqs];
  tandem_request_t* reqs[kReqs];
  int k;
  size_t i;
  for (k = 0; k < kReqs; ++k) {
    bufs[k] = (float*)alloc(kCount, TANDEM_F32);
    for (i = 0; i < kCount; ++i) bufs[k][i] = (float)(k + rank);
    EXPECT_OK(tandem_comm_iallreduce(comm, bufs[k], bufs[k], kCount, TANDEM_F32, TANDEM_SUM, &reqs[k]));
  }
  for (k = kReqs - 1; k >= 0; --k) {
    EXPECT_OK(tandem_request_wait(reqs[k]));
    tandem_request_destroy(reqs[k]);
    for (i = 0; i < kCount; ++i) EXPECT(bufs[k][i] == (float)(n * k + n * (n - 1) / 2));
    free(bufs[k]);
  }
}

static void test_reduce_scatter(tandem_comm_t* comm, int rank, int n, int nonblocking) {
  const size_t count = 513;
  int32_t* send = (int32_t*)alloc(count * (size_t)n, TANDEM_I32);
  int32_t* recv = (int32_t*)alloc(count, TANDEM_I32);
  size_t j;
  for (j = 0; j < count * (size_t)n; ++j) send[j] = (int32_t)(j % 7) + rank;
  if (nonblocking) {
    tandem_request_t* req = NULL;
    EXPECT_OK(tandem_comm_ireduce_scatter(comm, send, recv, count, TANDEM_I32, TANDEM_SUM, &req));
    EXPECT_OK(tandem_request_wait(req));
    tandem_request_destroy(req);
  } else {
    EXPECT_OK(tandem_comm_reduce_scatter(comm, send, recv, count, TANDEM_I32, TANDEM_SUM));
  }
  for (j = 0; j < count; ++j) {
    const size_t global = (size_t)rank * count + j;
    EXPECT(recv[j] == n * (int32_t)(global % 7) + n * (n - 1) / 2);
  }
  free(send);
  free(recv);
}

static void test_allgather(tandem_comm_t* comm, int rank, int n, int nonblocking) {
  const size_t count = 1001;
  double* send = (double*)alloc(count, TANDEM_F64);
  double* recv = (double*)alloc(count * (size_t)n, TANDEM_F64);
  size_t i;
  int q;
  for (i = 0; i < count; ++i) send[i] = rank * 10000.0 + (double)i;
  if (nonblocking) {
    tandem_request_t* req = NULL;
    EXPECT_OK(tandem_comm_iallgather(comm, send, recv, count, TANDEM_F64, &req));
    EXPECT_OK(tandem_request_wait(req));
    tandem_request_destroy(req);
  } else {
    EXPECT_OK(tandem_comm_allgather(comm, send, recv, count, TANDEM_F64));
  }
  for (q = 0; q < n; ++q)
    for (i = 0; i < count; ++i) EXPECT(recv[(size_t)q * count + i] == q * 10000.0 + (double)i);
  free(send);
  free(recv);
}

/* NCCL's in-place layouts: reduce_scatter into send + rank*count, allgather from recv + rank*count. */
static void test_in_place_scatter_gather(tandem_comm_t* comm, int rank, int n) {
  const size_t count = 301;
  int64_t* buf = (int64_t*)alloc(count * (size_t)n, TANDEM_I64);
  size_t j;
  int q;
  for (j = 0; j < count * (size_t)n; ++j) buf[j] = (int64_t)(j % 13) * (rank + 1);
  EXPECT_OK(tandem_comm_reduce_scatter(comm, buf, buf + (size_t)rank * count, count, TANDEM_I64, TANDEM_SUM));
  for (j = 0; j < count; ++j) {
    const size_t global = (size_t)rank * count + j;
    EXPECT(buf[global] == (int64_t)(global % 13) * n * (n + 1) / 2);
  }
  for (j = 0; j < count; ++j) buf[(size_t)rank * count + j] = rank * 1000 + (int64_t)j;
  EXPECT_OK(tandem_comm_allgather(comm, buf + (size_t)rank * count, buf, count, TANDEM_I64));
  for (q = 0; q < n; ++q)
    for (j = 0; j < count; ++j) EXPECT(buf[(size_t)q * count + j] == q * 1000 + (int64_t)j);
  free(buf);
}

static void test_broadcast(tandem_comm_t* comm, int rank, int n, int nonblocking) {
  const size_t count = 70000;
  const int root = n - 1;
  int64_t* buf = (int64_t*)alloc(count, TANDEM_I64);
  size_t i;
  for (i = 0; i < count; ++i) buf[i] = rank == root ? (int64_t)(i * 3 + 7) : -1;
  if (nonblocking) {
    tandem_request_t* req = NULL;
    EXPECT_OK(tandem_comm_ibroadcast(comm, buf, count, TANDEM_I64, root, &req));
    EXPECT_OK(tandem_request_wait(req));
    tandem_request_destroy(req);
  } else {
    EXPECT_OK(tandem_comm_broadcast(comm, buf, count, TANDEM_I64, root));
  }
  for (i = 0; i < count; ++i) EXPECT(buf[i] == (int64_t)(i * 3 + 7));
  free(buf);
}

static void test_reduce(tandem_comm_t* comm, int rank, int n, int root, int nonblocking) {
  const size_t count = 2500;
  float* send = (float*)alloc(count, TANDEM_F32);
  float* recv = (float*)alloc(count, TANDEM_F32);
  size_t i;
  for (i = 0; i < count; ++i) {
    send[i] = (float)(i % 11) + (float)rank;
    recv[i] = -5.0f;
  }
  /* Off the root recv may be NULL; pass it on odd ranks to cover both. */
  {
    float* out = (rank == root || rank % 2 == 0) ? recv : NULL;
    if (nonblocking) {
      tandem_request_t* req = NULL;
      EXPECT_OK(tandem_comm_ireduce(comm, send, out, count, TANDEM_F32, TANDEM_MAX, root, &req));
      EXPECT_OK(tandem_request_wait(req));
      tandem_request_destroy(req);
    } else {
      EXPECT_OK(tandem_comm_reduce(comm, send, out, count, TANDEM_F32, TANDEM_SUM, root));
    }
  }
  if (rank == root) {
    for (i = 0; i < count; ++i) {
      const float want = nonblocking ? (float)(i % 11) + (float)(n - 1)
                                     : (float)n * (float)(i % 11) + (float)(n * (n - 1) / 2);
      EXPECT(recv[i] == want);
    }
  }
  /* The root's send buffer is never written. */
  for (i = 0; i < count; ++i) EXPECT(send[i] == (float)(i % 11) + (float)rank);
  free(send);
  free(recv);
}

static void test_send_recv(tandem_comm_t* comm, int rank, int n) {
  const size_t count = 12345;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int32_t* out = (int32_t*)alloc(count, TANDEM_I32);
  int32_t* in = (int32_t*)alloc(count, TANDEM_I32);
  tandem_request_t* sreq = NULL;
  size_t i;
  for (i = 0; i < count; ++i) out[i] = rank * 100000 + (int32_t)i;
  /* A ring shift: post the send first so that no rank blocks the cycle. */
  EXPECT_OK(tandem_comm_isend(comm, out, count, TANDEM_I32, next, 7, &sreq));
  EXPECT_OK(tandem_comm_recv(comm, in, count, TANDEM_I32, prev, 7));
  EXPECT_OK(tandem_request_wait(sreq));
  tandem_request_destroy(sreq);
  for (i = 0; i < count; ++i) EXPECT(in[i] == prev * 100000 + (int32_t)i);

  /* Two tags in flight between the same pair, received in the opposite order. */
  {
    tandem_request_t *s1 = NULL, *s2 = NULL, *r1 = NULL, *r2 = NULL;
    int32_t a = rank + 1000, b = rank + 2000, ga = 0, gb = 0;
    EXPECT_OK(tandem_comm_isend(comm, &a, 1, TANDEM_I32, next, 1, &s1));
    EXPECT_OK(tandem_comm_isend(comm, &b, 1, TANDEM_I32, next, 2, &s2));
    EXPECT_OK(tandem_comm_irecv(comm, &gb, 1, TANDEM_I32, prev, 2, &r2));
    EXPECT_OK(tandem_comm_irecv(comm, &ga, 1, TANDEM_I32, prev, 1, &r1));
    EXPECT_OK(tandem_request_wait(r2));
    EXPECT_OK(tandem_request_wait(r1));
    EXPECT_OK(tandem_request_wait(s1));
    EXPECT_OK(tandem_request_wait(s2));
    tandem_request_destroy(s1);
    tandem_request_destroy(s2);
    tandem_request_destroy(r1);
    tandem_request_destroy(r2);
    EXPECT(ga == prev + 1000);
    EXPECT(gb == prev + 2000);
  }
  free(out);
  free(in);
}

static void test_split(tandem_comm_t* comm, int rank, int n) {
  tandem_comm_t* sub = NULL;
  int32_t sub_rank = -1, sub_size = -1, expect_size = 0, q;
  float v;
  /* Even and odd ranks, each group ordered by descending world rank (key = -rank). */
  EXPECT_OK(tandem_comm_split(comm, rank % 2, -rank, &sub));
  EXPECT(sub != NULL);
  EXPECT_OK(tandem_comm_rank(sub, &sub_rank));
  EXPECT_OK(tandem_comm_size(sub, &sub_size));
  for (q = 0; q < n; ++q) expect_size += (q % 2 == rank % 2);
  EXPECT(sub_size == expect_size);
  {
    int32_t higher = 0; /* group members with a larger world rank come first */
    for (q = rank + 1; q < n; ++q) higher += (q % 2 == rank % 2);
    EXPECT(sub_rank == higher);
  }
  v = (float)rank;
  EXPECT_OK(tandem_comm_allreduce(sub, &v, &v, 1, TANDEM_F32, TANDEM_SUM));
  {
    float want = 0;
    for (q = 0; q < n; ++q)
      if (q % 2 == rank % 2) want += (float)q;
    EXPECT(v == want);
  }
  tandem_comm_destroy(sub);

  /* Rank 0 opts out with a negative color. */
  sub = (tandem_comm_t*)&v; /* must be overwritten */
  EXPECT_OK(tandem_comm_split(comm, rank == 0 ? -1 : 0, 0, &sub));
  if (rank == 0) {
    EXPECT(sub == NULL);
  } else {
    EXPECT(sub != NULL);
    EXPECT_OK(tandem_comm_size(sub, &sub_size));
    EXPECT(sub_size == n - 1);
    EXPECT_OK(tandem_comm_barrier(sub));
    tandem_comm_destroy(sub);
  }
}

/* Bad input: each call fails at once on this rank alone, with a message naming the argument, and
 * leaves the communicator usable. */
static void test_bad_input(tandem_context_t* ctx, tandem_comm_t* comm, int rank, int n) {
  float buf[8] = {0};
  tandem_request_t* req = NULL;
  tandem_comm_t* dead = NULL;
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  int32_t r = -1;
  int done = 0;
  const char* name = NULL;

  EXPECT_FAIL(tandem_comm_allreduce(NULL, buf, buf, 8, TANDEM_F32, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT, "comm");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, buf, 8, (tandem_dtype_t)42, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT,
              "dtype 42");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, buf, 8, TANDEM_F32, (tandem_op_t)99), TANDEM_ERR_INVALID_ARGUMENT,
              "op 99");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, buf, (size_t)-1, TANDEM_F32, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT,
              "overflows");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, buf, SIZE_MAX / 2, TANDEM_F64, TANDEM_SUM),
              TANDEM_ERR_INVALID_ARGUMENT, "count");
  EXPECT_FAIL(tandem_comm_reduce_scatter(comm, buf, buf + 4, SIZE_MAX / 4 / (size_t)n + 1, TANDEM_F32, TANDEM_SUM),
              TANDEM_ERR_INVALID_ARGUMENT, "overflows");
  EXPECT_FAIL(tandem_comm_allreduce(comm, NULL, buf, 8, TANDEM_F32, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT, "send");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, NULL, 8, TANDEM_F32, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT, "recv");
  EXPECT_FAIL(tandem_comm_allreduce(comm, buf, buf + 2, 4, TANDEM_F32, TANDEM_SUM), TANDEM_ERR_INVALID_ARGUMENT,
              "overlap");
  /* Overlapping, but not the in-place layout (send == recv + rank*count). */
  EXPECT_FAIL(tandem_comm_allgather(comm, (char*)buf + 2, buf, 1, TANDEM_F32), TANDEM_ERR_INVALID_ARGUMENT,
              "in-place form is send == recv + rank");
  EXPECT_FAIL(tandem_comm_reduce_scatter(comm, buf, (char*)buf + 2, 1, TANDEM_F32, TANDEM_SUM),
              TANDEM_ERR_INVALID_ARGUMENT, "overlap");
  EXPECT_FAIL(tandem_comm_send(comm, buf, 1, TANDEM_F32, 0, TANDEM_TAG_LIMIT), TANDEM_ERR_INVALID_ARGUMENT, "tag");
  EXPECT_FAIL(tandem_comm_broadcast(comm, buf, 8, TANDEM_F32, n), TANDEM_ERR_INVALID_ARGUMENT, "root");
  EXPECT_FAIL(tandem_comm_broadcast(comm, buf, 8, TANDEM_F32, -1), TANDEM_ERR_INVALID_ARGUMENT, "root -1");
  EXPECT_FAIL(tandem_comm_reduce(comm, buf, buf, 8, TANDEM_F32, TANDEM_SUM, n + 5), TANDEM_ERR_INVALID_ARGUMENT,
              "root");
  EXPECT_FAIL(tandem_comm_reduce(comm, buf, NULL, 8, TANDEM_F32, TANDEM_SUM, rank), TANDEM_ERR_INVALID_ARGUMENT,
              "recv");
  EXPECT_FAIL(tandem_comm_send(comm, buf, 8, TANDEM_F32, n, 0), TANDEM_ERR_INVALID_ARGUMENT, "peer");
  EXPECT_FAIL(tandem_comm_recv(comm, buf, 8, TANDEM_F32, -1, 0), TANDEM_ERR_INVALID_ARGUMENT, "peer -1");
  EXPECT_FAIL(tandem_comm_iallreduce(comm, buf, buf, 8, TANDEM_F32, TANDEM_SUM, NULL), TANDEM_ERR_INVALID_ARGUMENT,
              "req");
  EXPECT_FAIL(tandem_request_test(NULL, &done), TANDEM_ERR_INVALID_ARGUMENT, "req");
  EXPECT_FAIL(tandem_request_wait(NULL), TANDEM_ERR_INVALID_ARGUMENT, "req");
  EXPECT_FAIL(tandem_request_wait((tandem_request_t*)buf), TANDEM_ERR_INVALID_ARGUMENT, "not a live handle");
  EXPECT_FAIL(tandem_comm_rank(comm, NULL), TANDEM_ERR_INVALID_ARGUMENT, "rank");
  EXPECT_FAIL(tandem_comm_rank((tandem_comm_t*)buf, &r), TANDEM_ERR_INVALID_ARGUMENT, "not a live handle");
  EXPECT_FAIL(tandem_comm_transport_name(NULL, &name), TANDEM_ERR_INVALID_ARGUMENT, "comm");
  EXPECT(req == NULL);
  tandem_request_destroy(NULL); /* no-op */
  tandem_comm_destroy(NULL);    /* no-op */

  /* A destroyed communicator is refused, not used (a split gives us one to destroy). */
  EXPECT_OK(tandem_comm_split(comm, 0, rank, &dead));
  tandem_comm_destroy(dead);
  EXPECT_FAIL(tandem_comm_barrier(dead), TANDEM_ERR_INVALID_ARGUMENT, "not a live handle");
  EXPECT_FAIL(tandem_comm_size(dead, &r), TANDEM_ERR_INVALID_ARGUMENT, "destroyed");
  tandem_comm_destroy(dead); /* a second destroy is a no-op */

  /* Failure status: healthy -> origin -1, nobody blamed; an abort on a communicator of one rank -> that rank,
   * aborted, nobody blamed. Bad arguments are refused. */
  {
    int32_t origin = -2, aborted = -1, blamed[4] = {-5, -5, -5, -5};
    size_t num_blamed = 4;
    EXPECT_OK(tandem_comm_get_failure(comm, &origin, &aborted, blamed, &num_blamed));
    EXPECT(origin == -1 && aborted == 0 && num_blamed == 0 && blamed[0] == -5);
    EXPECT_FAIL(tandem_comm_get_failure(comm, NULL, NULL, NULL, NULL), TANDEM_ERR_INVALID_ARGUMENT, "origin");
    EXPECT_FAIL(tandem_comm_get_failure(comm, &origin, NULL, blamed, NULL), TANDEM_ERR_INVALID_ARGUMENT,
                "num_ranks");
    EXPECT_FAIL(tandem_comm_get_failure(NULL, &origin, NULL, NULL, NULL), TANDEM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_OK(tandem_comm_split(comm, rank, 0, &dead)); /* every rank alone */
    EXPECT_OK(tandem_comm_abort(dead, "test gives up"));
    num_blamed = 4;
    EXPECT_OK(tandem_comm_get_failure(dead, &origin, &aborted, blamed, &num_blamed));
    EXPECT(origin == 0 && aborted == 1 && num_blamed == 0);
    EXPECT_OK(tandem_comm_get_failure(dead, &origin, NULL, NULL, NULL)); /* the optional outputs may be NULL */
    tandem_comm_destroy(dead);
  }

  /* A destroyed request likewise. */
  EXPECT_OK(tandem_comm_ibarrier(comm, &req));
  EXPECT_OK(tandem_request_wait(req));
  tandem_request_destroy(req);
  EXPECT_FAIL(tandem_request_test(req, &done), TANDEM_ERR_INVALID_ARGUMENT, "not a live handle");
  tandem_request_destroy(req); /* no-op */

  /* Creation parameters: checked before any network activity. */
  {
    tandem_comm_t* c = NULL;
    EXPECT_FAIL(tandem_comm_create(NULL, NULL, &c), TANDEM_ERR_INVALID_ARGUMENT, "context");
    EXPECT_FAIL(tandem_comm_create(ctx, NULL, NULL), TANDEM_ERR_INVALID_ARGUMENT, "out");
    p.field_mask = UINT64_C(1) << 50;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_UNSUPPORTED, "field_mask");
    p.field_mask = TANDEM_COMM_PARAM_SIZE;
    p.size = 0;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "size");
    p.field_mask = TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_RANK;
    p.size = 2;
    p.rank = 2;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "rank 2");
    p.field_mask = TANDEM_COMM_PARAM_MASTER_PORT;
    p.master_port = 70000;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "master_port");
    p.field_mask = TANDEM_COMM_PARAM_TIMEOUT_MS;
    p.timeout_ms = 0;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "timeout_ms");
    p.field_mask = TANDEM_COMM_PARAM_TRANSPORT;
    p.transport = NULL;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "transport");
    p.field_mask = TANDEM_COMM_PARAM_ALLREDUCE_ALGO;
    p.allreduce_algo = (tandem_algo_t)77;
    EXPECT_FAIL(tandem_comm_create(ctx, &p, &c), TANDEM_ERR_INVALID_ARGUMENT, "allreduce_algo");
    EXPECT(c == NULL); /* untouched on failure */
  }

  /* None of that disturbed the communicator. */
  EXPECT_OK(tandem_comm_transport_name(comm, &name));
  EXPECT_OK(tandem_comm_barrier(comm));
}

int main(void) {
  tandem_context_t* ctx = NULL;
  tandem_comm_t* comm = NULL;
  int32_t rank = -1, size = -1;
  const char* transport = NULL;
  tandem_algo_t algo = TANDEM_ALGO_AUTO;
  tandem_status_t async = TANDEM_ERR_INTERNAL;
  char msg[256];
  size_t msg_bytes = sizeof msg;

  EXPECT_OK(tandem_context_create(NULL, &ctx));
  EXPECT_OK(tandem_comm_create(ctx, NULL, &comm)); /* everything from the environment */
  EXPECT_OK(tandem_comm_rank(comm, &rank));
  EXPECT_OK(tandem_comm_size(comm, &size));
  g_rank = rank;
  EXPECT(size >= 1 && rank >= 0 && rank < size);
  EXPECT_OK(tandem_comm_transport_name(comm, &transport));
  EXPECT(transport != NULL && transport[0] != '\0');
  EXPECT_OK(tandem_comm_allreduce_algo(comm, (size_t)1 << 20, TANDEM_F32, &algo));
  EXPECT(algo != TANDEM_ALGO_AUTO && strcmp(tandem_algo_string(algo), "unknown") != 0);
  if (rank == 0) printf("c_collectives_test: %d ranks over %s, 1M f32 allreduce uses %s\n", size, transport,
                        tandem_algo_string(algo));

  test_allreduce(comm, rank, size);
  test_overlapping_requests(comm, rank, size);
  test_reduce_scatter(comm, rank, size, 0);
  test_reduce_scatter(comm, rank, size, 1);
  test_allgather(comm, rank, size, 0);
  test_allgather(comm, rank, size, 1);
  test_in_place_scatter_gather(comm, rank, size);
  test_broadcast(comm, rank, size, 0);
  test_broadcast(comm, rank, size, 1);
  test_reduce(comm, rank, size, 0, 0);
  test_reduce(comm, rank, size, size - 1, 1);
  EXPECT_OK(tandem_comm_barrier(comm));
  test_send_recv(comm, rank, size);
  test_split(comm, rank, size);
  test_bad_input(ctx, comm, rank, size);

  EXPECT_OK(tandem_comm_get_async_status(comm, &async, msg, &msg_bytes));
  EXPECT(async == TANDEM_OK);
  EXPECT(msg_bytes == 1 && msg[0] == '\0');
  EXPECT_OK(tandem_comm_barrier(comm));
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  if (rank == 0) printf("c_collectives_test: all collectives passed on %d ranks\n", size);
  return 0;
}
