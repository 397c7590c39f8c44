/* Collectives with tandem_coll_params_t from C99 (-pedantic -Werror): two ranks as POSIX threads over the
 * inproc transport. Host memory through the _ex forms gives the plain collectives' results; bad params are
 * refused naming what was wrong; the device path is agreed by both ranks (on a host without a usable CUDA
 * device: NONE, and every rank's device-memory call fails naming both ranks, while host collectives go on);
 * tandem_nccl_version reports the NCCL this process can load (required where the build found libnccl). */
#include <pthread.h>
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
#include "../common/c_comm.h"

#define WORLD 2
#define COUNT 4099

static tandem_context_t* g_ctx = NULL;

static void host_forms(tandem_comm_t* comm, int rank) {
  static float send[WORLD][COUNT], recv[WORLD][COUNT], buf[WORLD][COUNT];
  tandem_coll_params_t host = TANDEM_COLL_PARAMS_INIT;
  size_t i;
  for (i = 0; i < COUNT; ++i) {
    send[rank][i] = (float)(rank + 1) * (float)(i % 7);
    buf[rank][i] = rank == 1 ? (float)i : -1.f;
  }
  /* params NULL: the host form. */
  EXPECT_OK(tandem_comm_allreduce_ex(comm, send[rank], recv[rank], COUNT, TANDEM_F32, TANDEM_SUM, NULL));
  for (i = 0; i < COUNT; ++i) EXPECT(recv[rank][i] == 3.f * (float)(i % 7));
  /* HOST named explicitly, with a stream that host memory ignores; in place, max. */
  host.field_mask = TANDEM_COLL_PARAM_MEMORY | TANDEM_COLL_PARAM_STREAM;
  host.memory = TANDEM_MEMORY_HOST;
  host.stream = &host;
  EXPECT_OK(tandem_comm_allreduce_ex(comm, send[rank], send[rank], COUNT, TANDEM_F32, TANDEM_MAX, &host));
  for (i = 0; i < COUNT; ++i) EXPECT(send[rank][i] == 2.f * (float)(i % 7));
  EXPECT_OK(tandem_comm_broadcast_ex(comm, buf[rank], COUNT, TANDEM_F32, 1, &host));
  for (i = 0; i < COUNT; ++i) EXPECT(buf[rank][i] == (float)i);
}

