#include "train/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace sat {

namespace {

// Who holds the lock, as its file says (printable ASCII only: the file is another
// process's, and its bytes go to a terminal).
std::string owner_of(int fd) {
  char buf[256] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s;
  for (ssize_t i = 0; i < n && buf[i] != '\n'; ++i) s += buf[i] >= 32 && buf[i] < 127 ? buf[i] : '?';
  return s.empty() ? "its owner has not recorded itself yet" : s;
}

std::string this_owner() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char when[64] = "?";
  if (::localtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %z", &tm);
  return str_cat("pid ", ::getpid(), " on host ", host, " since ", when, "\n");
}

bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::string dir_lock_path(const std::string& dir) { return (std::filesystem::path(dir) / ".saturate.lock").string(); }

DirLock::DirLock(const std::string& dir, const std::string& flag) : path_(dir_lock_path(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SAT_CHECK(!ec, flag, ": cannot create ", dir, ": ", ec.message());
  // A file its owner removed (and released) between our open and our lock is not the lock
  // any more: open the one at the path again.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    SAT_CHECK(fd >= 0, flag, ": cannot create the lock file ", path_, ": ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string owner = owner_of(fd);
      ::close(fd);
      SAT_CHECK(err != EWOULDBLOCK, flag, ": ", dir, " is in use by another run (", owner,
                "): give another directory, or wait for it to end");
      fail(flag, ": cannot lock ", path_, ": ", std::strerror(err));
    }
    if (same_file(fd, path_)) {
      fd_ = fd;
    } else {
      ::close(fd);
      SAT_CHECK(attempt < 100, flag, ": cannot lock ", path_, ": it keeps being replaced");
    }
  }
  const std::string me = this_owner();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    // The hold is what counts; the owner's line only makes a refusal clearer.
  }
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  if (same_file(fd_, path_)) ::unlink(path_.c_str());  // still held: nobody else has it open locked
  ::close(fd_);
}

}  // namespace sat
