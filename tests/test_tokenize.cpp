// Text to tokens and back: SentencePiece tokenizers trained here (data/tokenizer.h), text
// files streamed into llm.c shards (data/tokenize.h, saturate tokenize), and the shards
// read back through --data tokens:GLOB (data/token_shards.h): windows in order, splits,
// uint16 and uint32 shards, the errors, ranks' windows; and a model trained on them.
// The text: the licenses Debian ships in /usr/share/common-licenses (about 300 KB).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/token_shards.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace sat;
using sat::test::CmdResult;

namespace {

const char* kLicenses = "/usr/share/common-licenses";

// The licenses' regular files (not the links to them), in name order.
std::vector<std::string> license_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kLicenses, ec))
    if (e.is_regular_file() && !e.is_symlink()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / str_cat("sat_test_tokenize_", getpid(), "_", name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A shard's header and tokens, read byte by byte (independently of the reader under test).
struct RawShard {
  int32_t magic = 0, version = 0, count = 0;
  std::vector<int32_t> tokens;
};
RawShard read_shard(const std::string& path) {
  const std::string b = read_all(path);
  RawShard r;
  EXPECT_GE(b.size(), 1024u) << path;
  if (b.size() < 1024) return r;
  std::memcpy(&r.magic, b.data(), 4);
  std::memcpy(&r.version, b.data() + 4, 4);
  std::memcpy(&r.count, b.data() + 8, 4);
  const size_t w = r.magic == 20240801 ? 4 : 2;
  EXPECT_EQ(b.size(), 1024 + size_t(r.count) * w) << path;
  for (size_t i = 1024; i + w <= b.size(); i += w) {
    uint32_t v = 0;
    std::memcpy(&v, b.data() + i, w);
    r.tokens.push_back(int32_t(v));
  }
  return r;
}

void write_shard(const std::string& path, ShardFormat f, const std::vector<int32_t>& tokens) {
  ShardWriter w(path, f);
  w.write(tokens.data(), tokens.size());
  w.close();
}

std::vector<int32_t> iota_tokens(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

DataOptions token_opts(int64_t T, int64_t vocab) {
  DataOptions o;
  o.model_takes_tokens = true;
  o.seq_len = T;
  o.vocab = vocab;
  return o;
}

// Runs fn, which must throw sat::Error mentioning every one of `parts`.
template <typename F>
void expect_error(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning " << parts[0];
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

// The licenses' tokenizer, trained once per process (BPE, 4000 tokens).
class Tokenize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (license_files().empty()) return;
    TextReader reader(license_files(), "--input");
    TokenizerTraining t;
    t.vocab_size = 4000;
    t.threads = 2;
    tok_ = new Tokenizer(train_tokenizer(t, [&](std::string& line) { return reader.next_line(line); }));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << kLicenses << " is missing";
  }
  static Tokenizer* tok_;
};
Tokenizer* Tokenize::tok_ = nullptr;

}  // namespace

// ------------------------------------------------------------------- tokenizer and shards

TEST_F(Tokenize, TrainedTokenizerRoundTripsAnyText) {
  EXPECT_EQ(tok_->vocab_size(), 4000);
  EXPECT_EQ(tok_->bos_id(), 1);
  for (const std::string text : {"  two leading spaces\n\ttab\r\nCRLF\n\n\nblank lines  ",
                                 "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82 (not in the licenses: bytes)", " ", "\n",
                                 "GNU GENERAL PUBLIC LICENSE\n   Version 3, 29 June 2007"}) {
    std::vector<int32_t> ids;
    tok_->encode(text, ids);
    EXPECT_EQ(tok_->decode(ids), text);
  }
  // Pieces encoded apart decode to their concatenation (no dummy prefix, no normalisation).
  std::vector<int32_t> ids;
  tok_->encode("the licensee ", ids);
  tok_->encode("  and the Program", ids);
  EXPECT_EQ(tok_->decode(ids), "the licensee   and the Program");
}

TEST_F(Tokenize, ShardsOfTheLicensesDecodeToTheText) {
  const fs::path out = fresh_dir("roundtrip");
  TokenizeOptions o;
  o.inputs = license_files();
  o.out_dir = out.string();
  o.name = "lic";
  o.shard_tokens = 20000;
  o.val_tokens = 5000;
  o.threads = 2;
  const TokenizeResult r = tokenize_files(*tok_, o);
  std::string text;
  for (const auto& f : o.inputs) text += read_all(f);
  EXPECT_EQ(r.bytes, text.size());
  ASSERT_GE(r.shards.size(), 3u);
  // The validation shard first, then training shards of shard_tokens, the last one the rest.
  EXPECT_EQ(r.shards[0].path, (out / "lic_val_000000.bin").string());
  EXPECT_TRUE(r.shards[0].val);
  EXPECT_EQ(r.shards[0].tokens, 5000);
  EXPECT_EQ(r.val_tokens, 5000);
  std::vector<int32_t> all;
  for (size_t i = 0; i < r.shards.size(); ++i) {
    const ShardInfo& s = r.shards[i];
    if (i > 0) {
      char name[64];
      std::snprintf(name, sizeof name, "lic_train_%06zu.bin", i);
      EXPECT_EQ(s.path, (out / name).string());
      EXPECT_FALSE(s.val);
      if (i + 1 < r.shards.size()) {
        EXPECT_EQ(s.tokens, 20000);
      }
    }
    const RawShard raw = read_shard(s.path);
    EXPECT_EQ(raw.magic, 20240520);
    EXPECT_EQ(raw.version, 1);
    EXPECT_EQ(raw.count, s.tokens);
    all.insert(all.end(), raw.tokens.begin(), raw.tokens.end());
  }
  EXPECT_EQ(int64_t(all.size()), r.val_tokens + r.train_tokens);
  // One <s> per file, each at its file's start; decoding every shard in order is the text.
  EXPECT_EQ(std::count(all.begin(), all.end(), tok_->bos_id()), int64_t(o.inputs.size()));
  EXPECT_EQ(all.front(), tok_->bos_id());
  EXPECT_TRUE(tok_->decode(all) == text) << "the decoded shards differ from the text";
  std::printf("licenses: %zu bytes -> %zu tokens in %zu shards, encoded in %.3f s\n", text.size(), all.size(),
              r.shards.size(), r.seconds);
  // A second run into the same directory is refused, and leaves the shards as they were.
  expect_error([&] { tokenize_files(*tok_, o); }, {"--out", "already holds token shards", "lic_"});
  EXPECT_EQ(read_shard(r.shards[0].path).count, 5000);
}

TEST_F(Tokenize, AllInTheValidationSplitIsRefusedAndLeavesNothing) {
  const fs::path out = fresh_dir("allval");
  TokenizeOptions o;
  o.inputs = {license_files().front()};
  o.out_dir = out.string();
  o.threads = 2;  // the default validation split, one shard of 100M tokens, takes it all
  expect_error([&] { tokenize_files(*tok_, o); }, {"all of them in the validation split", "--val-tokens"});
  EXPECT_TRUE(fs::is_empty(out));
}

TEST(TokenizerTraining, UnigramRoundTripsTheLicenses) {
  if (license_files().empty()) GTEST_SKIP() << kLicenses << " is missing";
  TextReader reader(license_files(), "--input");
  TokenizerTraining t;
  t.model_type = "unigram";
  t.vocab_size = 1000;
  t.threads = 2;
  const Tokenizer tok = train_tokenizer(t, [&](std::string& line) { return reader.next_line(line); });
  EXPECT_EQ(tok.vocab_size(), 1000);
  const std::string text = read_all(license_files().front());
  std::vector<int32_t> ids;
  tok.encode(text, ids);
  EXPECT_TRUE(tok.decode(ids) == text);
  expect_error([] { train_tokenizer({"wordpiece", 1000, 10, 1}, [](std::string&) { return false; }); },
               {"--model-type", "bpe or unigram"});
}

// ------------------------------------------------------------------- --data tokens:GLOB

TEST(TokenShards, GlobGivesTheShardsWindowsInOrder) {
  const fs::path d = fresh_dir("glob");
  // Windows of T = 4: shard 1 gives 3 (13 tokens), shard 2 gives 2 (9), shard 3 none (3).
  write_shard((d / "a_train_000001.bin").string(), ShardFormat::u16, iota_tokens(1000, 13));
  write_shard((d / "a_train_000002.bin").string(), ShardFormat::u16, iota_tokens(2000, 9));
  write_shard((d / "a_train_000003.bin").string(), ShardFormat::u16, iota_tokens(3000, 3));
  write_shard((d / "a_val_000000.bin").string(), ShardFormat::u16, iota_tokens(500, 9));
  const std::vector<int32_t> firsts{1000, 1004, 1008, 2000, 2004};
  for (const std::string& spec : {"tokens:" + (d / "*.bin").string(), "tokens:" + d.string(),
                                 "tokens:" + (d / "a_train_*").string() + ":" + (d / "a_val_*").string()}) {
    SCOPED_TRACE(spec);
    const DataSplit s = open_dataset(spec, token_opts(4, 4000));
    ASSERT_EQ(s.train->size(), 5);
    for (int64_t i = 0; i < 5; ++i) {
      int32_t x[4], y[4];
      s.train->get(i, x, y);
      for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(x[j], firsts[size_t(i)] + j);
        EXPECT_EQ(y[j], firsts[size_t(i)] + j + 1);
      }
    }
    ASSERT_NE(s.test, nullptr);
    ASSERT_EQ(s.test->size(), 2);
    int32_t x[4], y[4];
    s.test->get(1, x, y);
    EXPECT_EQ(x[0], 504);
    EXPECT_EQ(y[3], 508);
    EXPECT_NE(s.description.find("3 shards"), std::string::npos) << s.description;
    EXPECT_EQ(s.train->storage_bytes(), 0u) << "mapped, not held";
  }
  // One file, as before: no test split.
  EXPECT_EQ(open_dataset("tokens:" + (d / "a_train_000001.bin").string(), token_opts(4, 4000)).test, nullptr);
  // Only validation shards matched: they are what was asked for, the training split.
  EXPECT_EQ(open_dataset("tokens:" + (d / "a_val_*").string(), token_opts(4, 4000)).train->size(), 2);
  expect_error([&] { open_dataset("tokens:" + (d / "nothing*.bin").string(), token_opts(4, 4000)); },
               {"no file matches", "nothing*.bin"});
  fs::remove_all(d);
}

