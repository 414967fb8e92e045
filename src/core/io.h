// Input and output files that cannot hurt the user. Every file saturate reads that a user
// names (weights, checkpoints, data, model files, hardware and calibration files, prompts,
// caches) is opened by open_input: a FIFO, a device or a socket is refused at once instead
// of blocking the run forever. Output files that cannot hurt the user: every file saturate writes (summary.json,
// safetensors weights, tune and plan reports) goes through write_file_atomic, and every
// output named on the command line is checked by check_output_file / check_output_dir
// before any work starts. `what` names the flag (or file) in the one-line errors.
#pragma once
#include <functional>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace sat {

// ---- inputs -----------------------------------------------------------------------------

// A file opened for reading: O_NONBLOCK while opening (a FIFO without a writer, or a
// device, does not block the open), then checked with fstat to be a regular file and set
// back to blocking reads. Refused otherwise with a sat::Error "WHAT: PATH is a FIFO, not a
// regular file" (or "cannot open PATH: why"); `what` names the flag (or the file that
// lists it), and may be empty. Closes the file when destroyed.
class InputFile {
 public:
  InputFile(const std::string& what, const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  int release();  // the descriptor, now the caller's to close

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole of an input file (opened by InputFile), refused when it is over max_bytes.
std::string read_input_file(const std::string& what, const std::string& path,
                            uint64_t max_bytes = uint64_t(1) << 30);

// A path given as an input: a regular file, or a directory where dir_ok; refused (naming
// `what` and what the path is: a FIFO, a device, a socket) otherwise, and when missing.
// Never blocks (it opens nothing but stats the path).
// The process's peak resident memory so far (getrusage's ru_maxrss), in bytes.
uint64_t peak_resident_bytes();

void check_input_path(const std::string& what, const std::string& path, bool dir_ok = false);

// ---- outputs ----------------------------------------------------------------------------

// An output file: refused (sat::Error naming `what` and the path) when it exists and is
// not a regular file (a directory, /dev/null, a FIFO: left untouched), or when its
// directory does not exist or cannot be written (probed with a temporary file, so this
// holds for root and read-only file systems too).
void check_output_file(const std::string& what, const std::string& path);

// An output directory: refused when it exists and is not a directory, or when it cannot be
// created or written; created (with its parents) when missing.
void check_output_dir(const std::string& what, const std::string& dir);

// Writes `path` atomically: `write` fills a uniquely named temporary file beside it
// (mkstemp: two writers never share one), which is flushed, fsynced and renamed over the
// target (its directory fsynced too). On any failure the temporary file is removed and
// the target keeps its old contents; a target that exists and is not a regular file is
// refused. The new file gets the old one's permissions, or 0666 less the umask.
void write_file_atomic(const std::string& what, const std::string& path,
                       const std::function<void(std::ostream&)>& write);
void write_file_atomic(const std::string& what, const std::string& path, std::string_view text);

}  // namespace sat
