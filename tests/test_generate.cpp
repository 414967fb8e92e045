// Text from language models (infer/: the KV-cached decoder, the full-forward reference,
// sampling, the generation loop) and `saturate generate` end to end: the cached decoder
// against the model's ordinary forward on random-weight gpt and llama models (with grouped-
// query attention too), token for token and logit for logit; sampling's rules and seeds; the
// stops; a model trained on tokenizer shards writing text; and the mistakes refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <span>
#include <sstream>

#include "core/error.h"
#include "core/text.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "infer/sampling.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace sat;
using sat::test::CmdResult;

namespace {

// A model of random weights: the family's initialisation, then every matrix scaled by 8, so
// that the logits spread (the N(0, 0.02) initialisation gives nearly uniform logits, whose
// near-ties would make a comparison of greedy choices a matter of rounding).
LanguageModel random_model(const std::string& spec, uint64_t seed) {
  LanguageModel m;
  m.config = model_config(spec);
  const BuiltModel b = build_model(m.config, 1, false);
  m.params = std::make_unique<ParamStore>(b.graph->params(), b.graph->states(), 0);
  m.params->init(seed);
  for (size_t i = 0; i < m.params->num_params(); ++i) {
    Tensor t = m.params->host_param(i);
    if (t.shape.nd != 2) continue;
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] *= 8.0f;
  }
  return m;
}

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(r.below(uint64_t(vocab))));
  return t;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

const char* kModels[] = {
    "gpt:layers=2,heads=4,width=64,context=96,vocab=97",
    "llama:layers=2,heads=4,kv_heads=4,width=64,ffn=96,context=96,vocab=97",
    "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=96,vocab=97",  // grouped-query attention
    "llama:layers=2,heads=4,kv_heads=1,width=64,ffn=96,context=96,vocab=97",  // one key/value head
    // Not llama's default RMSNorm eps (1e-5) and rotary theta (10000): the cache uses the config's.
    "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=96,vocab=97,norm_eps=0.01,rope_theta=500000",
};

constexpr float kTol = 2e-5f;  // of the logits' scale: float32 rounding of two summation orders

}  // namespace

// The cached decoder and the model's forward over the whole prefix agree at every step of a
// greedy generation of 64 tokens after an 8-token prompt: the logits within rounding, the
// chosen token exactly.
TEST(Decoder, CachedMatchesTheFullForwardStepByStep) {
  for (const char* spec : kModels) {
    SCOPED_TRACE(spec);
    LanguageModel m = random_model(spec, 11);
    auto cached = make_cached_decoder(m.config, *m.params);
    auto full = make_full_decoder(m.config, *m.params);
    std::vector<int32_t> prompt = random_tokens(8, m.config.vocab, 3);
    const std::vector<float>* lc = &cached->append(prompt);
    const std::vector<float>* lf = &full->append(prompt);
    float worst = 0, scale = 0;
    for (int step = 0; step < 64; ++step) {
      ASSERT_EQ(lc->size(), size_t(m.config.vocab));
      const float d = max_diff(*lc, *lf);
      worst = std::max(worst, d);
      scale = std::max(scale, max_abs(*lf));
      EXPECT_LE(d, kTol * (1 + max_abs(*lf))) << "step " << step;
      const int32_t t = argmax_token(*lf);
      ASSERT_EQ(argmax_token(*lc), t) << "step " << step;
      lc = &cached->append(std::span<const int32_t>(&t, 1));
      lf = &full->append(std::span<const int32_t>(&t, 1));
    }
    EXPECT_EQ(cached->length(), 8 + 64);
    std::printf("%s: cached logits within %.3g of the full forward's (logits up to %.3g)\n", spec, double(worst),
                double(scale));
  }
}

// generate() at temperature 0 writes the same 64 tokens through either decoder.
TEST(Decoder, GreedyGenerationIsTheSameWithAndWithoutTheCache) {
  for (const char* spec : kModels) {
    SCOPED_TRACE(spec);
    LanguageModel m = random_model(spec, 5);
    auto cached = make_cached_decoder(m.config, *m.params);
    auto full = make_full_decoder(m.config, *m.params);
    GenerateOptions o;
    o.sampling.temperature = 0;
    o.max_new_tokens = 64;
    const std::vector<int32_t> prompt = random_tokens(8, m.config.vocab, 9);
    const GenerateResult a = generate(*cached, prompt, o), b = generate(*full, prompt, o);
    ASSERT_EQ(a.tokens.size(), 64u);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.reason, StopReason::max_new_tokens);
    EXPECT_EQ(a.decode_steps, 63);  // the last token is not fed back
    // Not a constant sequence: the test compares choices that vary.
    EXPECT_GT(std::set<int32_t>(a.tokens.begin(), a.tokens.end()).size(), 4u);
  }
}

