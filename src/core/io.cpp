#include "core/io.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <streambuf>
#include <vector>

#include "core/error.h"

namespace sat {

uint64_t peak_resident_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}
namespace {

namespace fs = std::filesystem;

// An output stream onto a file descriptor (the temporary file mkstemp opened).
class FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd), buf_(size_t(1) << 16) { setp(buf_.data(), buf_.data() + buf_.size()); }
  bool failed() const { return failed_; }
  int error() const { return errno_; }

 protected:
  int_type overflow(int_type c) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return flush_buffer() ? 0 : -1; }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n < std::streamsize(buf_.size())) return std::streambuf::xsputn(s, n);
    if (!flush_buffer() || !write_all(s, size_t(n))) return 0;
    return n;
  }

 private:
  bool write_all(const char* p, size_t n) {
    while (n > 0 && !failed_) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failed_ = true;
        errno_ = errno;
        break;
      }
      p += w;
      n -= size_t(w);
    }
    return !failed_;
  }
  bool flush_buffer() {
    const size_t n = size_t(pptr() - pbase());
    setp(buf_.data(), buf_.data() + buf_.size());
    return write_all(buf_.data(), n);
  }
  int fd_;
  std::vector<char> buf_;
  bool failed_ = false;
  int errno_ = 0;
};

// The process's umask without changing it (umask() sets it while reading it, a race with
// other threads creating files): /proc/self/status has it on Linux 4.7 and later.
mode_t current_umask() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Umask:", 0) == 0) return mode_t(std::strtoul(line.c_str() + 6, nullptr, 8));
  return 022;
}

std::string dir_of(const std::string& path) {
  const fs::path d = fs::path(path).parent_path();
  return d.empty() ? "." : d.string();
}

// A file can be created in `dir` (and removed again).
void probe_writable(const std::string& what, const std::string& dir, const std::string& target) {
  std::string name = (fs::path(dir) / ".saturate-probe-XXXXXX").string();
  const int fd = mkstemp(name.data());
  SAT_CHECK(fd >= 0, what, ": cannot write ", target, ": directory ", dir, " is not writable (", std::strerror(errno), ")");
  ::close(fd);
  ::unlink(name.c_str());
}

void check_not_special(const std::string& what, const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  SAT_CHECK(!fs::exists(st) || fs::is_regular_file(st), what, ": ", path, " exists and is not a regular file (",
            fs::is_directory(st) ? "a directory" : "a device, FIFO or socket", "): give a file name; it was left as it is");
}

// What a file that is not a regular file is, for messages.
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

std::string prefix(const std::string& what) { return what.empty() ? "" : what + ": "; }

}  // namespace

InputFile::InputFile(const std::string& what, const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  SAT_CHECK(fd_ >= 0, prefix(what), path, ": cannot read the file (", std::strerror(errno), ")");
  struct stat st {};
  const bool stat_ok = ::fstat(fd_, &st) == 0;
  const int err = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    SAT_CHECK(stat_ok, prefix(what), path, ": cannot read the file (", std::strerror(err), ")");
    fail(prefix(what), path, " is ", kind_of(st.st_mode), ", not a regular file; expected a file");
  }
  size_ = uint64_t(st.st_size);
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

int InputFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string read_input_file(const std::string& what, const std::string& path, uint64_t max_bytes) {
  InputFile f(what, path);
  SAT_CHECK(f.size() <= max_bytes, prefix(what), path, " is ", f.size(), " bytes, more than the ", max_bytes,
            " expected of it");
  std::string text(size_t(f.size()), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(f.fd(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    SAT_CHECK(r >= 0, prefix(what), path, ": cannot read the file (", std::strerror(errno), ")");
    if (r == 0) break;
    got += size_t(r);
  }
  text.resize(got);  // (a file that shrank while read: what it held)
  return text;
}

void check_input_path(const std::string& what, const std::string& path, bool dir_ok) {
  struct stat st {};
  SAT_CHECK(::stat(path.c_str(), &st) == 0, prefix(what), path, " does not exist or cannot be read (",
            std::strerror(errno), ")");
  if (S_ISREG(st.st_mode) || (dir_ok && S_ISDIR(st.st_mode))) return;
  fail(prefix(what), path, " is ", kind_of(st.st_mode), ", not a regular file",
       dir_ok ? " or a directory" : "", "; expected a file", dir_ok ? " or a directory" : "");
}

void check_output_file(const std::string& what, const std::string& path) {
  SAT_CHECK(!path.empty() && path.back() != '/', what, ": expected a file name, got '", path, "'");
  check_not_special(what, path);
  const std::string dir = dir_of(path);
  std::error_code ec;
  SAT_CHECK(fs::is_directory(dir, ec), what, ": directory ", dir, " does not exist (for ", path, ")");
  probe_writable(what, dir, path);
}

void check_output_dir(const std::string& what, const std::string& dir) {
  SAT_CHECK(!dir.empty(), what, ": expected a directory name");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  SAT_CHECK(!fs::exists(st) || fs::is_directory(st), what, ": ", dir,
            " exists and is not a directory: give a directory; it was left as it is");
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    SAT_CHECK(!ec && fs::is_directory(dir), what, ": cannot create directory ", dir, ": ",
              ec ? ec.message() : std::string("not a directory"));
  }
  probe_writable(what, dir, dir);
}

void write_file_atomic(const std::string& what, const std::string& path,
                       const std::function<void(std::ostream&)>& write) {
  check_not_special(what, path);
  const std::string dir = dir_of(path);
  std::string tmp = path + ".tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());
  SAT_CHECK(fd >= 0, what, ": cannot write ", path, ": ", std::strerror(errno));
  auto give_up = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(what, ": cannot write ", path, ": ", why);
  };
  struct stat old {};
  const mode_t mode = ::stat(path.c_str(), &old) == 0 ? (old.st_mode & 07777) : (0666 & ~current_umask());
  if (::fchmod(fd, mode) != 0) give_up(std::strerror(errno));
  FdBuf buf(fd);
  std::ostream os(&buf);
  try {
    write(os);
    os.flush();
  } catch (const std::exception& e) {
    give_up(e.what());
  }
  if (!os || buf.failed()) give_up(std::strerror(buf.error() ? buf.error() : EIO) + std::string(" (disk full?)"));
  if (::fsync(fd) != 0) give_up(std::strerror(errno));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(what, ": cannot write ", path, ": ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(what, ": cannot write ", path, ": ", std::strerror(e));
  }
  // The rename itself is durable once the directory is.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& what, const std::string& path, std::string_view text) {
  write_file_atomic(what, path, [&](std::ostream& os) { os.write(text.data(), std::streamsize(text.size())); });
}

}  // namespace sat
