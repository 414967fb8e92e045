#include "data/tokenize.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "data/token_shards.h"

namespace sat {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- reading text

TextReader::TextReader(std::vector<std::string> files, std::string what, size_t target)
    : files_(std::move(files)), what_(std::move(what)), target_(std::max<size_t>(target, 64)) {
  for (const std::string& f : files_) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    if (!ec) total_ += n;
  }
}

TextReader::~TextReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool TextReader::read_block() {
  if (fd_ < 0) return false;
  const size_t old = pending_.size();
  pending_.resize(old + target_);
  ssize_t r;
  do {
    r = ::read(fd_, pending_.data() + old, target_);
  } while (r < 0 && errno == EINTR);
  const int err = errno;
  pending_.resize(old + size_t(std::max<ssize_t>(r, 0)));
  SAT_CHECK(r >= 0, what_, ": ", files_[next_file_ - 1], ": cannot read the file (", std::strerror(err), ")");
  read_ += uint64_t(r);
  if (r > 0) return true;
  ::close(fd_);
  fd_ = -1;
  return false;
}

bool TextReader::next(std::string& text, bool& doc_start) {
  for (;;) {
    if (fd_ < 0 && pending_.empty()) {  // the next file (an empty one gives nothing)
      if (next_file_ == files_.size()) return false;
      fd_ = InputFile(what_, files_[next_file_++]).release();
      first_piece_ = true;
      continue;
    }
    if (fd_ >= 0 && pending_.size() < target_) {
      read_block();
      continue;
    }
    size_t cut = pending_.size();  // the rest of the file
    if (fd_ >= 0) {                // more to come: end after the last newline
      const size_t nl = pending_.rfind('\n');
      if (nl != std::string::npos) {
        cut = nl + 1;
      } else if (pending_.size() < 2 * target_) {
        read_block();
        continue;
      } else {
        cut = text_cut(pending_, 2 * target_);
      }
    }
    text.assign(pending_, 0, cut);
    pending_.erase(0, cut);
    doc_start = first_piece_;
    first_piece_ = false;
    return true;
  }
}

bool TextReader::next_line(std::string& line) {
  for (;;) {
    if (line_at_ < lines_.size()) {
      const size_t nl = lines_.find('\n', line_at_);
      const size_t end = nl == std::string::npos ? lines_.size() : nl;
      line.assign(lines_, line_at_, end - line_at_);
      line_at_ = nl == std::string::npos ? lines_.size() : nl + 1;
      return true;
    }
    bool doc_start = false;
    if (!next(lines_, doc_start)) return false;
    line_at_ = 0;
  }
}

// ---------------------------------------------------------------- writing shards

