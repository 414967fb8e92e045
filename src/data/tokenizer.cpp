#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"

namespace sentencepiece::logging {
// Exported by libsentencepiece, not declared in its headers.
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace sat {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string bytes, name;
};

Tokenizer::Tokenizer(const std::string& serialized, const std::string& name) : impl_(std::make_unique<Impl>()) {
  impl_->bytes = serialized;
  impl_->name = name;
  const auto st = impl_->sp.LoadFromSerializedProto(serialized);
  SAT_CHECK(st.ok(), name, ": not a SentencePiece model (", st.message(), "); expected a .model file");
  SAT_CHECK(impl_->sp.GetPieceSize() > 0, name, ": the SentencePiece model has no pieces");
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& what, const std::string& path) {
  return Tokenizer(read_input_file(what, path, uint64_t(1) << 30), path);
}

int64_t Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
const std::string& Tokenizer::serialized() const { return impl_->bytes; }
const std::string& Tokenizer::name() const { return impl_->name; }

std::string Tokenizer::piece(int32_t id) const {
  SAT_CHECK(id >= 0 && id < vocab_size(), impl_->name, ": token ", id, " is outside the vocabulary 0..",
            vocab_size() - 1);
  return impl_->sp.IdToPiece(id);
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto st = impl_->sp.Encode(text, &ids);
  SAT_CHECK(st.ok(), impl_->name, ": cannot encode the text (", st.message(), ")");
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  for (size_t i = 0; i < ids.size(); ++i)
    SAT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), impl_->name, ": token ", ids[i], " at position ", i,
              " is outside the vocabulary 0..", vocab_size() - 1);
  std::string text;
  const auto st = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  SAT_CHECK(st.ok(), impl_->name, ": cannot decode the ids (", st.message(), ")");
  return text;
}

size_t text_cut(std::string_view s, size_t max) {
  if (s.size() <= max) return s.size();
  const size_t space = s.rfind(' ', max);  // the space begins the next piece
  if (space != std::string_view::npos && space > 0) return space;
  size_t at = max;  // back to the first byte of a character (not a 10xxxxxx continuation)
  while (at > 0 && (uint8_t(s[at]) & 0xC0) == 0x80) --at;
  return at > 0 ? at : max;
}

namespace {

constexpr size_t kMaxTrainLine = 16384;  // bytes; SentencePiece skips longer sentences

// The trainer's view of next_line: non-empty lines, long ones cut into pieces it keeps.
// What next_line throws (a file that cannot be read) ends the iteration and is kept for
// the caller to rethrow: it does not travel through SentencePiece.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    try {
      while (rest_.empty()) {
        if (!next_(rest_)) {
          done_ = true;
          return;
        }
      }
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
      return;
    }
    const size_t n = text_cut(rest_, kMaxTrainLine);
    value_.assign(rest_, 0, n);
    rest_.erase(0, n);
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    if (!error_) return {};
    return sentencepiece::util::Status(sentencepiece::util::StatusCode::kAborted, "reading the text failed");
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string rest_, value_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

Tokenizer train_tokenizer(const TokenizerTraining& t, const std::function<bool(std::string&)>& next_line) {
  SAT_CHECK(t.model_type == "bpe" || t.model_type == "unigram", "--model-type: expected bpe or unigram, got '",
            t.model_type, "'");
  SAT_CHECK(t.vocab_size >= 300 && t.vocab_size <= (int64_t(1) << 31) - 1, "--vocab-size ", t.vocab_size,
            ": expected at least 300 (3 control tokens, the 256 bytes and some pieces of the text)");
  SAT_CHECK(t.sample_lines >= 1, "--sample-lines: expected at least 1, got ", t.sample_lines);
  const std::unordered_map<std::string, std::string> spec{
      {"model_type", t.model_type},
      {"vocab_size", std::to_string(t.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"max_sentence_length", std::to_string(kMaxTrainLine)},
      {"input_sentence_size", std::to_string(t.sample_lines)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max(1, t.threads))},
      {"model_prefix", ""},
  };
  static std::mutex training;  // SentencePiece's log level is global
  std::lock_guard<std::mutex> lock(training);
  const int level = sentencepiece::logging::GetMinLogLevel();
  sentencepiece::logging::SetMinLogLevel(2);  // its progress lines (INFO) and warnings off; errors come back
  LineIterator lines(next_line);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(spec, &lines, &model);
  sentencepiece::logging::SetMinLogLevel(level);
  lines.rethrow();
  std::string why = st.ok() ? "" : st.message();  // "./src/trainer.cc(660) [check] what": what
  if (why.rfind("./", 0) == 0 && why.find("] ") != std::string::npos) why.erase(0, why.find("] ") + 2);
  SAT_CHECK(st.ok(), "--vocab-size ", t.vocab_size, " --model-type ", t.model_type,
            ": SentencePiece could not train the tokenizer: ", why);
  SAT_CHECK(!model.empty(), "the tokenizer's training gave no model (no text in --input?)");
  return Tokenizer(model, "the trained tokenizer");
}

}  // namespace sat
