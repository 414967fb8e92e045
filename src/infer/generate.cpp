#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/io.h"
#include "data/token_shards.h"
#include "train/weights.h"

namespace sat {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LanguageModel load_language_model(const ModelConfig& mc, const std::string& weights) {
  SAT_CHECK(mc.tokens, "--model ", mc.name, ": not a language model; expected one that takes tokens (gpt:... or "
            "llama:..., such as gpt-mini)");
  LanguageModel m;
  m.config = mc;
  const BuiltModel b = build_model(mc, 1, false);  // its declarations: names, shapes, order
  m.params = std::make_unique<ParamStore>(b.graph->params(), b.graph->states(), 0, StoreSharding::weights_only());
  load_weights_into(*m.params, weights, mc.name);
  return m;
}

Tokenizer language_model_tokenizer(const std::string& flag, const std::string& weights, int64_t vocab) {
  std::string path = flag, what = "--tokenizer";
  if (path.empty()) {
    path = tokenizer_of_schema(saved_data_schema(weights));
    SAT_CHECK(!path.empty(), "--tokenizer FILE.model is required: --init-weights ", weights, " records no tokenizer "
              "(its training data had no tokenizer.model beside the shards)");
    std::error_code ec;
    SAT_CHECK(std::filesystem::is_regular_file(path, ec), "--init-weights ", weights, ": its training data's tokenizer ",
              path, " is gone; give --tokenizer FILE.model");
    what = "--init-weights' tokenizer";
  }
  Tokenizer t = Tokenizer::load(what, path);
  SAT_CHECK(t.vocab_size() == vocab, path, ": the tokenizer's vocabulary has ", t.vocab_size(), " tokens but the "
            "model's has ", vocab, "; expected the tokenizer the model was trained with");
  return t;
}

std::vector<int32_t> prompt_tokens(const Tokenizer& tok, const std::string& text, int64_t context,
                                   const std::string& flag) {
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  tok.encode(text, ids);
  SAT_CHECK(!ids.empty(), flag, ": empty, and the tokenizer has no <s> to begin a text with; expected some text");
  SAT_CHECK(int64_t(ids.size()) <= context, flag, ": ", ids.size(), " tokens", tok.bos_id() >= 0 ? " (with <s>)" : "",
            ", more than the model's context of ", context, " tokens");
  return ids;
}

GenerateResult generate(Decoder& d, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                        const std::function<void(int32_t)>& on_token) {
  check_sampling(o.sampling);
  SAT_CHECK(o.max_new_tokens >= 0, "--max-new-tokens: expected 0 or more tokens, got ", o.max_new_tokens);
  GenerateResult r;
  Rng rng(o.seed);
  d.reset();
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &d.append(prompt);
  r.prompt_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  int64_t length = d.length();
  while (true) {
    if (int64_t(r.tokens.size()) >= o.max_new_tokens) {
      r.reason = StopReason::max_new_tokens;
      break;
    }
    if (length >= d.context()) {
      r.reason = StopReason::context;
      break;
    }
    const int32_t t = sample_token(*logits, o.sampling, rng);
    r.tokens.push_back(t);
    ++length;
    if (on_token) on_token(t);
    if (std::find(o.stop.begin(), o.stop.end(), t) != o.stop.end()) {
      r.reason = StopReason::stop_token;
      break;
    }
    if (int64_t(r.tokens.size()) < o.max_new_tokens && length < d.context()) {
      logits = &d.append(std::span<const int32_t>(&t, 1));
      ++r.decode_steps;
    }
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

// ------------------------------------------------------------------------------ TextStream

TextStream::TextStream(const Tokenizer& tok, std::vector<int32_t> ids, std::function<void(const std::string&)> write)
    : tok_(tok), ids_(std::move(ids)), write_(std::move(write)) {
  flush(false);
}

void TextStream::add(int32_t id) {
  ids_.push_back(id);
  flush(false);
}

void TextStream::finish() { flush(true); }

namespace {

// How many bytes at the end of s may still change as more tokens come: replacement
// characters (U+FFFD, what a partial character's bytes decode to) and an incomplete UTF-8
// sequence.
size_t unsettled_tail(const std::string& s) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  size_t end = s.size();
  while (end >= 3 && s.compare(end - 3, 3, kReplacement) == 0) end -= 3;
  // A lead byte within the last 3 whose sequence is longer than what follows it.
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) end -= back;
    break;
  }
  return s.size() - end;
}

}  // namespace

void TextStream::flush(bool all) {
  const std::string text = tok_.decode(ids_);
  if (text.compare(0, shown_.size(), shown_) != 0) {  // an earlier character changed: show it from there
    size_t same = 0;
    while (same < shown_.size() && same < text.size() && shown_[same] == text[same]) ++same;
    if (!all) return;
    if (write_) write_(text.substr(same));
    shown_ = text;
    return;
  }
  const size_t end = all ? text.size() : text.size() - unsettled_tail(text);
  if (end <= shown_.size()) return;
  if (write_) write_(text.substr(shown_.size(), end - shown_.size()));
  shown_ = text.substr(0, end);
}

}  // namespace sat
