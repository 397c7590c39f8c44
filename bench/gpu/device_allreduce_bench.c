/* All-reduce of device buffers (issue #14): tandem_comm_allreduce_ex on cudaMalloc'ed memory, timed like
 * `tandem bench allreduce` (barrier, timed call ended by a stream synchronize, slowest rank, median), beside
 * the same call on host memory and, on one rank, NCCL called directly (dlopen libnccl.so.2).
 *
 *   tandem launch -n N -- device_allreduce_bench [--sizes 1M,16M,64M] [--iters 20] [--path auto|nccl|staged]
 *
 * Every rank uses cuda:(rank % devices): on a one-GPU host several ranks share the GPU, which NCCL refuses,
 * so there the device path is staged through host memory. Prints one JSON object per (memory, size) on rank 0;
 * results are checked (small integers, exact) and `wrong` counts mismatches over ranks. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tandem/tandem.h>

#define CHECK_T(call)                                                                                      \
  do {                                                                                                     \
    tandem_status_t s_ = (call);                                                                           \
    if (s_ != TANDEM_OK) {                                                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, tandem_last_error_message());          \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)
#define CHECK_C(call)                                                                                      \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));              \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static size_t parse_size(const char* s) {
  char* end = NULL;
  size_t v = (size_t)strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  if (*end == 'G' || *end == 'g') v <<= 30;
  return v;
}

/* NCCL called directly on one rank (ncclCommInitAll over one device): the reference for the NCCL path. */
typedef int (*nccl_init_all_t)(void**, int, const int*);
typedef int (*nccl_allreduce_t)(const void*, void*, size_t, int, int, void*, cudaStream_t);
typedef int (*nccl_destroy_t)(void*);

static double nccl_direct_us(int device, float* dev, const float* host, size_t count, int iters,
                             cudaStream_t stream) {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  nccl_init_all_t init_all;
  nccl_allreduce_t allreduce;
  nccl_destroy_t destroy;
  void* comm = NULL;
  double* times;
  double med;
  int i;
  if (lib == NULL) return -1;
  init_all = (nccl_init_all_t)dlsym(lib, "ncclCommInitAll");
  allreduce = (nccl_allreduce_t)dlsym(lib, "ncclAllReduce");
  destroy = (nccl_destroy_t)dlsym(lib, "ncclCommDestroy");
  if (!init_all || !allreduce || !destroy || init_all(&comm, 1, &device) != 0) return -1;
  times = (double*)malloc(sizeof(double) * (size_t)iters);
  for (i = 0; i < 3; ++i) allreduce(dev, dev, count, 7 /* ncclFloat32 */, 0 /* ncclSum */, comm, stream);
  CHECK_C(cudaStreamSynchronize(stream));
  for (i = 0; i < iters; ++i) {
    double t0;
    CHECK_C(cudaMemcpyAsync(dev, host, count * sizeof(float), cudaMemcpyHostToDevice, stream)); /* as Tandem's loop */
    CHECK_C(cudaStreamSynchronize(stream));
    t0 = now_us();
    allreduce(dev, dev, count, 7, 0, comm, stream);
    CHECK_C(cudaStreamSynchronize(stream));
    times[i] = now_us() - t0;
  }
  qsort(times, (size_t)iters, sizeof(double), cmp_double);
  med = times[iters / 2];
  free(times);
  destroy(comm);
  return med;
}

