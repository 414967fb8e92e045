#include "cli/tokenize_cmd.h"

#include <glob.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "data/token_shards.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"

namespace sat::cli {

namespace fs = std::filesystem;

CLI::App* add_tokenize_command(CLI::App& app, TokenizeArgs& a) {
  auto* c = app.add_subcommand("tokenize", "text files into token shards (llm.c's .bin format) for --data tokens:, "
                               "with a SentencePiece tokenizer trained on the text or given");
  c->add_option("--input", a.inputs, "text files (UTF-8), or globs of them (quoted: 'books/*.txt'); each file is a "
                "document")->required()->expected(1, -1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c->add_option("--out", a.out, "directory of the shards and tokenizer.model (created when missing)")->required();
  auto* tok = c->add_option("--tokenizer", a.tokenizer, "an existing SentencePiece FILE.model instead of training one");
  c->add_option("--model-type", a.model_type, "bpe | unigram: the tokenizer trained")->capture_default_str()
      ->excludes(tok);
  c->add_option("--vocab-size", a.vocab_size, "tokens in the trained tokenizer's vocabulary (the model's vocab=)")
      ->capture_default_str()->excludes(tok);
  c->add_option("--sample-lines", a.sample_lines, "lines of the text the tokenizer is trained on at most (a uniform "
                "sample of a larger text)")->capture_default_str()->excludes(tok);
  c->add_option("--shard-tokens", a.shard_tokens, "tokens per shard")->capture_default_str();
  c->add_option("--val-tokens", a.val_tokens, "the first N tokens are the validation split (0: none; default: the "
                "first shard, as llm.c)");
  c->add_option("--name", a.name, "the shards' names: NAME_val_000000.bin, NAME_train_000001.bin, ...")
      ->capture_default_str();
  c->add_option("--threads", a.threads, "encoding (and training) threads (0: all cores)")->capture_default_str();
  return c;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& values) {
  std::vector<std::string> files;
  for (const std::string& v : values) {
    if (v.find_first_of("*?[") == std::string::npos) {
      check_input_path("--input", v);
      files.push_back(v);
      continue;
    }
    glob_t g{};
    std::vector<std::string> matches;
    if (::glob(v.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        std::error_code ec;
        if (!fs::is_directory(g.gl_pathv[i], ec)) matches.emplace_back(g.gl_pathv[i]);
      }
    ::globfree(&g);
    SAT_CHECK(!matches.empty(), "--input ", v, ": no file matches; expected text files or a glob of them");
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  return files;
}

namespace {

std::string mib(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", double(bytes) / 1048576.0);
  return s;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Tokenizer train_on(const TokenizeArgs& a, const std::vector<std::string>& files, int threads) {
  TextReader reader(files, "--input");
  std::fprintf(stderr, "saturate tokenize: training a %s tokenizer of %lld tokens on %zu files (%s), at most %lld "
               "lines of them\n", a.model_type.c_str(), static_cast<long long>(a.vocab_size), files.size(),
               mib(reader.bytes_total()).c_str(), static_cast<long long>(a.sample_lines));
  TokenizerTraining t;
  t.model_type = a.model_type;
  t.vocab_size = a.vocab_size;
  t.sample_lines = a.sample_lines;
  t.threads = threads;
  const auto t0 = std::chrono::steady_clock::now();
  double reported = 0;
  Tokenizer tok = train_tokenizer(t, [&](std::string& line) {
    if (since(t0) - reported >= 5) {
      reported = since(t0);
      std::fprintf(stderr, "saturate tokenize: reading the text for the tokenizer: %s of %s\n",
                   mib(reader.bytes_read()).c_str(), mib(reader.bytes_total()).c_str());
    }
    if (reader.next_line(line)) return true;
    if (since(t0) >= 5)
      std::fprintf(stderr, "saturate tokenize: read %s; training the tokenizer\n", mib(reader.bytes_read()).c_str());
    return false;
  });
  std::printf("tokenizer: %s, %lld tokens, trained in %.2f s on %s of text\n", a.model_type.c_str(),
              static_cast<long long>(tok.vocab_size()), since(t0), mib(reader.bytes_read()).c_str());
  return tok;
}

void report(const TokenizeResult& r, const std::string& out, int threads, const std::string& format) {
  int64_t val_shards = 0;
  for (const ShardInfo& s : r.shards) val_shards += s.val;
  auto shards = [](int64_t n) { return str_cat(n, n == 1 ? " shard" : " shards"); };
  std::printf("wrote %s (%s tokens) to %s: validation %lld tokens in %s, training %lld tokens in %s\n",
              shards(int64_t(r.shards.size())).c_str(), format.c_str(), out.c_str(),
              static_cast<long long>(r.val_tokens), shards(val_shards).c_str(), static_cast<long long>(r.train_tokens),
              shards(int64_t(r.shards.size()) - val_shards).c_str());
  for (const ShardInfo& s : r.shards)
    std::printf("  %-40s %12lld tokens\n", fs::path(s.path).filename().c_str(), static_cast<long long>(s.tokens));
  const double total = double(r.val_tokens + r.train_tokens);
  std::printf("encoded %s of text into %.0f tokens in %.2f s: %.0f tokens/s, %.2f MiB/s on %d threads; peak memory "
              "%s\n", mib(r.bytes).c_str(), total, r.seconds, total / std::max(r.seconds, 1e-9),
              double(r.bytes) / 1048576.0 / std::max(r.seconds, 1e-9), threads, mib(peak_resident_bytes()).c_str());
}

}  // namespace

int run_tokenize(const TokenizeArgs& a) {
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (all cores) or a positive number, got ", a.threads);
  TokenizeOptions o;
  o.inputs = expand_inputs(a.inputs);
  o.out_dir = a.out;
  o.name = a.name;
  o.shard_tokens = a.shard_tokens;
  o.val_tokens = a.val_tokens;
  o.threads = a.threads > 0 ? a.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  o.progress = [](const TokenizeProgress& p) {
    std::fprintf(stderr, "saturate tokenize: %s of %s read (%.0f%%), %lld tokens written, %.0f tokens/s\n",
                 mib(p.bytes_read).c_str(), mib(p.bytes_total).c_str(),
                 100.0 * double(p.bytes_read) / double(std::max<uint64_t>(p.bytes_total, 1)),
                 static_cast<long long>(p.tokens), double(p.tokens) / std::max(p.seconds, 1e-9));
  };
  check_output_dir("--out", a.out);
  check_tokenize_options(o);  // before the tokenizer's training
  const Tokenizer tok = a.tokenizer.empty() ? train_on(a, o.inputs, o.threads)
                                            : Tokenizer::load("--tokenizer", a.tokenizer);
  if (!a.tokenizer.empty())
    std::printf("tokenizer: %s, %lld tokens\n", a.tokenizer.c_str(), static_cast<long long>(tok.vocab_size()));
  const TokenizeResult r = tokenize_files(tok, o);
  const std::string model = (fs::path(a.out) / "tokenizer.model").string();
  write_file_atomic("--out", model, tok.serialized());
  report(r, a.out, o.threads, shard_format_info(shard_format_for(tok.vocab_size())).name);
  std::printf("saved the tokenizer as %s (train with vocab=%lld)\n", model.c_str(),
              static_cast<long long>(tok.vocab_size()));
  return 0;
}

}  // namespace sat::cli
