/* The Open MPI peer of `tandem bench allreduce`, with the same method: per size, warm-up calls,
 * then `iters` timed MPI_Allreduce calls each after a barrier; an iteration's time is the slowest
 * rank's; the median is reported. Prints one JSON object per size from rank 0.
 * Usage: mpi_allreduce ITERS WARMUP BYTES... (float32 sum). Compiled by run.py with mpicc. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  int rank, n, iters, warmup, a, i, it;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce ITERS WARMUP BYTES...\n");
    MPI_Finalize();
    return 2;
  }
  iters = atoi(argv[1]);
  warmup = atoi(argv[2]);
  for (a = 3; a < argc; ++a) {
    const size_t bytes = (size_t)atoll(argv[a]);
    const int count = (int)(bytes / sizeof(float));
    float* send = malloc(bytes);
    float* recv = malloc(bytes);
    double* t = malloc(sizeof(double) * (size_t)iters);
    double* tmax = malloc(sizeof(double) * (size_t)iters);
    double median;
    long wrong = 0, wrong_all = 0;
    for (i = 0; i < count; ++i) send[i] = (float)(i % 4) + 2.0f * (float)rank;
    for (it = 0; it < warmup; ++it) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (it = 0; it < iters; ++it) {
      double t0;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t[it] = (MPI_Wtime() - t0) * 1e6;
    }
    for (i = 0; i < count; ++i) wrong += recv[i] != (float)(n * (i % 4) + n * (n - 1));
    MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw;
      qsort(tmax, (size_t)iters, sizeof(double), cmp);
      median = iters % 2 ? tmax[iters / 2] : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
      algbw = (double)count * sizeof(float) / (median * 1e-6) / 1e9;
      printf("{\"bytes\": %zu, \"count\": %d, \"world\": %d, \"time_us\": %.3f, \"algbw_gbps\": %.6f, "
             "\"busbw_gbps\": %.6f, \"wrong\": %ld}\n",
             (size_t)count * sizeof(float), count, n, median, algbw, algbw * 2.0 * (n - 1) / n, wrong_all);
      fflush(stdout);
    }
    free(send);
    free(recv);
    free(t);
    free(tmax);
  }
  MPI_Finalize();
  return 0;
}