// norm_eps and rope_theta change the forward (the same weights: parameters are drawn by name
// and shape), each by itself, in the ordinary forward and in the cache alike.
TEST(Decoder, NormEpsAndRopeThetaChangeTheForward) {
  const std::string base = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=96,vocab=97";
  auto logits = [&](const std::string& spec, bool cache) {
    LanguageModel m = random_model(spec, 7);
    auto d = cache ? make_cached_decoder(m.config, *m.params) : make_full_decoder(m.config, *m.params);
    return d->append(random_tokens(32, m.config.vocab, 4));
  };
  const std::vector<float> ref = logits(base, false);
  ASSERT_EQ(max_diff(logits(base + ",norm_eps=1e-5,rope_theta=10000", false), ref), 0.0f);
  for (const std::string extra : {",norm_eps=0.01", ",rope_theta=500000", ",norm_eps=0.01,rope_theta=500000"}) {
    SCOPED_TRACE(extra);
    const std::vector<float> full = logits(base + extra, false), cached = logits(base + extra, true);
    const float scale = 1 + max_abs(ref);
    EXPECT_GT(max_diff(full, ref), 100 * kTol * scale);
    EXPECT_LE(max_diff(cached, full), kTol * scale);
    std::printf("%s: logits move by %.3g (of %.3g); cached within %.3g\n", extra.c_str(), double(max_diff(full, ref)),
                double(max_abs(ref)), double(max_diff(cached, full)));
  }
}

// A prompt through the cache as one block (GEMMs over its rows) or token by token: the same
// logits, and the same cache to go on from.
TEST(Decoder, APromptAsABlockIsItsTokensOneByOne) {
  for (const char* spec : {kModels[0], kModels[2]}) {
    SCOPED_TRACE(spec);
    LanguageModel m = random_model(spec, 2);
    auto block = make_cached_decoder(m.config, *m.params);
    auto one = make_cached_decoder(m.config, *m.params);
    const std::vector<int32_t> prompt = random_tokens(40, m.config.vocab, 4);
    const std::vector<float> lb = block->append(prompt);
    std::vector<float> lo;
    for (int32_t t : prompt) lo = one->append(std::span<const int32_t>(&t, 1));
    EXPECT_LE(max_diff(lb, lo), kTol * (1 + max_abs(lo)));
    const int32_t next = 7;
    EXPECT_LE(max_diff(block->append(std::span<const int32_t>(&next, 1)), one->append(std::span<const int32_t>(&next, 1))),
              kTol * (1 + max_abs(lo)));
    // truncate goes back: the same position gives the same logits again.
    block->truncate(40);
    const std::vector<float> again = block->append(std::span<const int32_t>(&next, 1));
    block->truncate(40);
    EXPECT_EQ(block->append(std::span<const int32_t>(&next, 1)), again);
    EXPECT_EQ(block->length(), 41);
  }
}

// The text stops at the model's context (the prompt filling it leaves no room), at a stop
// token, and the decoders refuse what would pass the context or the vocabulary.
TEST(Decoder, StopsAtTheContextAndAtStopTokens) {
  LanguageModel m = random_model(kModels[1], 8);
  auto d = make_cached_decoder(m.config, *m.params);
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 10;
  GenerateResult r = generate(*d, random_tokens(94, 97, 1), o);
  EXPECT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(r.reason, StopReason::context);
  r = generate(*d, random_tokens(96, 97, 1), o);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.reason, StopReason::context);
  const GenerateResult free = generate(*d, random_tokens(5, 97, 2), o);
  ASSERT_EQ(free.tokens.size(), 10u);
  o.stop = {free.tokens[3]};
  r = generate(*d, random_tokens(5, 97, 2), o);
  EXPECT_EQ(r.reason, StopReason::stop_token);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(free.tokens.begin(), free.tokens.begin() + 4));
  o.max_new_tokens = 0;
  EXPECT_TRUE(generate(*d, random_tokens(5, 97, 2), o).tokens.empty());
  d->reset();
  EXPECT_THROW(d->append(random_tokens(97, 97, 1)), Error);
  const int32_t bad = 97;
  EXPECT_THROW(d->append(std::span<const int32_t>(&bad, 1)), Error);
  ModelConfig mlp = model_config("mlp");
  EXPECT_THROW(load_language_model(mlp, "/nonexistent"), Error);
}

// ---------------------------------------------------------------------------- sampling