namespace {

// The shards of one run, opened as tokens arrive: the validation split's first, then the
// training split's. Unless committed, every shard written is removed when it is destroyed.
class ShardSet {
 public:
  ShardSet(const TokenizeOptions& o, ShardFormat f)
      : dir_(o.out_dir), name_(o.name), format_(f), shard_tokens_(o.shard_tokens),
        val_tokens_(o.val_tokens < 0 ? o.shard_tokens : o.val_tokens) {}
  ~ShardSet() {
    cur_.reset();  // an unclosed shard removes itself
    if (committed_) return;
    for (const ShardInfo& s : shards_) {
      std::error_code ec;
      fs::remove(s.path, ec);
    }
  }
  void add(const int32_t* ids, size_t n) {
    while (n > 0) {
      if (!cur_) open();
      const size_t k = size_t(std::min<int64_t>(limit_ - cur_->tokens(), int64_t(n)));
      cur_->write(ids, k);
      ids += k;
      n -= k;
      if (cur_->tokens() == limit_) close();
    }
  }
  void finish() {
    if (cur_) close();
  }
  void commit() { committed_ = true; }
  int64_t val_tokens() const { return val_written_; }
  int64_t train_tokens() const { return train_written_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  void open() {
    const bool val = val_written_ < val_tokens_;
    limit_ = val ? std::min(shard_tokens_, val_tokens_ - val_written_) : shard_tokens_;
    char index[32];
    std::snprintf(index, sizeof index, "%06lld", static_cast<long long>(shards_.size()));
    const std::string path = (fs::path(dir_) / str_cat(name_, val ? "_val_" : "_train_", index, ".bin")).string();
    cur_ = std::make_unique<ShardWriter>(path, format_);
    shards_.push_back({path, 0, val});
  }
  void close() {
    cur_->close();
    ShardInfo& s = shards_.back();
    s.tokens = cur_->tokens();
    (s.val ? val_written_ : train_written_) += s.tokens;
    cur_.reset();
  }

  std::string dir_, name_;
  ShardFormat format_;
  int64_t shard_tokens_, val_tokens_;
  int64_t limit_ = 0, val_written_ = 0, train_written_ = 0;
  std::unique_ptr<ShardWriter> cur_;
  std::vector<ShardInfo> shards_;
  bool committed_ = false;
};

constexpr size_t kSegment = 8192;  // bytes encoded by one call: whole lines where they fit

// The ids of one piece of text: <s> first when it begins a document, then its lines.
// No piece of a trained vocabulary holds a newline, so encoding line by line (in segments
// of whole lines) gives the ids encoding the whole piece would.
void encode_piece(const Tokenizer& tok, const std::string& text, bool doc_start, std::vector<int32_t>& out) {
  out.clear();
  if (doc_start && tok.bos_id() >= 0) out.push_back(tok.bos_id());
  std::string_view rest(text);
  while (!rest.empty()) {
    size_t n = rest.size();
    if (n > kSegment) {
      const size_t nl = rest.rfind('\n', kSegment - 1);
      n = nl != std::string_view::npos ? nl + 1 : text_cut(rest, kSegment);
    }
    tok.encode(rest.substr(0, n), out);
    rest.remove_prefix(n);
  }
}

// Encodes pieces [0, n) on `threads` threads (each takes the next piece not taken).
void encode_all(const Tokenizer& tok, const std::vector<std::string>& text, const std::vector<char>& starts,
                std::vector<std::vector<int32_t>>& ids, size_t n, int threads) {
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](size_t t) {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) encode_piece(tok, text[i], starts[i] != 0, ids[i]);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && size_t(t) < n; ++t) pool.emplace_back(work, size_t(t));
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void check_tokenize_options(const TokenizeOptions& o) {
  SAT_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= kMaxShardTokens, "--shard-tokens ", o.shard_tokens,
            ": expected 1 to ", kMaxShardTokens, " (the shard header's int32 count)");
  SAT_CHECK(o.val_tokens >= -1, "--val-tokens ", o.val_tokens, ": expected 0 or more");
  SAT_CHECK(!o.inputs.empty(), "--input: expected at least one text file");
  SAT_CHECK(!o.name.empty() && o.name.find('/') == std::string::npos, "--name '", o.name,
            "': expected a file-name prefix without '/'");
  for (const char* split : {"_val_", "_train_"}) {
    glob_t g{};
    const std::string pattern = (fs::path(o.out_dir) / (o.name + split + "*.bin")).string();
    const bool found = ::glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
    const std::string first = found ? g.gl_pathv[0] : "";
    ::globfree(&g);
    SAT_CHECK(!found, "--out ", o.out_dir, " already holds token shards (", first,
              "); expected a directory without ", o.name, "_val_* / ", o.name,
              "_train_* shards, so that nothing is overwritten (another --out, or another --name)");
  }
}

TokenizeResult tokenize_files(const Tokenizer& tok, const TokenizeOptions& o) {
  check_tokenize_options(o);
  const int threads = std::max(1, o.threads);
  ShardSet sink(o, shard_format_for(tok.vocab_size()));
  TextReader reader(o.inputs, "--input");
  const size_t window = size_t(2 * threads);
  std::vector<std::string> text(window);
  std::vector<char> starts(window);
  std::vector<std::vector<int32_t>> ids(window);
  const auto t0 = std::chrono::steady_clock::now();
  double reported = 0;
  int64_t tokens = 0;
  for (;;) {
    size_t n = 0;
    for (bool doc = false; n < window && reader.next(text[n], doc); ++n) starts[n] = doc;
    if (n == 0) break;
    encode_all(tok, text, starts, ids, n, threads);
    for (size_t i = 0; i < n; ++i) {
      sink.add(ids[i].data(), ids[i].size());
      tokens += int64_t(ids[i].size());
    }
    const double s = seconds_since(t0);
    if (o.progress && s - reported >= o.progress_seconds) {
      reported = s;
      o.progress({reader.bytes_read(), reader.bytes_total(), tokens, s});
    }
  }
  sink.finish();
  SAT_CHECK(tokens > 0, "--input: the files hold no text; expected text to tokenize");
  SAT_CHECK(sink.train_tokens() > 0, "the text gave ", tokens, " tokens, all of them in the validation split (",
            o.val_tokens < 0 ? str_cat("--val-tokens, by default one shard of --shard-tokens ", o.shard_tokens)
                             : str_cat("--val-tokens ", o.val_tokens),
            "); expected some left for training: give a smaller --val-tokens, e.g. a tenth of the tokens (",
            std::max<int64_t>(tokens / 10, 1), ")");
  sink.commit();
  TokenizeResult r;
  r.shards = sink.shards();
  r.val_tokens = sink.val_tokens();
  r.train_tokens = sink.train_tokens();
  r.bytes = reader.bytes_read();
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace sat