TEST(TokenShards, Uint32ShardsHoldLargeVocabularies) {
  const fs::path d = fresh_dir("u32");
  const std::string p = (d / "big_train_000001.bin").string();
  EXPECT_EQ(shard_format_for(65536), ShardFormat::u16);
  EXPECT_EQ(shard_format_for(65537), ShardFormat::u32);
  write_shard(p, ShardFormat::u32, iota_tokens(70000, 9));
  const RawShard raw = read_shard(p);
  EXPECT_EQ(raw.magic, 20240801);
  EXPECT_EQ(raw.version, 7);
  EXPECT_EQ(raw.count, 9);
  EXPECT_EQ(raw.tokens[8], 70008);
  const DataSplit s = open_dataset("tokens:" + p, token_opts(4, 100000));
  ASSERT_EQ(s.train->size(), 2);
  int32_t x[4], y[4];
  s.train->get(1, x, y);
  EXPECT_EQ(x[0], 70004);
  EXPECT_EQ(y[3], 70008);
  EXPECT_NE(s.description.find("uint32"), std::string::npos) << s.description;
  expect_error([&] { write_shard((d / "x.bin").string(), ShardFormat::u16, {70000}); }, {"x.bin", "uint16"});
  EXPECT_FALSE(fs::exists(d / "x.bin")) << "an unclosed shard is removed";
  fs::remove_all(d);
}

