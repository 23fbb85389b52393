#include "hetobs/observe/job_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "hetobs/common/error.h"

namespace hetobs {
namespace {

void mkdirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST)
      throw Error("cannot create directory " + cur + ": " + errnoString(errno));
  }
}

}  // namespace

JobDir::JobDir(std::string root, std::string job) : root_(std::move(root)), job_(std::move(job)) {
  path_ = root_ + "/" + job_;
}

std::string JobDir::rankFile(int rank) const { return path_ + "/ranks/rank-" + std::to_string(rank) + ".json"; }
std::string JobDir::incidentDir(const std::string& incident) const { return path_ + "/incidents/" + incident; }
std::string JobDir::dumpFile(const std::string& incident, int rank) const {
  return incidentDir(incident) + "/rank-" + std::to_string(rank) + ".json";
}

void JobDir::ensure() const {
  mkdirs(path_ + "/ranks");
  mkdirs(path_ + "/incidents");
}

void JobDir::writeRankMetadata(int rank, const std::string& json) const {
  ensure();
  atomicWrite(rankFile(rank), json, false);
}

bool JobDir::writeDump(const std::string& incident, int rank, const std::string& json, bool replace) const {
  mkdirs(incidentDir(incident));
  return atomicWrite(dumpFile(incident, rank), json, !replace);
}

bool atomicWrite(const std::string& path, const std::string& data, bool exclusive) {
  if (exclusive && access(path.c_str(), F_OK) == 0) return false;
  // Unique per writer: two threads of one process may write the same file at once.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter.fetch_add(1));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot create " + tmp + ": " + errnoString(errno));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      unlink(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + errnoString(e));
    }
    off += size_t(n);
  }
  fsync(fd);
  close(fd);
  if (exclusive) {
    // link() fails if the target exists: exclusive even against another writer.
    int rc = link(tmp.c_str(), path.c_str());
    int e = errno;
    unlink(tmp.c_str());
    if (rc != 0) {
      if (e == EEXIST) return false;
      throw Error("cannot create " + path + ": " + errnoString(e));
    }
    return true;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path + ": " + errnoString(e));
  }
  return true;
}

}  // namespace hetobs
