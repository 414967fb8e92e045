// llm.c token shards: the writer `saturate tokenize` uses, and --data tokens:FILE|GLOB[:VAL]
// (open_tokens): memory-mapped shards windowed by the sequence length.
#include "data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "data/sources.h"
#include "data/tokenizer.h"

namespace sat {

namespace fs = std::filesystem;

ShardFormatInfo shard_format_info(ShardFormat f) {
  if (f == ShardFormat::u16) return {20240520, 1, 2, "uint16"};
  return {20240801, 7, 4, "uint32"};
}

ShardFormat shard_format_for(int64_t vocab) { return vocab <= 65536 ? ShardFormat::u16 : ShardFormat::u32; }

// ---------------------------------------------------------------- writing

ShardWriter::ShardWriter(std::string path, ShardFormat f) : path_(std::move(path)), format_(f) {
  f_ = std::fopen(path_.c_str(), "wb");
  SAT_CHECK(f_, path_, ": cannot write the token shard (", std::strerror(errno), ")");
  std::vector<uint8_t> header(kShardHeaderBytes, 0);
  if (std::fwrite(header.data(), 1, header.size(), f_) != header.size()) {
    std::fclose(f_);
    f_ = nullptr;
    std::remove(path_.c_str());
    fail(path_, ": cannot write the token shard (", std::strerror(errno), ")");
  }
  buf_.reserve(size_t(1) << 20);
}

ShardWriter::~ShardWriter() {
  if (!f_) return;
  std::fclose(f_);
  std::remove(path_.c_str());
}

void ShardWriter::write(const int32_t* ids, size_t n) {
  SAT_CHECK(f_, path_, ": the token shard is already closed");
  SAT_CHECK(count_ + int64_t(n) <= kMaxShardTokens, path_, ": a shard holds at most ", kMaxShardTokens,
            " tokens (the header's int32 count)");
  const ShardFormatInfo info = shard_format_info(format_);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    SAT_CHECK(id >= 0 && (format_ == ShardFormat::u32 || id < 65536), path_, ": token ", id, " does not fit the ",
              info.name, " shard format");
    const uint32_t v = uint32_t(id);
    const uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};  // little-endian
    buf_.insert(buf_.end(), b, b + info.width);
  }
  count_ += int64_t(n);
  if (buf_.size() >= (size_t(1) << 20)) {
    SAT_CHECK(std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size(), path_, ": cannot write the token shard (",
              std::strerror(errno), ")");
    buf_.clear();
  }
}

void ShardWriter::close() {
  SAT_CHECK(f_, path_, ": the token shard is already closed");
  const ShardFormatInfo info = shard_format_info(format_);
  int32_t header[256] = {info.magic, info.version, int32_t(count_)};
  bool ok = std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size();
  ok = ok && std::fseek(f_, 0, SEEK_SET) == 0 && std::fwrite(header, 1, sizeof header, f_) == sizeof header;
  ok = ok && std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  ok = std::fclose(f_) == 0 && ok;
  f_ = nullptr;
  if (!ok) std::remove(path_.c_str());
  SAT_CHECK(ok, path_, ": cannot write the token shard (", std::strerror(err ? err : errno), ")");
  buf_.clear();
  buf_.shrink_to_fit();
}

// ---------------------------------------------------------------- naming

namespace {

bool has_wildcard(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());  // byte order, whatever the locale
  return out;
}

}  // namespace

std::vector<std::string> token_shard_files(const std::string& pattern, const std::string& what) {
  std::error_code ec;
  if (fs::is_regular_file(pattern, ec) || (!has_wildcard(pattern) && !fs::is_directory(pattern, ec))) {
    SAT_CHECK(fs::exists(fs::symlink_status(pattern, ec)), pattern,
              ": token file not found; expected an llm.c token shard (--data tokens:FILE)");
    return {pattern};
  }
  std::vector<std::string> files;
  if (has_wildcard(pattern)) {
    files = glob_files(pattern);
  } else {
    files = glob_files((fs::path(pattern) / "*.bin").string());
    for (auto& f : glob_files((fs::path(pattern) / "*.bin.gz").string())) files.push_back(f);
    std::sort(files.begin(), files.end());
  }
  SAT_CHECK(!files.empty(), what, pattern, ": no file matches ", pattern,
            "; expected llm.c token shards (.bin files: a file, a glob such as DIR/*.bin, or a directory)");
  return files;
}

bool is_val_shard(const std::string& path) {
  return fs::path(path).filename().string().find("_val_") != std::string::npos;
}

// ---------------------------------------------------------------- reading

