/* Collectives on device memory from C (label gpu): buffers from cudaMalloc, reduced through
 * tandem_comm_allreduce_ex / tandem_comm_broadcast_ex and compared with the host collectives' results (the CPU
 * reference). Two ranks as threads over inproc share cuda:0 on the staged path (NCCL refuses two ranks on one
 * device); NCCL runs a one-rank communicator on cuda:0, and two ranks on cuda:0 and cuda:1 where the host has
 * two devices. Exits 77 (skipped) where no CUDA device is usable. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>

static int g_rank = -1;

#include "../../common/c_expect.h"
#include "../../common/c_comm.h"

#define COUNT 1000003 /* not a multiple of anything: uneven ring segments */

static tandem_context_t* g_ctx = NULL;
static int g_world = 2;
static int g_two_devices = 0;
static const char* g_mode = "staged";

static void* rank_main(void* arg) {
  const int rank = (int)(intptr_t)arg;
  const int device = g_two_devices ? rank : 0;
  tandem_coll_params_t cp = TANDEM_COLL_PARAMS_INIT;
  tandem_comm_t* comm = inproc_comm(g_ctx, rank, g_world, 29874, g_mode, 60000);
  tandem_device_path_t path = TANDEM_DEVICE_PATH_NONE;
  cudaStream_t stream = NULL;
  float *host = (float*)malloc(COUNT * sizeof(float)), *expect = (float*)malloc(COUNT * sizeof(float));
  float* dev = NULL;
  size_t i;
  EXPECT(host != NULL && expect != NULL);
  EXPECT(cudaSetDevice(device) == cudaSuccess);
  EXPECT(cudaStreamCreate(&stream) == cudaSuccess);
  EXPECT(cudaMalloc((void**)&dev, COUNT * sizeof(float)) == cudaSuccess);
  /* The CPU reference: the host collective on the same values. */
  for (i = 0; i < COUNT; ++i) host[i] = (float)((i * 7 + (size_t)rank * 13) % 101) * 0.25f;
  EXPECT(cudaMemcpyAsync(dev, host, COUNT * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  EXPECT_OK(tandem_comm_allreduce(comm, host, expect, COUNT, TANDEM_F32, TANDEM_SUM));
  cp.field_mask = TANDEM_COLL_PARAM_MEMORY | TANDEM_COLL_PARAM_STREAM;
  cp.memory = TANDEM_MEMORY_CUDA;
  cp.device = device;
  cp.stream = stream; /* ordered after the copy queued above */
  EXPECT_OK(tandem_comm_device_path(comm, &cp, &path, NULL, NULL));
  EXPECT(path == (strcmp(g_mode, "nccl") == 0 ? TANDEM_DEVICE_PATH_NCCL : TANDEM_DEVICE_PATH_STAGED));
  EXPECT_OK(tandem_comm_allreduce_ex(comm, dev, dev, COUNT, TANDEM_F32, TANDEM_SUM, &cp));
  memset(host, 0, COUNT * sizeof(float));
  EXPECT(cudaMemcpyAsync(host, dev, COUNT * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  EXPECT(cudaStreamSynchronize(stream) == cudaSuccess);
  for (i = 0; i < COUNT; ++i) EXPECT(host[i] == expect[i]); /* small integers x 0.25: exact in any order */
  /* Broadcast from the last rank. */
  for (i = 0; i < COUNT; ++i) host[i] = rank == g_world - 1 ? (float)i : -1.f;
  EXPECT(cudaMemcpyAsync(dev, host, COUNT * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  EXPECT_OK(tandem_comm_broadcast_ex(comm, dev, COUNT, TANDEM_F32, g_world - 1, &cp));
  EXPECT(cudaMemcpyAsync(host, dev, COUNT * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  EXPECT(cudaStreamSynchronize(stream) == cudaSuccess);
  for (i = 0; i < COUNT; ++i) EXPECT(host[i] == (float)i);
  cudaFree(dev);
  cudaStreamDestroy(stream);
  tandem_comm_destroy(comm);
  free(host);
  free(expect);
  return NULL;
}

static void run(const char* mode, int world) {
  const char* settings[1];
  char setting[64];
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  pthread_t t[2];
  int r;
  snprintf(setting, sizeof setting, "TANDEM_DEVICE_COLLECTIVES=%s", mode);
  settings[0] = setting;
  cp.field_mask = TANDEM_CONTEXT_PARAM_SETTINGS;
  cp.settings = settings;
  cp.num_settings = 1;
  g_mode = mode;
  g_world = world;
  EXPECT_OK(tandem_context_create(&cp, &g_ctx));
  for (r = 0; r < world; ++r) EXPECT(pthread_create(&t[r], NULL, rank_main, (void*)(intptr_t)r) == 0);
  for (r = 0; r < world; ++r) EXPECT(pthread_join(t[r], NULL) == 0);
  tandem_context_destroy(g_ctx);
  printf("device collectives: %s, %d rank(s): match the host reference\n", mode, world);
}

int main(void) {
  int devices = 0;
  int32_t nccl = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIPPED: no usable CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  run("staged", 2);
  if (tandem_nccl_version(&nccl) != TANDEM_OK) {
    printf("NCCL path not tested: %s\n", tandem_last_error_message());
    return 0;
  }
  run("nccl", 1);
  if (devices >= 2) {
    g_two_devices = 1;
    run("nccl", 2);
    run("staged", 2);
  }
  return 0;
}
