// Text files to token shards, streamed (`saturate tokenize`): the corpus is read in pieces
// of whole lines, encoded by a pool of threads and written to shards as they fill; at any
// time only a few pieces per thread are in memory, whatever the corpus' size.
//
// Each file is a document: its tokens begin with the tokenizer's <s> (when it has one),
// so decoding every shard in order gives the files' text concatenated. The first
// val_tokens tokens go to the validation shards (NAME_val_000000.bin, ...), the rest to
// NAME_train_<index>.bin, the index going on from the validation shards' (llm.c's naming).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace sat {

// Whole lines of text files, in pieces of about `target` bytes (a line longer than twice
// that is cut by text_cut). Files are read through core/io.h's InputFile (`what` names the
// flag in messages) as they come, one block at a time.
class TextReader {
 public:
  TextReader(std::vector<std::string> files, std::string what, size_t target = size_t(1) << 20);
  ~TextReader();
  // The next piece; doc_start when it is the first of its file. False at the end.
  bool next(std::string& text, bool& doc_start);
  // The next line, without its newline (empty lines included). False at the end.
  bool next_line(std::string& line);
  uint64_t bytes_read() const { return read_; }
  uint64_t bytes_total() const { return total_; }  // the files' sizes when opened

 private:
  bool read_block();  // appends one block of the current file to pending_; false at its end

  std::vector<std::string> files_;
  std::string what_;
  size_t target_;
  size_t next_file_ = 0;
  int fd_ = -1;
  bool first_piece_ = false;
  std::string pending_, lines_;
  size_t line_at_ = 0;
  uint64_t read_ = 0, total_ = 0;
};

struct TokenizeProgress {
  uint64_t bytes_read = 0, bytes_total = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;  // text files, in order
  std::string out_dir;              // exists and is writable (check_output_dir)
  std::string name = "text";        // NAME_val_000000.bin ...
  int64_t shard_tokens = 100000000;
  int64_t val_tokens = -1;  // -1: the first shard's worth (shard_tokens); 0: no validation split
  int threads = 1;
  // Called about every progress_seconds while the text is encoded.
  std::function<void(const TokenizeProgress&)> progress;
  double progress_seconds = 5;
};

struct ShardInfo {
  std::string path;
  int64_t tokens = 0;
  bool val = false;
};

struct TokenizeResult {
  std::vector<ShardInfo> shards;
  int64_t val_tokens = 0, train_tokens = 0;
  uint64_t bytes = 0;      // text read
  double seconds = 0;      // encoding and writing
};

// The options' mistakes, before any work: sat::Error naming the flag. An out_dir that
// already holds NAME_val_* / NAME_train_* shards is refused (nothing of a former run is
// overwritten).
void check_tokenize_options(const TokenizeOptions& o);

// Encodes the inputs into shards in out_dir (format: the tokenizer's vocabulary's, see
// shard_format_for). On any error, and when the training split would be empty, the shards
// written so far are removed and sat::Error says why.
TokenizeResult tokenize_files(const Tokenizer& tok, const TokenizeOptions& o);

}  // namespace sat
