/* MPI_THREAD_MULTIPLE: two threads per rank issue nonblocking ops at once (their own
 * communicator each, dup'ed from the world), so request handles are created and
 * completed concurrently. Then every rank waits for SYNC_DIR/go (see collectives.c).
 *
 *   threads ITERS [SYNC_DIR]
 * Per thread and rank: ITERS x (Isend + Irecv to/from ring neighbours, Waitall) and
 * ITERS x (Iallreduce int32 x 2, Wait).
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "test_support.h"

static int iters = 100, rank, n, bad = 0;
static MPI_Comm comms[2];

static void* work(void* arg) {
  MPI_Comm c = comms[(long)arg];
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (int i = 0; i < iters; ++i) {
    int s = rank * 1000 + i, r = -1;
    MPI_Request q[2];
    MPI_Irecv(&r, 1, MPI_INT, left, i, c, &q[0]);
    MPI_Isend(&s, 1, MPI_INT, right, i, c, &q[1]);
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    if (r != left * 1000 + i) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
    int x[2] = {1, i}, y[2];
    MPI_Request a;
    MPI_Iallreduce(x, y, 2, MPI_INT, MPI_SUM, c, &a);
    MPI_Wait(&a, MPI_STATUS_IGNORE);
    if (y[0] != n) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (provided < MPI_THREAD_MULTIPLE) {
    if (rank == 0) fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
    MPI_Finalize();
    return 77;
  }
  if (argc > 1) iters = atoi(argv[1]);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms[0]);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms[1]);
  pthread_t t[2];
  for (long i = 0; i < 2; ++i) pthread_create(&t[i], NULL, work, (void*)i);
  for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
  if (argc > 2) hold_until_go(argv[2], rank);
  MPI_Comm_free(&comms[0]);
  MPI_Comm_free(&comms[1]);
  MPI_Finalize();
  if (bad) fprintf(stderr, "rank %d: %d wrong results\n", rank, bad);
  return bad ? 1 : 0;
}