static void bad_params(tandem_comm_t* comm, int rank) {
  static float x[WORLD][8];
  tandem_coll_params_t p = TANDEM_COLL_PARAMS_INIT;
  tandem_device_path_t path = TANDEM_DEVICE_PATH_NCCL;
  p.field_mask = UINT64_C(1) << 9;
  EXPECT_FAIL(tandem_comm_allreduce_ex(comm, x[rank], x[rank], 8, TANDEM_F32, TANDEM_SUM, &p), TANDEM_ERR_UNSUPPORTED,
              "tandem_coll_params_t");
  p.field_mask = TANDEM_COLL_PARAM_MEMORY;
  p.memory = (tandem_memory_type_t)7;
  EXPECT_FAIL(tandem_comm_broadcast_ex(comm, x[rank], 8, TANDEM_F32, 0, &p), TANDEM_ERR_INVALID_ARGUMENT,
              "tandem_memory_type_t");
  p.memory = TANDEM_MEMORY_CUDA;
  p.device = -1;
  EXPECT_FAIL(tandem_comm_allreduce_ex(comm, x[rank], x[rank], 8, TANDEM_F32, TANDEM_SUM, &p),
              TANDEM_ERR_INVALID_ARGUMENT, "params->device -1");
  /* The host form's checks come first, for device memory too: nothing is decided by a bad call. */
  p.device = 0;
  EXPECT_FAIL(tandem_comm_allreduce_ex(comm, NULL, x[rank], 8, TANDEM_F32, TANDEM_SUM, &p),
              TANDEM_ERR_INVALID_ARGUMENT, "send");
  EXPECT_FAIL(tandem_comm_broadcast_ex(comm, x[rank], 8, TANDEM_F32, 5, &p), TANDEM_ERR_INVALID_ARGUMENT, "root");
  EXPECT_FAIL(tandem_comm_allreduce_ex(NULL, x[rank], x[rank], 8, TANDEM_F32, TANDEM_SUM, &p),
              TANDEM_ERR_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_FAIL(tandem_comm_device_path(comm, &p, NULL, NULL, NULL), TANDEM_ERR_INVALID_ARGUMENT, "path is NULL");
  /* Host memory: no device path, nothing decided. */
  EXPECT_OK(tandem_comm_device_path(comm, NULL, &path, NULL, NULL));
  EXPECT(path == TANDEM_DEVICE_PATH_NONE);
}

static void device_memory(tandem_comm_t* comm, int rank) {
  static float x[WORLD][16];
  tandem_coll_params_t p = TANDEM_COLL_PARAMS_INIT;
  tandem_device_path_t path = TANDEM_DEVICE_PATH_FORCE_INT32_;
  char why[512];
  size_t why_bytes = sizeof why;
  size_t i;
  p.field_mask = TANDEM_COLL_PARAM_MEMORY;
  p.memory = TANDEM_MEMORY_CUDA;
  p.device = 0;
  /* Collective: both ranks decide together. */
  EXPECT_OK(tandem_comm_device_path(comm, &p, &path, why, &why_bytes));
  EXPECT(why_bytes > 1 && why_bytes <= sizeof why && strlen(why) + 1 == why_bytes);
  EXPECT(path == TANDEM_DEVICE_PATH_NONE || path == TANDEM_DEVICE_PATH_NCCL || path == TANDEM_DEVICE_PATH_STAGED);
  if (path != TANDEM_DEVICE_PATH_NONE) {
    /* A GPU host: the device data path is tested with device buffers by test_compute_gpu's collectives. */
    printf("rank %d: device path %d (%s); device buffers are tested under the gpu label\n", rank, (int)path, why);
    return;
  }
  /* No usable device anywhere here: both ranks are named, this rank's reason given; fixed from now on. */
  EXPECT(strstr(why, "no usable CUDA device on rank(s) 0, 1 of 2") != NULL);
  EXPECT_FAIL(tandem_comm_allreduce_ex(comm, x[rank], x[rank], 16, TANDEM_F32, TANDEM_SUM, &p), TANDEM_ERR_UNSUPPORTED,
              "tandem_comm_allreduce_ex: device memory: no usable CUDA device on rank(s) 0, 1");
  EXPECT_FAIL(tandem_comm_broadcast_ex(comm, x[rank], 16, TANDEM_F32, 0, &p), TANDEM_ERR_UNSUPPORTED,
              "no usable CUDA device");
  /* The communicator is not failed by it: host memory goes on. */
  for (i = 0; i < 16; ++i) x[rank][i] = 1.f;
  EXPECT_OK(tandem_comm_allreduce_ex(comm, x[rank], x[rank], 16, TANDEM_F32, TANDEM_SUM, NULL));
  for (i = 0; i < 16; ++i) EXPECT(x[rank][i] == 2.f);
}

static void* rank_main(void* arg) {
  const int rank = (int)(intptr_t)arg;
  tandem_comm_t* comm = inproc_comm(g_ctx, rank, WORLD, 29873, "c-device-collectives-test", 20000);
  tandem_status_t async = TANDEM_ERR_INTERNAL;
  host_forms(comm, rank);
  bad_params(comm, rank);
  device_memory(comm, rank);
  EXPECT_OK(tandem_comm_get_async_status(comm, &async, NULL, NULL));
  EXPECT(async == TANDEM_OK);
  tandem_comm_destroy(comm);
  return NULL;
}

static void nccl_version(void) {
  int32_t v = -1;
  const char* expected = getenv("TANDEM_TEST_NCCL_EXPECTED");
  tandem_status_t s;
  EXPECT_FAIL(tandem_nccl_version(NULL), TANDEM_ERR_INVALID_ARGUMENT, "version is NULL");
  s = tandem_nccl_version(&v);
  if (expected != NULL && strcmp(expected, "1") == 0) {
    /* The build found the CUDA toolkit's libnccl: it must load here, without any GPU. */
    EXPECT(s == TANDEM_OK && v >= 20000);
    printf("NCCL %d loaded at run time\n", (int)v);
  } else {
    EXPECT(s == TANDEM_OK || s == TANDEM_ERR_UNSUPPORTED);
    if (s != TANDEM_OK) {
      EXPECT(strstr(tandem_last_error_message(), "NCCL") != NULL);
      EXPECT(v == -1); /* out-parameter untouched on failure */
    }
  }
}

/* On this GPU-less host: unsupported, naming why, count untouched; with a device: at least one. */
static void cuda_device_count(void) {
  int32_t n = -1;
  tandem_status_t s;
  EXPECT_FAIL(tandem_cuda_device_count(NULL), TANDEM_ERR_INVALID_ARGUMENT, "count is NULL");
  s = tandem_cuda_device_count(&n);
  EXPECT(s == TANDEM_OK || s == TANDEM_ERR_UNSUPPORTED);
  if (s == TANDEM_OK) {
    EXPECT(n >= 1);
  } else {
    EXPECT(n == -1);
    EXPECT(strstr(tandem_last_error_message(), "CUDA") != NULL || strstr(tandem_last_error_message(), "device") != NULL);
  }
}

static void bad_setting(void) {
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  const char* settings[] = {"TANDEM_DEVICE_COLLECTIVES=gpu"};
  cp.field_mask = TANDEM_CONTEXT_PARAM_SETTINGS;
  cp.settings = settings;
  cp.num_settings = 1;
  EXPECT_FAIL(tandem_context_create(&cp, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "TANDEM_DEVICE_COLLECTIVES");
  EXPECT(ctx == NULL);
}

int main(void) {
  pthread_t t[WORLD];
  int r;
  nccl_version();
  cuda_device_count();
  bad_setting();
  EXPECT_OK(tandem_context_create(NULL, &g_ctx));
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_create(&t[r], NULL, rank_main, (void*)(intptr_t)r) == 0);
  for (r = 0; r < WORLD; ++r) EXPECT(pthread_join(t[r], NULL) == 0);
  tandem_context_destroy(g_ctx);
  printf("c_device_collectives_test: passed\n");
  return 0;
}
