/* Communicators made by virtual-topology constructors and Comm_dup_with_info, each used
 * with its own op kind so the test can tell them apart in the stats segment (4 ranks):
 *   Cart_create 1-D periodic (4)   -> 1 x MPI_Bcast
 *   Cart_create 2 x 2 (4)          -> 1 x MPI_Reduce
 *   Cart_sub of it, rows (2 each)  -> 2 x MPI_Allreduce
 *   Comm_dup_with_info (4)         -> 1 x MPI_Barrier
 *   Graph_create ring (4)          -> 1 x MPI_Alltoall
 *   Dist_graph_create_adjacent (4) -> 1 x MPI_Allgather
 *   Dist_graph_create (4)          -> 1 x MPI_Gather
 *   Intercomm_merge of the two halves' intercommunicator (4) -> 1 x MPI_Scatter
 *   Comm_idup (4), a Comm_dup made before its request completes -> 1 x MPI_Reduce_scatter_block
 * Then, with a directory argument: writes ready-<rank> and waits for "go" before
 * MPI_Finalize, so the test can read the live segments. */
#include <mpi.h>

#include "test_support.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(n == 4, "needs 4 ranks, got %d", n);

  MPI_Comm ring, grid, row, info_dup, graph, adjacent, dist;
  int dims1[1] = {n}, periods1[1] = {1};
  MPI_Cart_create(MPI_COMM_WORLD, 1, dims1, periods1, 0, &ring);
  int v = rank == 0 ? 7 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, ring);
  CHECK(v == 7, "cart bcast got %d", v);

  int dims2[2] = {2, 2}, periods2[2] = {0, 0};
  MPI_Cart_create(MPI_COMM_WORLD, 2, dims2, periods2, 0, &grid);
  int one = 1, total = 0;
  MPI_Reduce(&one, &total, 1, MPI_INT, MPI_SUM, 0, grid);
  int remain[2] = {0, 1};
  MPI_Cart_sub(grid, remain, &row);
  int rsum = 0;
  MPI_Allreduce(&rank, &rsum, 1, MPI_INT, MPI_SUM, row);
  MPI_Allreduce(&rank, &rsum, 1, MPI_INT, MPI_SUM, row);
  CHECK(rsum == (rank / 2) * 4 + 1, "row allreduce got %d", rsum);

  MPI_Comm_dup_with_info(MPI_COMM_WORLD, MPI_INFO_NULL, &info_dup);
  MPI_Barrier(info_dup);

  int index[4] = {2, 4, 6, 8}, edges[8] = {1, 3, 0, 2, 1, 3, 2, 0};
  MPI_Graph_create(MPI_COMM_WORLD, 4, index, edges, 0, &graph);
  int a2a_in[4] = {rank, rank, rank, rank}, a2a_out[4];
  MPI_Alltoall(a2a_in, 1, MPI_INT, a2a_out, 1, MPI_INT, graph);
  CHECK(a2a_out[3] == 3, "graph alltoall got %d", a2a_out[3]);

  int left = (rank + n - 1) % n, right = (rank + 1) % n;
  int sources[2] = {left, right}, dests[2] = {left, right};
  MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 2, sources, MPI_UNWEIGHTED, 2, dests, MPI_UNWEIGHTED,
                                 MPI_INFO_NULL, 0, &adjacent);
  int ag[4];
  MPI_Allgather(&rank, 1, MPI_INT, ag, 1, MPI_INT, adjacent);
  CHECK(ag[2] == 2, "dist graph allgather got %d", ag[2]);

  int degrees[1] = {1}, dest[1] = {right}, src[1] = {rank};
  MPI_Dist_graph_create(MPI_COMM_WORLD, 1, src, degrees, dest, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &dist);
  int gathered[4];
  MPI_Gather(&rank, 1, MPI_INT, gathered, 1, MPI_INT, 0, dist);

  MPI_Comm half, inter, merged;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half); /* even and odd ranks; no op on it */
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 99, &inter);
  MPI_Intercomm_merge(inter, rank % 2, &merged);
  int parts[4] = {10, 11, 12, 13}, part = -1;
  MPI_Scatter(parts, 1, MPI_INT, &part, 1, MPI_INT, 0, merged);
  CHECK(part >= 10 && part <= 13, "merged scatter got %d", part);

  /* The idup's request completes after another child of the world was made: its id must
   * still come from its place in call order, the same on every rank. */
  MPI_Comm idup, later;
  MPI_Request req;
  MPI_Comm_idup(MPI_COMM_WORLD, &idup, &req);
  MPI_Comm_dup(MPI_COMM_WORLD, &later);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  double rs_in[4] = {1, 1, 1, 1}, rs_out = 0;
  MPI_Reduce_scatter_block(rs_in, &rs_out, 1, MPI_DOUBLE, MPI_SUM, idup);
  CHECK(rs_out == 4.0, "idup reduce_scatter got %f", rs_out);

  if (argc > 1) hold_until_go(argv[1], rank);
  MPI_Finalize();
  if (failures) fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
  return failures ? 1 : 0;
}
