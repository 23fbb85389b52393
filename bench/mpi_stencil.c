/* A small real MPI program for bench/mpi_overhead.py --program stencil: Jacobi iterations of
 * the 2-D heat equation on a ROWS x COLS grid split by rows across the ranks. Each iteration
 * exchanges halo rows with the neighbours (MPI_Isend/MPI_Irecv + MPI_Waitall, as stencil codes
 * do; MPI_PROC_NULL at the edges), updates the 5-point stencil, and every CHECK iterations
 * agrees on the residual with MPI_Allreduce. After WARMUP untimed iterations, rank 0 prints
 *   ns_per_call <mean ns per iteration, slowest rank>
 *   checksum <sum of the grid>   (the same with and without the preload)
 *
 *   mpi_stencil ROWS_PER_RANK ITERS [WARMUP] [COLS] [CHECK]
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
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long rows = argc > 1 ? atol(argv[1]) : 256;
  long iters = argc > 2 ? atol(argv[2]) : 200;
  long warmup = argc > 3 ? atol(argv[3]) : iters / 10;
  long cols = argc > 4 ? atol(argv[4]) : 2048;
  long check = argc > 5 ? atol(argv[5]) : 1;
  if (rows < 1 || cols < 3 || iters < 1 || check < 1) {
    if (rank == 0) fprintf(stderr, "usage: mpi_stencil ROWS_PER_RANK>=1 ITERS>=1 [WARMUP] [COLS>=3] [CHECK>=1]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* rows + 2 halo rows. Rank 0's upper halo is the hot boundary, 1 in both buffers: a receive
   * from MPI_PROC_NULL leaves it alone. Everything else starts at 0. */
  size_t n = (size_t)(rows + 2) * (size_t)cols;
  double* a = calloc(n, sizeof(double));
  double* b = calloc(n, sizeof(double));
  if (!a || !b) MPI_Abort(MPI_COMM_WORLD, 3);
  if (rank == 0)
    for (long j = 0; j < cols; ++j) a[j] = b[j] = 1.0;
  int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
  int down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
  double t0 = 0, residual = 0;
  for (long it = 0; it < warmup + iters; ++it) {
    if (it == warmup) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_ns();
    }
    MPI_Request req[4];
    MPI_Irecv(a, (int)cols, MPI_DOUBLE, up, 0, MPI_COMM_WORLD, &req[0]);
    MPI_Irecv(a + (rows + 1) * cols, (int)cols, MPI_DOUBLE, down, 1, MPI_COMM_WORLD, &req[1]);
    MPI_Isend(a + cols, (int)cols, MPI_DOUBLE, up, 1, MPI_COMM_WORLD, &req[2]);
    MPI_Isend(a + rows * cols, (int)cols, MPI_DOUBLE, down, 0, MPI_COMM_WORLD, &req[3]);
    MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
    double local = 0;
    for (long i = 1; i <= rows; ++i) {
      const double* r0 = a + (i - 1) * cols;
      const double* r1 = a + i * cols;
      const double* r2 = a + (i + 1) * cols;
      double* o = b + i * cols;
      for (long j = 1; j < cols - 1; ++j) {
        double v = 0.25 * (r0[j] + r2[j] + r1[j - 1] + r1[j + 1]);
        double d = v - r1[j];
        local += d * d;
        o[j] = v;
      }
    }
    if ((it + 1) % check == 0) MPI_Allreduce(&local, &residual, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double* t = a;
    a = b;
    b = t;
  }
  double per = (now_ns() - t0) / (double)iters, slowest = 0;
  double sum = 0, total = 0;
  for (long i = 1; i <= rows; ++i)
    for (long j = 0; j < cols; ++j) sum += a[i * cols + j];
  PMPI_Reduce(&per, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  PMPI_Reduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("ns_per_call %.1f\nchecksum %.17g\nresidual %.6g\n", slowest, total, residual);
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}