TEST(Sampling, TopKKeepsTheKLargestAndTheirTies) {
  Sampling s;
  s.top_k = 2;
  const std::vector<double> p = sampling_distribution({1.0f, 3.0f, 2.0f, 0.5f}, s);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_NEAR(p[1], std::exp(1.0) / (std::exp(1.0) + 1.0), 1e-12);
  s.top_k = 1;
  const std::vector<double> tie = sampling_distribution({2.0f, 1.0f, 2.0f}, s);
  EXPECT_NEAR(tie[0], 0.5, 1e-12);  // torch.topk's threshold keeps every logit equal to the k-th
  EXPECT_NEAR(tie[2], 0.5, 1e-12);
}

TEST(Sampling, TopPIsHuggingFacesNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: ascending cumulative 0.05, 0.2, 0.5, 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampling s;
  s.top_p = 0.8;  // removes cumulative <= 0.2: the two least likely
  std::vector<double> p = sampling_distribution(logits, s);
  EXPECT_NEAR(p[0], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(p[1], 0.3 / 0.8, 1e-6);
  EXPECT_EQ(p[2], 0.0);
  EXPECT_EQ(p[3], 0.0);
  s.top_p = 0.85;  // <= 0.15: the least likely only
  p = sampling_distribution(logits, s);
  EXPECT_GT(p[2], 0.0);
  EXPECT_EQ(p[3], 0.0);
  s.top_p = 0.01;  // the most likely is always kept
  p = sampling_distribution(logits, s);
  EXPECT_EQ(p[0], 1.0);
  // After temperature and top-k, in that order.
  s = Sampling{0.5, 3, 1.0};
  p = sampling_distribution(logits, s);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_NEAR(p[0] / p[1], std::pow(0.5 / 0.3, 2.0), 1e-5);
}

TEST(Sampling, DrawsFollowTheDistributionAndTheSeed) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -INFINITY, std::log(6.0f)};
  Sampling s;
  Rng rng(42);
  int count[4] = {0, 0, 0, 0};
  for (int i = 0; i < 20000; ++i) ++count[sample_token(logits, s, rng)];
  EXPECT_EQ(count[2], 0);
  EXPECT_NEAR(count[0] / 20000.0, 0.1, 0.01);
  EXPECT_NEAR(count[1] / 20000.0, 0.3, 0.015);
  EXPECT_NEAR(count[3] / 20000.0, 0.6, 0.015);
  s.temperature = 0;
  EXPECT_EQ(sample_token(logits, s, rng), 3);
  EXPECT_EQ(argmax_token({1.0f, 5.0f, 5.0f}), 1);  // the smaller id of equal logits
}

