#pragma once
// The job directory contract (docs/dump-schema.md): ranks/rank-<r>.json metadata and
// incidents/<id>/rank-<r>.json dumps. Directories are 0700, files 0600. Dumps are
// created exclusively under a temp name and renamed into place, so a reader never
// sees half a file and an earlier incident is never overwritten.
#include <atomic>
#include <cstdint>
#include <string>

namespace hetobs {

class JobDir {
 public:
  JobDir(std::string root, std::string job);
  const std::string& path() const { return path_; }
  std::string rankFile(int rank) const;
  std::string incidentDir(const std::string& incident) const;
  std::string dumpFile(const std::string& incident, int rank) const;
  // comms/comm-<id>-<hash>.json: one communicator's membership and ring, written once by
  // its lowest member (docs/dump-schema.md), so dumps and rank files need not repeat them.
  std::string commFile(uint64_t commId, const std::string& hash) const;

  // Create the directories (0700). Throws Error naming the path; also when one of them (or
  // the root) is not safe to use (unsafeDirReason): from then on this JobDir writes nothing.
  void ensure() const;
  // False once a directory was refused: rank files and dumps are off for this process.
  bool usable() const { return !refused_.load(); }
  // Replace the metadata file atomically.
  void writeRankMetadata(int rank, const std::string& json) const;
  // Write a dump; returns false (and writes nothing) if this rank already has one in
  // that incident, unless `replace` (a rank's own error dump replacing the one it wrote at
  // a peer's request). Throws Error on I/O failure.
  bool writeDump(const std::string& incident, int rank, const std::string& json, bool replace = false) const;
  // incidents/<id>/<state>.json, a suspected hang's state (suspected, resolved, confirmed:
  // docs/dump-schema.md "Incident state"): the first writer of each state wins (exclusive
  // create, the permissions of dumps); false when it was there already. Throws Error on I/O failure.
  bool writeIncidentState(const std::string& incident, const std::string& state, const std::string& json) const;
  std::string incidentStateFile(const std::string& incident, const std::string& state) const;
  // Replace comms/comm-<id>-<hash>.json atomically (the same content whoever writes it).
  void writeCommFile(uint64_t commId, const std::string& hash, const std::string& json) const;

 private:
  void refuseUnlessSafe(const std::string& dir, bool shared) const;
  std::string root_, job_, path_;
  mutable std::atomic<bool> refused_{false};
};

// Why a directory may not hold our files ("" when it may): not a directory, a symbolic link
// (`shared`: followed), not owned by this user, or writable by group or others. `shared`
// (a root such as HETOBS_DIR) may also belong to root and be writable by all when sticky.
std::string unsafeDirReason(const std::string& path, bool shared);

// Write `data` to `path` atomically (temp file in the same directory, fsync, rename).
// exclusive: fail with EEXIST semantics (returns false) if `path` exists.
bool atomicWrite(const std::string& path, const std::string& data, bool exclusive);

}  // namespace hetobs