TEST(TokenShards, MixedFormatsAndOutOfRangeTokensAreRefused) {
  const fs::path d = fresh_dir("mixed");
  write_shard((d / "m_train_000001.bin").string(), ShardFormat::u16, iota_tokens(10, 20));
  write_shard((d / "m_train_000002.bin").string(), ShardFormat::u32, iota_tokens(10, 20));
  expect_error([&] { open_dataset("tokens:" + (d / "*.bin").string(), token_opts(4, 4000)); },
               {(d / "m_train_000002.bin").string(), "uint32", "uint16", "m_train_000001.bin", "one format"});
  fs::remove(d / "m_train_000002.bin");
  // A token beyond the vocabulary, in a training shard and in a validation shard.
  write_shard((d / "m_train_000003.bin").string(), ShardFormat::u16, {1, 2, 3, 4000, 5, 6});
  expect_error([&] { open_dataset("tokens:" + (d / "*.bin").string(), token_opts(4, 4000)); },
               {(d / "m_train_000003.bin").string(), "token 4000", "position 3", "vocabulary has 4000"});
  fs::remove(d / "m_train_000003.bin");
  write_shard((d / "m_val_000000.bin").string(), ShardFormat::u16, {1, 2, 3, 4, 5, 4001});
  expect_error([&] { open_dataset("tokens:" + (d / "*.bin").string(), token_opts(4, 4000)); },
               {(d / "m_val_000000.bin").string(), "token 4001"});
  // A header of another kind of file.
  std::ofstream((d / "m_train_000004.bin").string(), std::ios::binary) << std::string(2048, 'x');
  expect_error([&] { open_dataset("tokens:" + (d / "m_train_*.bin").string(), token_opts(4, 4000)); },
               {"m_train_000004.bin", "magic number", "20240520", "20240801"});
  fs::remove_all(d);
}

