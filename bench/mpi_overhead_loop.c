/* The loop bench/mpi_overhead.py times: ITERS x MPI_Allreduce of BYTES (float32, sum)
 * on MPI_COMM_WORLD after WARMUP untimed calls. Rank 0 prints one line:
 *   ns_per_call <mean ns per call, slowest rank>
 *
 *   mpi_overhead_loop BYTES ITERS [WARMUP]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long bytes = argc > 1 ? atol(argv[1]) : 8;
  long iters = argc > 2 ? atol(argv[2]) : 10000;
  long warmup = argc > 3 ? atol(argv[3]) : iters / 10;
  int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
  float* in = calloc((size_t)count, sizeof(float));
  float* out = calloc((size_t)count, sizeof(float));
  for (long i = 0; i < warmup; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_ns();
  for (long i = 0; i < iters; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double per = (now_ns() - t0) / (double)iters, slowest = 0;
  PMPI_Reduce(&per, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("ns_per_call %.1f\n", slowest);
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
