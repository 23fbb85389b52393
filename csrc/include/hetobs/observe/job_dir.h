#pragma once
// The job directory contract (docs/dump-schema.md): ranks/rank-<r>.json metadata and
// incidents/<id>/rank-<r>.json dumps. Directories are 0700, files 0600. Dumps are
// created exclusively under a temp name and renamed into place, so a reader never
// sees half a file and an earlier incident is never overwritten.
#include <string>

namespace hetobs {

class JobDir {
 public:
  JobDir(std::string root, std::string job);
  const std::string& path() const { return path_; }
  std::string rankFile(int rank) const;
  std::string incidentDir(const std::string& incident) const;
  std::string dumpFile(const std::string& incident, int rank) const;

  // Create the directories (0700). Throws Error naming the path.
  void ensure() const;
  // Replace the metadata file atomically.
  void writeRankMetadata(int rank, const std::string& json) const;
  // Write a dump; returns false (and writes nothing) if this rank already has one in
  // that incident, unless `replace` (a rank's own error dump replacing the one it wrote at
  // a peer's request). Throws Error on I/O failure.
  bool writeDump(const std::string& incident, int rank, const std::string& json, bool replace = false) const;

 private:
  std::string root_, job_, path_;
};

// Write `data` to `path` atomically (temp file in the same directory, fsync, rename).
// exclusive: fail with EEXIST semantics (returns false) if `path` exists.
bool atomicWrite(const std::string& path, const std::string& data, bool exclusive);

}  // namespace hetobs
