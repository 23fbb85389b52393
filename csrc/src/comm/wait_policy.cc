#include "hetobs/comm/wait_policy.h"

#include <sched.h>
#include <unistd.h>

namespace hetobs {

// CPUs the same-host ranks share: this process's affinity mask (taskset, cgroup cpusets),
// unless it holds a single CPU: a launcher that binds each rank to a core of its own
// (Open MPI, `taskset -c r`) leaves one CPU per rank, which says nothing of how many the
// ranks have together, so the host's online count stands in.
int WaitPolicy::sharedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int mask = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (mask > 1) return mask;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? int(online) : 1;
}

}  // namespace hetobs
