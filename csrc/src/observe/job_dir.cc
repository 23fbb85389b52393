#include "hetobs/observe/job_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "hetobs/common/error.h"
#include "hetobs/common/log.h"

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

std::string modeString(mode_t m) { return strFormat("%04o", unsigned(m & 07777)); }

}  // namespace

std::string unsafeDirReason(const std::string& path, bool shared) {
  struct stat st {};
  // The root is the user's choice (a link to shared storage is fine); below it nothing is followed.
  if ((shared ? stat(path.c_str(), &st) : lstat(path.c_str(), &st)) != 0) return "cannot be read: " + errnoString(errno);
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  uid_t me = geteuid();
  // A shared root may belong to root and be writable by all when sticky (like /tmp): then no
  // other user can rename or replace what we make inside it.
  bool sticky = shared && (st.st_mode & S_ISVTX);
  if (st.st_uid != me && !(shared && st.st_uid == 0))
    return strFormat("is owned by uid %u, not by this user (uid %u)", unsigned(st.st_uid), unsigned(me));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !sticky)
    return "is writable by group or others (mode " + modeString(st.st_mode) + ")";
  return "";
}

JobDir::JobDir(std::string root, std::string job) : root_(std::move(root)), job_(std::move(job)) {
  path_ = root_ + "/" + job_;
}

std::string JobDir::rankFile(int rank) const { return path_ + "/ranks/rank-" + std::to_string(rank) + ".json"; }
std::string JobDir::incidentDir(const std::string& incident) const { return path_ + "/incidents/" + incident; }
std::string JobDir::dumpFile(const std::string& incident, int rank) const {
  return incidentDir(incident) + "/rank-" + std::to_string(rank) + ".json";
}

void JobDir::refuseUnlessSafe(const std::string& dir, bool shared) const {
  std::string why = unsafeDirReason(dir, shared);
  if (why.empty()) return;
  refused_.store(true);
  throw Error("directory " + dir + " " + why + ": hetobs writes nothing there (no rank files or dumps; the job " +
              "runs on). Remove it, or point HETOBS_DIR at a directory of your own");
}

std::string JobDir::commFile(uint64_t commId, const std::string& hash) const {
  return path_ + "/comms/comm-" + std::to_string(commId) + "-" + hash + ".json";
}

void JobDir::writeCommFile(uint64_t commId, const std::string& hash, const std::string& json) const {
  if (refused_.load()) return;
  ensure();
  const std::string dir = path_ + "/comms";
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot create directory " + dir + ": " + errnoString(errno));
  refuseUnlessSafe(dir, false);
  atomicWrite(commFile(commId, hash), json, false);
}

void JobDir::ensure() const {
  if (refused_.load()) throw Error("job directory " + path_ + " was refused");
  // Another local user may have made any of these first (or a link in their place): their
  // planted incidents would drive our diagnosis, and they could read or swap our files. Each
  // is checked before anything is made inside it.
  mkdirs(root_);
  refuseUnlessSafe(root_, true);
  for (const std::string& d : {path_, path_ + "/ranks", path_ + "/incidents"}) {
    if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
      throw Error("cannot create directory " + d + ": " + errnoString(errno));
    refuseUnlessSafe(d, false);
  }
}

void JobDir::writeRankMetadata(int rank, const std::string& json) const {
  if (refused_.load()) return;  // said once, when it was refused
  ensure();
  atomicWrite(rankFile(rank), json, false);
}

bool JobDir::writeDump(const std::string& incident, int rank, const std::string& json, bool replace) const {
  if (refused_.load()) return false;
  ensure();
  if (mkdir(incidentDir(incident).c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot create directory " + incidentDir(incident) + ": " + errnoString(errno));
  refuseUnlessSafe(incidentDir(incident), false);
  return atomicWrite(dumpFile(incident, rank), json, !replace);
}

std::string JobDir::incidentStateFile(const std::string& incident, const std::string& state) const {
  return incidentDir(incident) + "/" + state + ".json";
}

bool JobDir::writeIncidentState(const std::string& incident, const std::string& state, const std::string& json) const {
  if (refused_.load()) return false;
  ensure();
  if (mkdir(incidentDir(incident).c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot create directory " + incidentDir(incident) + ": " + errnoString(errno));
  refuseUnlessSafe(incidentDir(incident), false);
  return atomicWrite(incidentStateFile(incident, state), json, true);
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