TEST_F(Tokenize, TokenizerBesideTheShardsMustHaveTheModelsVocabulary) {
  const fs::path d = fresh_dir("vocab");
  write_shard((d / "v_train_000001.bin").string(), ShardFormat::u16, iota_tokens(10, 40));
  std::ofstream(d / "tokenizer.model", std::ios::binary) << tok_->serialized();
  EXPECT_NO_THROW(open_dataset("tokens:" + d.string(), token_opts(4, 4000)));
  expect_error([&] { open_dataset("tokens:" + d.string(), token_opts(4, 4096)); },
               {(d / "tokenizer.model").string(), "4000 tokens", "model's has 4096", "vocab=4000"});
  fs::remove_all(d);
}

// Data-parallel ranks read their own windows of the shards: rank r's micro-batches of a
// step, concatenated rank-major, are one process's global batch.
TEST(TokenShards, RanksShareOutTheWindows) {
  const fs::path d = fresh_dir("ranks");
  for (int s = 1; s <= 3; ++s)
    write_shard((d / str_cat("r_train_00000", s, ".bin")).string(), ShardFormat::u16, iota_tokens(s * 1000, 4 * 10 + 1));
  const DataSplit ds = open_dataset("tokens:" + (d / "*.bin").string(), token_opts(4, 4000));
  ASSERT_EQ(ds.train->size(), 30);
  BatchLoader one(*ds.train, 6, true, 7, true, 0);
  BatchLoader r0(*ds.train, 3, true, 7, true, 0, Sharding{0, 2, 1, LastBatch::drop});
  BatchLoader r1(*ds.train, 3, true, 7, true, 0, Sharding{1, 2, 1, LastBatch::drop});
  std::set<int32_t> seen;
  for (Batch b, b0, b1; one.next(b);) {
    ASSERT_TRUE(r0.next(b0));
    ASSERT_TRUE(r1.next(b1));
    const int32_t* g = b.x.i32();
    const int32_t* p0 = b0.x.i32();
    const int32_t* p1 = b1.x.i32();
    EXPECT_TRUE(std::equal(p0, p0 + 12, g));
    EXPECT_TRUE(std::equal(p1, p1 + 12, g + 12));
    for (int i = 0; i < 6; ++i) seen.insert(g[i * 4]);
  }
  EXPECT_EQ(seen.size(), 30u) << "an epoch reads every window once";
  fs::remove_all(d);
}

