// Text to token ids and back: a SentencePiece model (Debian's libsentencepiece), trained
// here on the user's text (train_tokenizer) or loaded from a .model file.
//
// The tokenizers saturate trains round-trip exactly: decode(encode(text)) == text for any
// UTF-8 text cut anywhere between characters, and the ids of consecutive pieces of a text
// concatenate to the ids of a text that decodes to the pieces' concatenation. They are
// trained for that: no normalisation (SentencePiece's "identity" rule), whitespace kept as
// it is (no extra-whitespace removal, no dummy prefix before each piece of text), and byte
// fall-back (a character the vocabulary lacks, a newline or a tab, is spelt by its UTF-8
// bytes, <0x0A> and the like). Ids 0, 1, 2 are <unk>, <s> (the start of a document) and
// </s>; 3..258 are the 256 bytes. A model loaded from a file encodes as it was trained (a
// normalising or dummy-prefix model does not round-trip; that is the model's own rule).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sat {

class Tokenizer {
 public:
  // The model file's bytes (a SentencePiece ModelProto); `name` is the file or the flag,
  // for messages. sat::Error naming it when the bytes are not a model.
  Tokenizer(const std::string& serialized, const std::string& name);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // A .model file (read through core/io.h's InputFile: a FIFO is refused); `what` names the
  // flag in messages.
  static Tokenizer load(const std::string& what, const std::string& path);

  int64_t vocab_size() const;  // ids are 0 .. vocab_size() - 1
  int32_t bos_id() const;      // the document-start id, -1 when the model has none
  int32_t eos_id() const;      // the end-of-text id (</s>), -1 when the model has none
  // Appends the ids of `text` to `out`. Thread-safe (const, no shared state).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The text of `ids` (control ids such as <s> give nothing).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  const std::string& serialized() const;  // the .model file's bytes
  const std::string& name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TokenizerTraining {
  std::string model_type = "bpe";  // bpe | unigram
  int64_t vocab_size = 4000;
  // Lines the trainer keeps in memory (a uniform sample when the text has more): its
  // memory is bounded by this, not by the corpus.
  int64_t sample_lines = 2000000;
  int threads = 1;
};

// Where to cut a text longer than `max` bytes (max >= 4) so that both sides stay whole
// characters and words where it can: before the last space within the first `max` bytes,
// else before the last UTF-8 character that starts there. 0 < result <= max.
size_t text_cut(std::string_view s, size_t max);

// Trains a tokenizer (the kind above) on the lines next_line yields (false at the end; a
// line holds no newline). Lines longer than the trainer takes are cut between words.
// sat::Error naming --vocab-size / --model-type when SentencePiece refuses them.
Tokenizer train_tokenizer(const TokenizerTraining& t, const std::function<bool(std::string&)>& next_line);

}  // namespace sat