namespace data_detail {
namespace {

// The format a header names; sat::Error naming the file otherwise.
ShardFormat header_format(const int32_t* hdr, const std::string& path) {
  for (ShardFormat f : {ShardFormat::u16, ShardFormat::u32}) {
    const ShardFormatInfo i = shard_format_info(f);
    if (hdr[0] != i.magic) continue;
    SAT_CHECK(hdr[1] == i.version, path, ": token-shard version is ", hdr[1], "; expected ", i.version, " (", i.name,
              " tokens) with magic number ", i.magic);
    SAT_CHECK(hdr[2] >= 0, path, ": token count ", hdr[2], " in the header; expected 0 or more");
    return f;
  }
  fail(path, ": token-shard magic number is ", hdr[0], "; expected 20240520 (uint16 tokens) or 20240801 (uint32 "
       "tokens): llm.c's .bin format, a 256 int32 header then the tokens");
}

// The most of the mapped shards a process holds resident before giving them back (see
// ShardsDataset::get): a corpus of any size costs this much resident memory, not its size.
constexpr int64_t kReleaseBytes = int64_t(64) << 20;

template <typename T>
uint32_t max_of(const T* t, int64_t b, int64_t e) {
  uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (e - b > (int64_t(1) << 22))
  for (int64_t i = b; i < e; ++i) m = std::max<uint32_t>(m, t[i]);
  return m;
}

// One shard's tokens: memory-mapped (a plain file) or decompressed into memory (gzip).
class Shard {
 public:
  explicit Shard(std::string path) : path_(std::move(path)) {
    InputFile f("--data", path_);  // a FIFO or a device refused, not waited on
    uint8_t magic[2] = {0, 0};
    const bool gz = ::pread(f.fd(), magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (gz)
      read_gzip();
    else
      map(f);
  }
  ~Shard() {
    if (map_) ::munmap(map_, map_len_);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  ShardFormat format() const { return format_; }
  int64_t count() const { return count_; }
  size_t owned_bytes() const { return owned_.size(); }
  uint32_t at(int64_t i) const {
    if (format_ == ShardFormat::u16) return reinterpret_cast<const uint16_t*>(tokens_)[i];
    return reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // The largest token (0 for an empty shard): one pass over the shard, a piece at a time,
  // each piece's pages given back once read (a 2 GB shard never becomes 2 GB resident).
  uint32_t max_token() const {
    uint32_t m = 0;
    const int w = shard_format_info(format_).width;
    const int64_t piece = kReleaseBytes / w;
    for (int64_t b = 0; b < count_; b += piece) {
      const int64_t e = std::min(count_, b + piece);
      if (format_ == ShardFormat::u16)
        m = std::max(m, max_of(reinterpret_cast<const uint16_t*>(tokens_), b, e));
      else
        m = std::max(m, max_of(reinterpret_cast<const uint32_t*>(tokens_), b, e));
      release();
    }
    return m;
  }
  // Gives the mapped pages back to the page cache (they stay cached, the process stops
  // holding them; a later read maps them again). Safe while other threads read: the
  // mapping is read-only, so a page dropped under a reader is read again from the file.
  void release() const {
    if (map_) ::madvise(map_, map_len_, MADV_DONTNEED);
  }
  int64_t first_position(uint32_t token) const {
    int64_t i = 0;
    while (i < count_ && at(i) != token) ++i;
    return i;
  }

 private:
  void read_gzip() {
    owned_ = read_gzip_token_shard(path_, [&](const int32_t* hdr) {
      format_ = header_format(hdr, path_);
      count_ = hdr[2];
      return uint64_t(count_) * uint64_t(shard_format_info(format_).width);
    });
    tokens_ = owned_.data();
  }
  void map(const InputFile& f) {
    const uint64_t size = f.size();
    int32_t hdr[256];
    SAT_CHECK(size >= uint64_t(kShardHeaderBytes) && ::pread(f.fd(), hdr, sizeof hdr, 0) == ssize_t(sizeof hdr),
              path_, ": truncated: expected ", kShardHeaderBytes, " bytes of token-shard header (256 int32) but the "
              "file ends after ", size);
    format_ = header_format(hdr, path_);
    count_ = hdr[2];
    const int w = shard_format_info(format_).width;
    const uint64_t want = uint64_t(kShardHeaderBytes) + uint64_t(count_) * w;
    SAT_CHECK(size >= want, path_, ": truncated: expected ", count_ * w, " bytes of ", count_, " tokens but the file "
              "ends after ", size - kShardHeaderBytes, " of them (", size, " bytes in all)");
    SAT_CHECK(size == want, path_, ": holds more than the ", count_, " tokens its header says (", want,
              " bytes); expected exactly that many");
    map_len_ = size_t(size);
    map_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
    SAT_CHECK(map_ != MAP_FAILED, path_, ": cannot map the token shard (", std::strerror(errno), ")");
    tokens_ = static_cast<const uint8_t*>(map_) + kShardHeaderBytes;
  }

  std::string path_;
  ShardFormat format_ = ShardFormat::u16;
  int64_t count_ = 0;
  const uint8_t* tokens_ = nullptr;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  std::vector<uint8_t> owned_;
};

// Samples are non-overlapping windows of T+1 tokens within a shard (windows never span two
// shards): window j of a shard is x = tok[jT, jT+T), y = tok[jT+1, jT+T+1). The shards'
// windows follow one another in the shards' order.
class ShardsDataset : public Dataset {
 public:
  ShardsDataset(std::string name, std::vector<std::unique_ptr<Shard>> shards, int64_t T, int64_t vocab)
      : name_(std::move(name)), shards_(std::move(shards)), T_(T), vocab_(vocab) {
    for (size_t s = 0; s < shards_.size(); ++s) {
      const int64_t w = shards_[s]->count() > 0 ? (shards_[s]->count() - 1) / T_ : 0;
      tokens_ += shards_[s]->count();
      if (w == 0) continue;
      first_.push_back(windows_);
      index_.push_back(s);
      windows_ += w;
    }
  }
  int64_t size() const override { return windows_; }
  Shape sample_shape() const override { return Shape{T_}; }
  DType sample_dtype() const override { return DType::i32; }
  Shape label_shape() const override { return Shape{T_}; }
  int64_t num_classes() const override { return vocab_; }
  void get(int64_t i, void* x, int32_t* y) const override {
    const size_t k = size_t(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
    const Shard& s = *shards_[index_[k]];
    const int64_t base = (i - first_[k]) * T_;
    int32_t* xi = static_cast<int32_t*>(x);
    for (int64_t j = 0; j < T_; ++j) {
      xi[j] = int32_t(s.at(base + j));
      y[j] = int32_t(s.at(base + j + 1));
    }
    // Each window maps at most a page or two of its shard; every kReleaseBytes of pages
    // mapped, the shards give them back, so resident memory stays bounded whatever the
    // corpus size (the files stay in the page cache, which the kernel manages).
    const int64_t pages = (T_ + 1) * shard_format_info(s.format()).width / 4096 + 2;
    if (mapped_pages_.fetch_add(pages, std::memory_order_relaxed) + pages > kReleaseBytes / 4096) {
      mapped_pages_.store(0, std::memory_order_relaxed);
      for (auto& sh : shards_) sh->release();
    }
  }
  std::string name() const override { return name_; }
  size_t storage_bytes() const override {  // the mapped files are the page cache's, not held
    size_t n = 0;
    for (auto& s : shards_) n += s->owned_bytes();
    return n;
  }
  std::string schema() const override { return schema_; }
  int64_t tokens() const { return tokens_; }
  size_t shards() const { return shards_.size(); }
  void set_schema(std::string s) { schema_ = std::move(s); }

 private:
  std::string name_, schema_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t T_, vocab_;
  int64_t windows_ = 0, tokens_ = 0;
  std::vector<int64_t> first_;  // the first window of each shard that has windows
  std::vector<size_t> index_;   // ... and that shard's index
  mutable std::atomic<int64_t> mapped_pages_{0};  // pages mapped by get() since the last release
};

// Every token of the shard within the model's vocabulary.
void check_vocabulary(const Shard& s, const DataOptions& opt) {
  const uint32_t max_tok = s.max_token();
  if (int64_t(max_tok) < opt.vocab) return;
  fail(s.path(), ": holds token ", max_tok, " (the largest, at position ", s.first_position(max_tok),
            ") but the model's vocabulary has ", opt.vocab, " tokens (0..", opt.vocab - 1,
            "); expected every token < ", opt.vocab, " (for a GPT model, --vocab ", int64_t(max_tok) + 1,
            " or more fits it)");
}

// Opens a split's files, all in the format of `first` (the first shard opened of the run).
std::unique_ptr<ShardsDataset> open_split(const std::vector<std::string>& files, const std::string& name,
                                          const DataOptions& opt, const Shard*& first) {
  std::vector<std::unique_ptr<Shard>> shards;
  for (const std::string& f : files) {
    auto s = std::make_unique<Shard>(f);
    if (!first) first = s.get();
    SAT_CHECK(s->format() == first->format(), s->path(), ": its tokens are ", shard_format_info(s->format()).name,
              " (magic ", shard_format_info(s->format()).magic, ") but ", first->path(), "'s are ",
              shard_format_info(first->format()).name, " (magic ", shard_format_info(first->format()).magic,
              "); expected every shard of --data tokens: in one format");
    check_vocabulary(*s, opt);
    shards.push_back(std::move(s));
  }
  auto d = std::make_unique<ShardsDataset>(name, std::move(shards), opt.seq_len, opt.vocab);
  SAT_CHECK(d->size() > 0, files.size() == 1 ? files[0] : name, ": holds ", d->tokens(), " tokens",
            files.size() == 1 ? "" : str_cat(" in ", files.size(), " shards, none of them enough"),
            "; one sample needs the model's sequence length + 1 = ", opt.seq_len + 1, " tokens");
  return d;
}

// The tokenizer `saturate tokenize` saved beside the shards, when there is one: its
// vocabulary must be the model's. Returns its path ("" when there is none).
std::string check_tokenizer(const std::string& first_file, const DataOptions& opt) {
  const fs::path p = fs::path(first_file).parent_path() / "tokenizer.model";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return "";
  const Tokenizer t = Tokenizer::load("--data", p.string());
  SAT_CHECK(t.vocab_size() == opt.vocab, p.string(), ": the tokenizer's vocabulary has ", t.vocab_size(),
            " tokens but the model's has ", opt.vocab, "; expected the same (vocab=", t.vocab_size(),
            " in --model, or --vocab ", t.vocab_size(), " for a GPT model)");
  return p.string();
}

std::string split_text(const ShardsDataset& d, const std::string& what, int64_t T) {
  return str_cat(d.tokens(), " tokens", d.shards() > 1 ? str_cat(" in ", d.shards(), " shards") : "", " = ", d.size(),
                 " ", what, " sequences of ", T);
}

}  // namespace

DataSplit open_tokens(const std::string& train_spec, const std::string& val_spec, const DataOptions& opt) {
  const std::string what = "--data tokens:";
  std::vector<std::string> train = token_shard_files(train_spec, what), val;
  if (!val_spec.empty()) {
    val = token_shard_files(val_spec, what);
    std::erase_if(train, [&](const std::string& f) { return std::find(val.begin(), val.end(), f) != val.end(); });
    SAT_CHECK(!train.empty(), what, train_spec, ":", val_spec, ": every training file is a validation file too; "
              "expected training shards besides the validation ones");
  } else if (std::any_of(train.begin(), train.end(), [](auto& f) { return !is_val_shard(f); })) {
    for (auto& f : train)
      if (is_val_shard(f)) val.push_back(f);
    std::erase_if(train, [](const std::string& f) { return is_val_shard(f); });
  }
  const std::string tokenizer = check_tokenizer(train.front(), opt);  // before the tokens are checked against it
  const Shard* first = nullptr;
  DataSplit s;
  auto tr = open_split(train, "tokens train", opt, first);
  const ShardFormat format = first->format();
  s.description = str_cat("tokens (", train_spec, "): ", split_text(*tr, "train", opt.seq_len), "; ");
  s.train = std::move(tr);
  if (!val.empty()) {
    auto va = open_split(val, "tokens val", opt, first);
    s.description += str_cat("val (", val_spec.empty() ? "its _val_ shards" : val_spec, "): ",
                             split_text(*va, "val", opt.seq_len), "; ");
    s.test = std::move(va);
  } else {
    s.description += "no test split; ";
  }
  s.description += str_cat(shard_format_info(format).name, " tokens, vocabulary ", opt.vocab,
                           tokenizer.empty() ? "" : str_cat("; tokenizer ", tokenizer, " (", opt.vocab, " tokens)"));
  if (!tokenizer.empty()) {  // kept with the weights: generate decodes through it
    const std::string schema = tokens_schema(tokenizer, opt.vocab);
    static_cast<ShardsDataset&>(*s.train).set_schema(schema);
    if (s.test) static_cast<ShardsDataset&>(*s.test).set_schema(schema);
  }
  return s;
}

}  // namespace data_detail

std::string tokens_schema(const std::string& tokenizer_path, int64_t vocab) {
  std::error_code ec;
  fs::path abs = fs::absolute(tokenizer_path, ec);
  if (ec) abs = tokenizer_path;
  nlohmann::ordered_json j;
  j["format"] = "saturate tokens 1";
  j["tokenizer"] = abs.lexically_normal().string();
  j["vocab"] = vocab;
  return j.dump();
}

std::string tokenizer_of_schema(const std::string& schema) {
  const nlohmann::json j = nlohmann::json::parse(schema, nullptr, false);
  if (!j.is_object()) return "";
  const auto f = j.find("format"), t = j.find("tokenizer");
  if (f == j.end() || !f->is_string() || f->get<std::string>() != "saturate tokens 1") return "";
  return t != j.end() && t->is_string() ? t->get<std::string>() : "";
}
}  // namespace sat
