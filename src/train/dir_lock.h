// A run's hold on its --checkpoint-dir: one writer at a time. Two runs that shared a
// directory would prune each other's checkpoints, delete each other's temporary directories
// and publish half-written steps; the second is refused at its start instead.
//
// The hold is an flock(2) on DIR/.saturate.lock, so the kernel releases it when its owner
// ends in any way (kill -9 included): a dead owner never holds a directory. The file names
// the owner (pid, host, start time) for the refusal's message; the owner removes it when it
// ends normally (while still holding it, so that a waiting run locks a fresh file).
#pragma once
#include <string>

namespace sat {

class DirLock {
 public:
  // Takes the hold on `dir` (created if missing) for this process. sat::Error naming `flag`,
  // the directory and its owner when another run (or another Trainer of this process) holds it.
  DirLock(const std::string& dir, const std::string& flag);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// "DIR/.saturate.lock".
std::string dir_lock_path(const std::string& dir);

}  // namespace sat