// ------------------------------------------------------------------- the command

namespace {

CmdResult saturate(const std::string& args) {
  return sat::test::run_command("timeout 300 env OMP_WAIT_POLICY=passive " + std::string(SAT_BINARY) + " " + args);
}

// The test loss a run reports ("final train loss L, test loss V").
double test_loss(const CmdResult& r) {
  std::smatch m;
  if (!std::regex_search(r.out, m, std::regex("test loss ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace

// saturate tokenize on the licenses, then a small Llama trained on the shards: the
// validation loss falls; two ranks train as one process.
TEST(TokenizeCli, TrainsAModelOnItsShards) {
  if (license_files().empty()) GTEST_SKIP() << kLicenses << " is missing";
  const fs::path d = fresh_dir("cli");
  const std::string out = (d / "shards").string();
  const CmdResult t = saturate("tokenize --input '" + std::string(kLicenses) + "/*' --out " + out +
                               " --vocab-size 4000 --val-tokens 8000 --shard-tokens 40000 --threads 2");
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("tokenizer: bpe, 4000 tokens, trained in"), std::string::npos) << t.out;
  EXPECT_TRUE(std::regex_search(t.out, std::regex("validation 8000 tokens in 1 shard, training [0-9]+ tokens in 2 "
                                                  "shards"))) << t.out;
  EXPECT_NE(t.out.find("peak memory"), std::string::npos) << t.out;
  EXPECT_TRUE(fs::exists(out + "/tokenizer.model"));
  EXPECT_TRUE(fs::exists(out + "/text_val_000000.bin"));
  EXPECT_TRUE(fs::exists(out + "/text_train_000002.bin"));
  std::printf("%s", t.out.c_str());

  const std::string model = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=64,vocab=4000";
  const std::string run = "train --model " + model + " --data 'tokens:" + out + "/*.bin' --batch 8 --threads 2 --seed 3";
  const CmdResult before = saturate(run + " --steps 1 --lr 1e-9 --out " + (d / "r0").string());
  const CmdResult after = saturate(run + " --steps 30 --lr 0.003 --out " + (d / "r1").string());
  ASSERT_EQ(before.status, 0) << before.out;
  ASSERT_EQ(after.status, 0) << after.out;
  EXPECT_NE(after.out.find("val (its _val_ shards): 8000 tokens = 124 val sequences"), std::string::npos) << after.out;
  std::printf("validation loss: %.4f at initialisation, %.4f after 30 steps\n", test_loss(before), test_loss(after));
  EXPECT_GT(test_loss(before), 8.0);  // about ln 4000 = 8.29
  EXPECT_LT(test_loss(after), test_loss(before) - 0.8);

  // Two data-parallel ranks, each reading its own windows of the shards, train as one
  // process does on their global batch.
  if (!sat::test::mpirun().empty()) {
    const std::string short_run = " --model " + model + " --data 'tokens:" + out + "/*.bin' --steps 4 --threads 1";
    const CmdResult one = saturate("train" + short_run + " --batch 8 --out " + (d / "one").string());
    const CmdResult two = saturate("launch -n 2 --oversubscribe -- train" + short_run + " --batch 4 --out " +
                                   (d / "two").string());
    ASSERT_EQ(one.status, 0) << one.out;
    ASSERT_EQ(two.status, 0) << two.out;
    EXPECT_NEAR(test_loss(two), test_loss(one), 2e-3) << one.out << two.out;
  }

  // The model's vocabulary is not the tokenizer's: refused, naming the tokenizer.
  const CmdResult wrong = saturate("train --model " + model.substr(0, model.size() - 4) + "4096 --data tokens:" + out +
                                   " --steps 1 --threads 1");
  EXPECT_EQ(wrong.status, 2) << wrong.out;
  EXPECT_NE(wrong.out.find(out + "/tokenizer.model: the tokenizer's vocabulary has 4000 tokens"), std::string::npos)
      << wrong.out;
  fs::remove_all(d);
}

TEST(TokenizeCli, MistakesAreRefused) {
  if (license_files().empty()) GTEST_SKIP() << kLicenses << " is missing";
  const fs::path d = fresh_dir("cli_errors");
  const std::string out = " --out " + (d / "o").string();
  const std::string gpl = std::string(kLicenses) + "/GPL-3";
  struct Case {
    std::string args, mention;
  } cases[] = {
      {"tokenize --input '" + d.string() + "/*.txt'" + out, "no file matches"},
      {"tokenize --input " + d.string() + out, "--input: " + d.string() + " is a directory"},
      {"tokenize --input " + gpl + out + " --vocab-size 100", "--vocab-size 100: expected at least 300"},
      {"tokenize --input " + gpl + out + " --model-type wordpiece", "--model-type: expected bpe or unigram"},
      {"tokenize --input " + gpl + out + " --tokenizer x.model --vocab-size 500", "--tokenizer excludes --vocab-size"},
      {"tokenize --input " + gpl + out + " --tokenizer " + gpl, gpl + ": not a SentencePiece model"},
      {"tokenize --input " + gpl + out + " --shard-tokens 0", "--shard-tokens 0: expected 1 to"},
  };
  for (const Case& c : cases) {
    const CmdResult r = saturate(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.mention), std::string::npos) << c.args << "\n" << r.out;
  }
  // Shards already there are not overwritten.
  ASSERT_EQ(saturate("tokenize --input " + gpl + out + " --vocab-size 1000 --val-tokens 100").status, 0);
  const CmdResult again = saturate("tokenize --input " + gpl + out + " --vocab-size 1000 --val-tokens 100");
  EXPECT_EQ(again.status, 2) << again.out;
  EXPECT_NE(again.out.find("already holds token shards"), std::string::npos) << again.out;
  fs::remove_all(d);
}

// The corpus streams through: a text 10 times larger costs the process no more memory
// than a few pieces of it (a corpus held in memory would cost 18 MiB more, its tokens 17).
TEST_F(Tokenize, MemoryStaysBoundedAsTheCorpusGrows) {
  const fs::path d = fresh_dir("stream");
  std::string lic;
  for (const auto& f : license_files()) lic += read_all(f);
  auto corpus = [&](const std::string& name, int copies) {
    std::ofstream f(d / name, std::ios::binary);
    for (int i = 0; i < copies; ++i) f << lic;
  };
  corpus("small.txt", 9);   // 2 MiB
  corpus("large.txt", 90);  // 20 MiB
  std::ofstream(d / "tok.model", std::ios::binary) << tok_->serialized();
  auto peak_mib = [&](const std::string& name) {
    const CmdResult r = saturate("tokenize --input " + (d / name).string() + " --out " + (d / (name + ".out")).string() +
                                 " --tokenizer " + (d / "tok.model").string() + " --val-tokens 1000 --threads 2");
    EXPECT_EQ(r.status, 0) << r.out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, std::regex("peak memory ([0-9.]+) MiB"))) << r.out;
    std::printf("%s", r.out.substr(r.out.find("encoded")).c_str());
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double small = peak_mib("small.txt"), large = peak_mib("large.txt");
  std::printf("peak memory: %.1f MiB for 2 MiB of text, %.1f MiB for 20 MiB\n", small, large);
  EXPECT_LT(large - small, 12.0);
  fs::remove_all(d);
}

// 2 GB of token shards (sparse files: generated at once, read as token 0 with a few
// others) cost the process a bounded resident set, not their size: the open's vocabulary
// pass and every window read give the mapped pages back each 64 MiB (token_shards.cpp).
// Without that, reading them maps all 2 GB into the process (measured: resident grows by
// the bytes read). The allowance stated: 64 MiB of mapped shard pages, plus 32 MiB of slack
// in-process; and for a training run, the plan's memory, plus the loader's epoch order (8
// bytes a sample, as every shuffling sampler holds: 128 MiB for these 16.8 M windows, on
// the plan's loader line), plus
// 192 MiB for the program, its libraries (OpenBLAS, MPI, oneDNN: 168 MiB resident for this
// model on synthetic data) and the shards' mapped pages.
namespace {
constexpr int64_t kShardTokens = int64_t(256) << 20;  // 512 MiB of uint16 tokens per shard

fs::path sparse_shards(int count) {
  const fs::path d = fresh_dir("sparse");
  for (int s = 0; s < count; ++s) {
    const fs::path p = d / str_cat("big_train_", s, ".bin");
    std::ofstream f(p, std::ios::binary);
    int32_t hdr[256] = {20240520, 1, int32_t(kShardTokens)};
    f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    const uint16_t some[4] = {7, 300, 511, 42};
    f.write(reinterpret_cast<const char*>(some), sizeof some);
    f.close();
    fs::resize_file(p, 1024 + uint64_t(kShardTokens) * 2);
  }
  return d;
}

double resident_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

double mib_of(const std::string& text) {  // "12.5 MiB", "3.0 GiB", "812 KiB"
  std::smatch m;
  if (!std::regex_match(text, m, std::regex("([0-9.]+) (B|KiB|MiB|GiB)"))) return -1;
  const double v = std::stod(m[1]);
  return m[2] == "GiB" ? v * 1024 : m[2] == "MiB" ? v : m[2] == "KiB" ? v / 1024 : v / 1048576;
}
}  // namespace

TEST(TokenShardsMemory, TwoGigabytesOfShardsStayOutOfResidentMemory) {
  const fs::path d = sparse_shards(4);
  const double before = resident_mib();
  double most = 0;
  {
    const DataSplit s = open_dataset("tokens:" + d.string(), token_opts(2047, 512));
    most = resident_mib() - before;
    ASSERT_EQ(s.train->size(), 4 * ((kShardTokens - 1) / 2047));
    std::vector<int32_t> x(2047), y(2047);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < s.train->size(); i += 2) {  // every other window: half of the 2 GB read
      s.train->get(i, x.data(), y.data());
      nonzero += x[0] != 0;
      if (i % 4096 == 0) most = std::max(most, resident_mib() - before);
    }
    EXPECT_EQ(nonzero, 4);  // each shard's first window starts with token 7
  }
  std::printf("2 GB of token shards: resident memory grew at most %.1f MiB while opened and read\n", most);
  EXPECT_LT(most, 64.0 + 32.0);

  const CmdResult r = saturate(
      "train --model llama:layers=1,heads=2,kv_heads=2,width=32,ffn=64,context=64,vocab=512 --data tokens:" + d.string() +
      " --steps 3 --batch 4 --threads 1");
  ASSERT_EQ(r.status, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("memory predicted ([0-9.]+ [KMG]?i?B), .*process peak resident "
                                                     "([0-9.]+ [KMG]?i?B)")))
      << r.out;
  const double plan = mib_of(m[1]), peak = mib_of(m[2]);
  std::smatch o;  // the loader's line of the plan states its host memory: the epoch order
  ASSERT_TRUE(std::regex_search(r.out, o, std::regex("the epoch orders ([0-9.]+ [KMG]?i?B) \\(host\\)"))) << r.out;
  const double order = mib_of(o[1]);
  EXPECT_NEAR(order, 8.0 * 4 * ((kShardTokens - 1) / 64) / 1048576, 0.1);
  std::printf("training on them: planned %.1f MiB + epoch order %.1f MiB, process peak resident %.1f MiB\n", plan,
              order, peak);
  EXPECT_LT(peak, plan + order + 192.0) << r.out;
  fs::remove_all(d);
}
