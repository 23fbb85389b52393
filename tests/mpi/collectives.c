/* Several collectives and point-to-point ops with known counts, results checked.
 *
 *   collectives [SYNC_DIR]
 *
 * With SYNC_DIR: after the ops, create SYNC_DIR/ready-<rank> and wait (up to 120 s) for
 * SYNC_DIR/go before MPI_Finalize, so a test can read the live stats segment and ask
 * for an on-demand dump while the ranks are still up. The exact calls made are listed
 * in tests/test_mpi_interposer.py (EXPECTED_*); keep the two in step.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_support.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  /* 3 x all_reduce, float32 x 1024, sum */
  float f[1024];
  for (int it = 0; it < 3; ++it) {
    for (int i = 0; i < 1024; ++i) f[i] = (float)(rank + 1);
    MPI_Allreduce(MPI_IN_PLACE, f, 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(f[7] == (float)(n * (n + 1) / 2), "allreduce got %f", f[7]);
  }
  /* 2 x broadcast, int32 x 100, root 0 */
  int b[100];
  for (int it = 0; it < 2; ++it) {
    for (int i = 0; i < 100; ++i) b[i] = rank == 0 ? 42 + it : -1;
    MPI_Bcast(b, 100, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(b[99] == 42 + it, "bcast got %d", b[99]);
  }
  /* 1 x reduce, float64 x 10, max, root 1 */
  double d[10], dout[10];
  for (int i = 0; i < 10; ++i) d[i] = rank;
  MPI_Reduce(d, dout, 10, MPI_DOUBLE, MPI_MAX, 1 % n, MPI_COMM_WORLD);
  if (rank == 1 % n) CHECK(dout[3] == n - 1, "reduce got %f", dout[3]);
  /* 1 x all_gather, int32 x 5 per rank */
  int g[5], gout[5 * 64];
  for (int i = 0; i < 5; ++i) g[i] = rank;
  MPI_Allgather(g, 5, MPI_INT, gout, 5, MPI_INT, MPI_COMM_WORLD);
  CHECK(gout[5 * (n - 1)] == n - 1, "allgather got %d", gout[5 * (n - 1)]);
  /* 1 x all_gatherv: rank r gives r+1 int32 */
  int counts[64], displs[64], total = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = r + 1;
    displs[r] = total;
    total += r + 1;
  }
  int gv[64], gvout[64 * 65 / 2];
  for (int i = 0; i <= rank; ++i) gv[i] = rank;
  MPI_Allgatherv(gv, rank + 1, MPI_INT, gvout, counts, displs, MPI_INT, MPI_COMM_WORLD);
  CHECK(gvout[total - 1] == n - 1, "allgatherv got %d", gvout[total - 1]);
  /* 1 x reduce_scatter_block, float64: 3 per rank */
  double rs[3 * 64], rsout[3];
  for (int i = 0; i < 3 * n; ++i) rs[i] = 1.0;
  MPI_Reduce_scatter_block(rs, rsout, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  CHECK(rsout[2] == n, "reduce_scatter_block got %f", rsout[2]);
  /* 1 x reduce_scatter, int64: rank r gets r+1 */
  long rsv[64 * 65 / 2], rsvout[64];
  for (int i = 0; i < total; ++i) rsv[i] = 2;
  MPI_Reduce_scatter(rsv, rsvout, counts, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  CHECK(rsvout[rank] == 2L * n, "reduce_scatter got %ld", rsvout[rank]);
  /* 1 x all_to_all, int32 x 2 per peer */
  int a[2 * 64], aout[2 * 64];
  for (int i = 0; i < 2 * n; ++i) a[i] = rank * 1000 + i / 2;
  MPI_Alltoall(a, 2, MPI_INT, aout, 2, MPI_INT, MPI_COMM_WORLD);
  CHECK(aout[2 * (n - 1)] == (n - 1) * 1000 + rank, "alltoall got %d", aout[2 * (n - 1)]);
  /* 1 x all_to_allv: 1 uint8 to each peer */
  unsigned char av[64], avout[64];
  int ones[64], seq[64];
  for (int r = 0; r < n; ++r) {
    ones[r] = 1;
    seq[r] = r;
    av[r] = (unsigned char)rank;
  }
  MPI_Alltoallv(av, ones, seq, MPI_UNSIGNED_CHAR, avout, ones, seq, MPI_UNSIGNED_CHAR, MPI_COMM_WORLD);
  CHECK(avout[n - 1] == n - 1, "alltoallv got %d", avout[n - 1]);
  /* 2 x barrier */
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  /* 1 x gather, int32 x 4 per rank, root 0; 1 x scatter, int32 x 4 per rank, root 0 */
  int ga[4], gaout[4 * 64];
  for (int i = 0; i < 4; ++i) ga[i] = rank;
  MPI_Gather(ga, 4, MPI_INT, gaout, 4, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0) CHECK(gaout[4 * (n - 1)] == n - 1, "gather got %d", gaout[4 * (n - 1)]);
  MPI_Scatter(gaout, 4, MPI_INT, ga, 4, MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(ga[0] == rank, "scatter got %d", ga[0]);
  /* ring: 1 send + 1 recv (int32 x 16) per rank, then 1 sendrecv (= 1 send + 1 recv) */
  int s[16], r[16];
  for (int i = 0; i < 16; ++i) s[i] = rank;
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  if (rank % 2 == 0) {
    MPI_Send(s, 16, MPI_INT, right, 7, MPI_COMM_WORLD);
    MPI_Recv(r, 16, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    MPI_Recv(r, 16, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(s, 16, MPI_INT, right, 7, MPI_COMM_WORLD);
  }
  CHECK(r[0] == left, "recv got %d", r[0]);
  MPI_Sendrecv(s, 16, MPI_INT, right, 8, r, 16, MPI_INT, left, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  CHECK(r[15] == left, "sendrecv got %d", r[15]);
  /* nonblocking: 1 isend + 1 irecv (float64 x 8) completed by Waitall */
  double is[8], ir[8];
  for (int i = 0; i < 8; ++i) is[i] = rank;
  MPI_Request reqs[2];
  MPI_Irecv(ir, 8, MPI_DOUBLE, left, 9, MPI_COMM_WORLD, &reqs[0]);
  MPI_Isend(is, 8, MPI_DOUBLE, right, 9, MPI_COMM_WORLD, &reqs[1]);
  MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
  CHECK(ir[0] == left, "irecv got %f", ir[0]);
  /* 2 small isends in flight at once (Open MPI may give both one shared, already complete
   * request handle) + 2 irecvs, completed by one Waitall */
  int t2[2] = {rank, rank}, r2[2] = {-1, -1};
  MPI_Request q4[4];
  MPI_Irecv(&r2[0], 1, MPI_INT, left, 10, MPI_COMM_WORLD, &q4[0]);
  MPI_Irecv(&r2[1], 1, MPI_INT, left, 11, MPI_COMM_WORLD, &q4[1]);
  MPI_Isend(&t2[0], 1, MPI_INT, right, 10, MPI_COMM_WORLD, &q4[2]);
  MPI_Isend(&t2[1], 1, MPI_INT, right, 11, MPI_COMM_WORLD, &q4[3]);
  MPI_Waitall(4, q4, MPI_STATUSES_IGNORE);
  CHECK(r2[0] == left && r2[1] == left, "two irecvs got %d %d", r2[0], r2[1]);
  /* 1 x iallreduce (int64 x 4, sum) completed by Wait; 1 x ibcast (uint8 x 32) by Test */
  long il[4];
  for (int i = 0; i < 4; ++i) il[i] = 1;
  MPI_Request q;
  MPI_Iallreduce(MPI_IN_PLACE, il, 4, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &q);
  MPI_Wait(&q, MPI_STATUS_IGNORE);
  CHECK(il[3] == n, "iallreduce got %ld", il[3]);
  unsigned char ib[32];
  memset(ib, rank == 0 ? 5 : 0, sizeof ib);
  MPI_Ibcast(ib, 32, MPI_BYTE, 0, MPI_COMM_WORLD, &q);
  int done = 0;
  while (!done) MPI_Test(&q, &done, MPI_STATUS_IGNORE);
  CHECK(ib[31] == 5, "ibcast got %d", ib[31]);
  /* sub-communicators: split by parity -> 2 x all_reduce (int32 x 1); dup of world -> 1 barrier */
  MPI_Comm half, dup;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  int one = 1, hsum = 0;
  MPI_Allreduce(&one, &hsum, 1, MPI_INT, MPI_SUM, half);
  MPI_Allreduce(&one, &hsum, 1, MPI_INT, MPI_SUM, half);
  CHECK(hsum == (n + 1 - rank % 2) / 2, "split allreduce got %d", hsum);
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MPI_Barrier(dup);
  MPI_Comm_free(&dup);
  MPI_Comm_free(&half);

  if (argc > 1) hold_until_go(argv[1], rank);
  MPI_Finalize();
  if (failures) fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
  return failures ? 1 : 0;
}
