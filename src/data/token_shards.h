// llm.c's token shards: the files `saturate tokenize` writes and `--data tokens:` reads.
//
//   header   256 little-endian int32: [0] magic, [1] version, [2] the token count N
//            (0 <= N < 2^31); the other 253 are 0
//   tokens   N little-endian tokens right after the header, in one of two formats:
//              magic 20240520, version 1: uint16 (llm.c's GPT-2 format; ids < 65,536)
//              magic 20240801, version 7: uint32 (llm.c's Llama 3 format; any vocabulary)
// A shard is exactly 1024 + N * 2 (or 4) bytes. For reading, a shard may be gzip-compressed
// (it is then decompressed into memory; a plain one is memory-mapped).
//
// A directory of shards written by `saturate tokenize` is named as llm.c names its own:
// NAME_val_000000.bin (the validation split's shards first), then NAME_train_000001.bin,
// NAME_train_000002.bin, ..., with tokenizer.model (the SentencePiece model) beside them.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace sat {

enum class ShardFormat { u16, u32 };

struct ShardFormatInfo {
  int32_t magic, version;
  int width;         // bytes per token
  const char* name;  // "uint16" / "uint32"
};
ShardFormatInfo shard_format_info(ShardFormat f);
// The format whose tokens hold every id of a vocabulary: uint16 up to 65,536 ids.
ShardFormat shard_format_for(int64_t vocab);

constexpr int64_t kShardHeaderBytes = 1024;
constexpr int64_t kMaxShardTokens = (int64_t(1) << 31) - 1;  // the header's int32 count

// One shard written as its tokens arrive (buffered; nothing of the stream is held): the
// header's count is written by close(), which flushes and syncs the file. A shard that is
// destroyed unclosed (an error on the way) is removed. Errors name the file.
class ShardWriter {
 public:
  ShardWriter(std::string path, ShardFormat f);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // Appends n ids (each must fit the format: < 65,536 for uint16).
  void write(const int32_t* ids, size_t n);
  void close();
  int64_t tokens() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  ShardFormat format_;
  FILE* f_ = nullptr;
  int64_t count_ = 0;
  std::vector<uint8_t> buf_;
};

// The files a --data tokens: part names: PATTERN is a file, a glob (*, ?, [...]; the
// matches in name order) or a directory (its *.bin and *.bin.gz files). sat::Error naming
// `what` and the pattern when nothing matches.
std::vector<std::string> token_shard_files(const std::string& pattern, const std::string& what);

// True for a validation shard's file name (it holds "_val_", as llm.c names them).
bool is_val_shard(const std::string& path);

// The schema (Dataset::schema()) of token shards with a tokenizer.model beside them, which
// weights and checkpoints keep: {"format": "saturate tokens 1", "tokenizer": ABSOLUTE_PATH,
// "vocab": V}, so that `saturate generate` finds the tokenizer of the model's training
// data. tokenizer_of_schema: the path such a schema names; "" for any other schema (a
// table's, none, or one that is not JSON).
std::string tokens_schema(const std::string& tokenizer_path, int64_t vocab);
std::string tokenizer_of_schema(const std::string& schema);

}  // namespace sat
