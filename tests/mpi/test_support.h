/* Shared by the MPI test programs in this folder (included by path: mpicc finds it next
 * to the program). */
#ifndef HETOBS_TESTS_MPI_TEST_SUPPORT_H
#define HETOBS_TESTS_MPI_TEST_SUPPORT_H

#include <stdio.h>
#include <unistd.h>

/* Count a failed check and say which, on stderr; the program exits 1 if any failed. */
static int failures __attribute__((unused)) = 0;  /* not every program uses CHECK */
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "rank %d: check failed: ", rank);    \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

/* Tell the test this rank is done with its ops (creates DIR/ready-<rank>), then hold,
 * before MPI_Finalize, until the test creates DIR/go (at most 120 s), so it can read the
 * live stats segments and ask for dumps while the ranks are still up. */
static void hold_until_go(const char* dir, int rank) {
  char path[4096];
  snprintf(path, sizeof path, "%s/ready-%d", dir, rank);
  FILE* fp = fopen(path, "w");
  if (fp) fclose(fp);
  snprintf(path, sizeof path, "%s/go", dir);
  for (int i = 0; i < 12000 && access(path, F_OK) != 0; ++i) usleep(10000);
}

#endif