TEST(Sampling, OutOfRangeSettingsNameTheirFlag) {
  auto message = [](Sampling s) {
    try {
      check_sampling(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({-0.5, 0, 1}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({NAN, 0, 1}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({1, -1, 1}).find("--top-k"), std::string::npos);
  EXPECT_NE(message({1, 0, 0}).find("--top-p"), std::string::npos);
  EXPECT_NE(message({1, 0, 1.5}).find("--top-p"), std::string::npos);
  EXPECT_EQ(message({0, 0, 1}), "");
}

// The same seed gives the same text, another seed another; top-k 1 is greedy at any
// temperature; the cache changes no draw.
TEST(Sampling, SeededGenerationIsReproducible) {
  LanguageModel m = random_model(kModels[2], 21);
  auto cached = make_cached_decoder(m.config, *m.params);
  auto full = make_full_decoder(m.config, *m.params);
  const std::vector<int32_t> prompt = random_tokens(6, 97, 5);
  GenerateOptions o;
  o.sampling = Sampling{0.9, 40, 0.95};
  o.max_new_tokens = 48;
  o.seed = 7;
  const GenerateResult a = generate(*cached, prompt, o), b = generate(*cached, prompt, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(generate(*full, prompt, o).tokens, a.tokens);
  o.seed = 8;
  EXPECT_NE(generate(*cached, prompt, o).tokens, a.tokens);
  GenerateOptions greedy;
  greedy.sampling.temperature = 0;
  greedy.max_new_tokens = 48;
  const GenerateResult g = generate(*cached, prompt, greedy);
  for (double t : {0.7, 1.0, 3.0}) {
    GenerateOptions k1 = greedy;
    k1.sampling = Sampling{t, 1, 1.0};
    k1.seed = 99;
    EXPECT_EQ(generate(*cached, prompt, k1).tokens, g.tokens) << "temperature " << t;
  }
}

// ------------------------------------------------------------------ tokenizer and text

namespace {

const char* kText = "/usr/share/common-licenses/GPL-3";

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / str_cat("sat_test_generate_", getpid(), "_", name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

// Text printed as tokens come: what is written adds up to the decoded text, and a character
// spelt over several byte tokens is never shown half (no replacement character).
TEST(TextStream, WritesWholeCharactersAsTheyCome) {
  if (!fs::exists(kText)) GTEST_SKIP() << kText << " is missing";
  std::ifstream f(kText);
  TokenizerTraining t;
  t.vocab_size = 400;
  Tokenizer tok = train_tokenizer(t, [&](std::string& line) { return bool(std::getline(f, line)); });
  std::vector<int32_t> ids;
  tok.encode("Copyright \xC2\xA9 2007 \xE2\x80\x94 \xF0\x9F\x93\x9C the GNU General Public License\n", ids);
  std::string written;
  TextStream s(tok, {ids[0]}, [&](const std::string& piece) {
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << piece;
    written += piece;
  });
  for (size_t i = 1; i < ids.size(); ++i) s.add(ids[i]);
  s.finish();
  EXPECT_EQ(written, tok.decode(ids));
  EXPECT_EQ(written, "Copyright \xC2\xA9 2007 \xE2\x80\x94 \xF0\x9F\x93\x9C the GNU General Public License\n");
}

// --------------------------------------------------------------------------------- CLI

namespace {

CmdResult saturate(const std::string& args) {
  return sat::test::run_command("timeout 300 env OMP_WAIT_POLICY=passive " + std::string(SAT_BINARY) + " " + args);
}

// Exit status 2 and one line, "saturate: error: ...", holding `part`.
void expect_one_line_error(const CmdResult& r, const std::string& part) {
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("saturate: error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(part), std::string::npos) << r.out << "\n  lacks: " << part;
}

// The stdout part of a generate run's output: what is not one of its stderr lines.
std::string text_of(const CmdResult& r) {
  std::string out;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("saturate generate:", 0) != 0 && line.rfind("generated ", 0) != 0) out += line + "\n";
  return out;
}

}  // namespace

// A tokenizer and shards of the GPL, a small gpt trained on them, then generate: the prompt
// and what the model writes, through the tokenizer the weights recorded (from a weights file
// and from a checkpoint), the same with and without the cache; predict --text; the mistakes.
TEST(GenerateCli, WritesTextAfterThePromptAndRefusesMistakes) {
  if (!fs::exists(kText)) GTEST_SKIP() << kText << " is missing";
  const fs::path d = fresh_dir("cli");
  const std::string shards = (d / "shards").string();
  const CmdResult t = saturate(str_cat("tokenize --input ", kText, " --out ", shards,
                                       " --vocab-size 500 --val-tokens 1000 --threads 2"));
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string model = "gpt:layers=2,heads=2,width=64,context=64,vocab=500";
  const std::string w = (d / "gpt.safetensors").string(), ck = (d / "ck").string();
  const CmdResult tr = saturate("train --model " + model + " --data 'tokens:" + shards + "/*.bin' --batch 8 --steps 40 "
                                "--lr 0.003 --eval off --threads 2 --save-weights " + w + " --checkpoint-dir " + ck +
                                " --checkpoint-every 40");
  ASSERT_EQ(tr.status, 0) << tr.out;

  const std::string gen = "generate --model " + model + " --threads 2 --prompt 'This License' --temperature 0 ";
  const CmdResult g = saturate(gen + "--max-new-tokens 24 --init-weights " + w);
  ASSERT_EQ(g.status, 0) << g.out;
  std::printf("%s", g.out.c_str());
  const std::string head = "saturate generate: " + model + " (" + w + "), tokenizer " + fs::absolute(shards).string() +
                           "/tokenizer.model; ";
  ASSERT_NE(g.out.find(head), std::string::npos) << g.out;
  const int prompt = std::atoi(g.out.c_str() + g.out.find(head) + head.size());  // <s> and the text's
  EXPECT_GE(prompt, 3) << g.out;
  EXPECT_NE(g.out.find(str_cat(prompt, " prompt tokens, KV cache; temperature 0, top-k 0, top-p 1, seed 0")),
            std::string::npos) << g.out;
  EXPECT_TRUE(std::regex_search(g.out, std::regex(str_cat("generated 24 tokens \\(the prompt's ", prompt, " in [0-9.]+ s, "
                                                          "then [0-9.]+ ms a token\\); stopped at --max-new-tokens "
                                                          "\\(24\\)")))) << g.out;
  const std::string text = text_of(g);
  EXPECT_EQ(text.rfind("This License", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("This License\n").size()) << text;
  // The reference path and the checkpoint give the very same text.
  const CmdResult nc = saturate(gen + "--max-new-tokens 24 --no-cache --init-weights " + w);
  ASSERT_EQ(nc.status, 0) << nc.out;
  EXPECT_NE(nc.out.find("no cache (the whole prefix's forward for every token)"), std::string::npos) << nc.out;
  EXPECT_EQ(text_of(nc), text);
  const CmdResult c = saturate(gen + "--max-new-tokens 24 --init-weights " + ck);
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(text_of(c), text);
  // Sampling: the seed decides; the context stops a long text.
  const std::string sampled = gen + "--temperature 0.8 --top-k 50 --top-p 0.95 --init-weights " + w;
  const CmdResult s1 = saturate(sampled + " --seed 4"), s2 = saturate(sampled + " --seed 4");
  ASSERT_EQ(s1.status, 0) << s1.out;
  EXPECT_EQ(text_of(s1), text_of(s2));
  const CmdResult full = saturate(gen + "--max-new-tokens 500 --init-weights " + w);
  ASSERT_EQ(full.status, 0) << full.out;
  EXPECT_NE(full.out.find(str_cat("generated ", 64 - prompt, " tokens")), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("stopped at the model's context (64 tokens)"), std::string::npos) << full.out;

  // predict --text: the next token's most likely, printed; with --out a CSV with their text.
  const CmdResult p = saturate("predict --model " + model + " --threads 2 --init-weights " + w +
                               " --text 'This License' --top-k 5 --out " + (d / "next.csv").string());
  ASSERT_EQ(p.status, 0) << p.out;
  std::printf("%s", p.out.c_str());
  EXPECT_NE(p.out.find(str_cat("the next token after ", prompt, " tokens of --text, most likely first:")),
            std::string::npos) << p.out;
  EXPECT_TRUE(std::regex_search(p.out, std::regex("\n  1 +[0-9.]+%  token [0-9]+ +'"))) << p.out;
  std::ifstream csv(d / "next.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "rank,token,text,probability,logit");

  // Mistakes: one line each, exit status 2.
  const std::string base = "generate --model " + model + " --init-weights " + w + " --prompt x ";
  const std::string syn = (d / "synthetic.safetensors").string();
  ASSERT_EQ(saturate("train --model " + model + " --data synthetic --steps 1 --batch 2 --eval off --threads 1 "
                     "--save-weights " + syn).status, 0);
  expect_one_line_error(saturate("generate --model " + model + " --init-weights " + syn + " --prompt x"),
                        "--tokenizer FILE.model is required: --init-weights " + syn + " records no tokenizer");
  ASSERT_EQ(saturate(str_cat("tokenize --input ", kText, " --out ", (d / "other").string(),
                             " --vocab-size 400 --val-tokens 0 --threads 2")).status, 0);
  expect_one_line_error(saturate(base + "--tokenizer " + (d / "other" / "tokenizer.model").string()),
                        "the tokenizer's vocabulary has 400 tokens but the model's has 500");
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += "License ";
  expect_one_line_error(saturate("generate --model " + model + " --init-weights " + w + " --prompt '" + long_prompt + "'"),
                        "more than the model's context of 64 tokens");
  expect_one_line_error(saturate("generate --model mlp --init-weights " + w + " --prompt x"),
                        "--model mlp: not a language model");
  expect_one_line_error(saturate(base + "--temperature -1"), "--temperature: expected 0 (greedy) or a positive number");
  expect_one_line_error(saturate(base + "--top-p 0"), "--top-p: expected a probability in (0, 1]");
  expect_one_line_error(saturate(base + "--top-p 1.5"), "--top-p");
  const CmdResult k = saturate(base + "--top-k -3");  // CLI11's range check, with the pointer to --help
  EXPECT_EQ(k.status, 2) << k.out;
  EXPECT_EQ(k.out.rfind("saturate: error: --top-k: expected an integer from 0", 0), 0u) << k.out;
  expect_one_line_error(saturate("generate --model " + model + " --init-weights " + syn.substr(0, syn.size() - 3) +
                                 " --prompt x --tokenizer " + shards + "/tokenizer.model"), "--init-weights");
  expect_one_line_error(saturate("generate --model llama:layers=2,heads=2,kv_heads=1,width=64,ffn=96,context=64,"
                                 "vocab=500 --init-weights " + w + " --prompt x"), "gpt.safetensors");
  // The recorded tokenizer moved away: named, with the way out.
  fs::rename(shards + "/tokenizer.model", (d / "moved.model").string());
  expect_one_line_error(saturate(base), "tokenizer.model is gone; give --tokenizer FILE.model");
  fs::remove_all(d);
}