int main(int argc, char** argv) {
  const char* sizes = "1M,16M,64M";
  const char* path_mode = "auto";
  int iters = 20, devices = 0, a;
  tandem_context_t* ctx = NULL;
  tandem_comm_t* comm = NULL;
  tandem_context_params_t xp = TANDEM_CONTEXT_PARAMS_INIT;
  const char* settings[1];
  char setting[64];
  int32_t rank = 0, n = 1;
  cudaStream_t stream;
  char list[256];
  char* tok;
  for (a = 1; a + 1 < argc; a += 2) {
    if (strcmp(argv[a], "--sizes") == 0) sizes = argv[a + 1];
    else if (strcmp(argv[a], "--iters") == 0) iters = atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--path") == 0) path_mode = argv[a + 1];
  }
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIPPED: no usable CUDA device\n");
    return 77;
  }
  snprintf(setting, sizeof setting, "TANDEM_DEVICE_COLLECTIVES=%s", path_mode);
  settings[0] = setting;
  xp.field_mask = TANDEM_CONTEXT_PARAM_SETTINGS;
  xp.settings = settings;
  xp.num_settings = 1;
  CHECK_T(tandem_context_create(&xp, &ctx));
  CHECK_T(tandem_comm_create(ctx, NULL, &comm));
  CHECK_T(tandem_comm_rank(comm, &rank));
  CHECK_T(tandem_comm_size(comm, &n));
  CHECK_C(cudaSetDevice(rank % devices));
  CHECK_C(cudaStreamCreate(&stream));
  snprintf(list, sizeof list, "%s", sizes);
  for (tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ",")) {
    const size_t bytes = parse_size(tok), count = bytes / sizeof(float);
    float* host = (float*)malloc(bytes);
    float* dev = NULL;
    double* times = (double*)malloc(sizeof(double) * (size_t)iters);
    int memory, i;
    for (memory = 0; memory < 2; ++memory) {
      tandem_coll_params_t cp = TANDEM_COLL_PARAMS_INIT;
      tandem_device_path_t path = TANDEM_DEVICE_PATH_NONE;
      char why[256] = "";
      size_t why_bytes = sizeof why;
      int64_t wrong = 0;
      size_t k;
      double med, nccl_us = -1;
      for (k = 0; k < count; ++k) host[k] = (float)(k % 4) + 2.0f * (float)rank;
      if (memory == 1) {
        CHECK_C(cudaMalloc((void**)&dev, bytes));
        cp.field_mask = TANDEM_COLL_PARAM_MEMORY | TANDEM_COLL_PARAM_STREAM;
        cp.memory = TANDEM_MEMORY_CUDA;
        cp.device = rank % devices;
        cp.stream = stream;
        CHECK_T(tandem_comm_device_path(comm, &cp, &path, why, &why_bytes));
      }
      for (i = -3; i < iters; ++i) {
        double t0;
        if (memory == 1) CHECK_C(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
        if (memory == 1) CHECK_C(cudaStreamSynchronize(stream));
        else
          for (k = 0; k < count; ++k) host[k] = (float)(k % 4) + 2.0f * (float)rank;
        CHECK_T(tandem_comm_barrier(comm));
        t0 = now_us();
        if (memory == 1) {
          CHECK_T(tandem_comm_allreduce_ex(comm, dev, dev, count, TANDEM_F32, TANDEM_SUM, &cp));
          CHECK_C(cudaStreamSynchronize(stream));
        } else {
          CHECK_T(tandem_comm_allreduce(comm, host, host, count, TANDEM_F32, TANDEM_SUM));
        }
        if (i >= 0) times[i] = now_us() - t0;
      }
      if (memory == 1) CHECK_C(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
      for (k = 0; k < count; ++k)
        wrong += host[k] != (float)n * (float)(k % 4) + (float)n * (float)(n - 1);
      CHECK_T(tandem_comm_allreduce(comm, times, times, (size_t)iters, TANDEM_F64, TANDEM_MAX));
      CHECK_T(tandem_comm_allreduce(comm, &wrong, &wrong, 1, TANDEM_I64, TANDEM_SUM));
      qsort(times, (size_t)iters, sizeof(double), cmp_double);
      med = times[iters / 2];
      if (memory == 1 && n == 1) {
        for (k = 0; k < count; ++k) host[k] = (float)(k % 4);
        nccl_us = nccl_direct_us(rank % devices, dev, host, count, iters, stream);
      }
      if (rank == 0)
        printf("{\"memory\": \"%s\", \"path\": \"%s\", \"why\": \"%s\", \"world\": %d, \"bytes\": %zu, "
               "\"time_us\": %.1f, \"algbw_gbps\": %.3f, \"busbw_gbps\": %.3f, \"nccl_direct_us\": %.1f, "
               "\"wrong\": %lld}\n",
               memory ? "cuda" : "host",
               memory == 0 ? "host" : path == TANDEM_DEVICE_PATH_NCCL ? "nccl" : path == TANDEM_DEVICE_PATH_STAGED ? "staged" : "none",
               memory ? why : "", n, bytes, med, (double)bytes / med * 1e-3,
               (double)bytes / med * 1e-3 * (n > 1 ? 2.0 * (n - 1) / n : 1.0), nccl_us, (long long)wrong);
      fflush(stdout);
      if (dev != NULL) CHECK_C(cudaFree(dev));
      dev = NULL;
    }
    free(host);
    free(times);
  }
  cudaStreamDestroy(stream);
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  return 0;
}
