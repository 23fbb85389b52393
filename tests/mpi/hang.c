/* A rank that stops calling: every rank runs two MPI_Allreduce, then rank SLEEPER
 * sleeps SECONDS before the third while the others wait in it.
 *
 *   hang SLEEPER SECONDS
 */
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int sleeper = argc > 1 ? atoi(argv[1]) : 2;
  double seconds = argc > 2 ? atof(argv[2]) : 10;
  double x[8] = {0}, y[8];
  MPI_Allreduce(x, y, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(x, y, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank == sleeper) usleep((useconds_t)(seconds * 1e6));
  MPI_Allreduce(x, y, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
