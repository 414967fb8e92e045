// Output files that cannot hurt the user: every file saturate writes (summary.json,
// safetensors weights, tune and plan reports) goes through write_file_atomic, and every
// output named on the command line is checked by check_output_file / check_output_dir
// before any work starts. `what` names the flag (or file) in the one-line errors.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace sat {

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
