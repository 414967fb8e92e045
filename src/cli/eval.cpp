// saturate eval / predict (cli/eval.h): a Trainer is built exactly as train builds it
// for the same --model, --data and --batch, the weights are loaded as --init-weights loads
// them, and Trainer::evaluate runs the test split; predict reads the logits of that same
// pass. No second forward loop exists to drift from train's figures.
#include "cli/eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <vector>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "dist/comm.h"
#include "data/dataset.h"
#include "infer/generate.h"
#include "cli/args.h"
#include "nn/models.h"
#include "train/trainer.h"
#include "train/weights.h"

namespace sat {
namespace {

void check_common(const EvalArgs& a) {
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (the cores this rank may use) or a positive number, got ", a.threads);
  cpu::set_num_threads(a.threads, dist::detect_process().local_world);
  check_input_path("--init-weights", a.init_weights, true);
}

// The data as train opens it (the same seed and scaling give the same samples); the model
// takes the data's image shape as train's does. A table or image folder is read with the schema
// saved with the weights (its classes and scaling); predict's may lack the labels.
DataSplit open_test_split(const EvalArgs& a, ModelConfig& mc, bool predict) {
  SAT_CHECK(!a.data.empty(), "--data is required (the data whose test split is evaluated, as given to train)");
  DataOptions dopt = data_options_for(mc, a.seed);
  if (!a.normalize.empty()) parse_normalize(a.normalize, dopt);
  dopt.label = a.label;
  dopt.val_fraction = a.val_fraction;
  dopt.table = saved_data_schema(a.init_weights);
  dopt.labels_optional = predict;
  dopt.evaluating = true;
  dopt.skip_bad_images = a.skip_bad_images;
  DataSplit d = open_dataset(a.data, dopt);
  SAT_CHECK(d.test, "--data ", a.data, ": has no test split to evaluate (", d.description, ")");
  fit_to_data(mc, *d.train);
  return d;
}

// A one-rank CPU trainer for `batch` (at most the training split, which eval and predict never train on)
// with the weights of --init-weights (a safetensors file or a checkpoint directory; another model's is a
// sat::Error naming the file).
std::unique_ptr<Trainer> loaded_trainer(const ModelConfig& mc, const EvalArgs& a, int64_t batch, const Dataset& train,
                                        const Dataset& test) {
  TrainConfig cfg;
  cfg.batch = std::min<int64_t>(batch, train.size());  // a file to predict smaller than a batch
  cfg.seed = a.seed;
  cfg.shuffle = false;
  cfg.progress = 0;
  auto t = std::make_unique<Trainer>(mc, cfg, train, &test);
  t->load_weights(a.init_weights);
  return t;
}

// Softmax of one row of logits, in double (the probabilities are reported, not trained on).
std::vector<double> softmax(const float* l, int64_t C) {
  const float top = *std::max_element(l, l + C);
  std::vector<double> p(static_cast<size_t>(C));
  double sum = 0;
  for (int64_t c = 0; c < C; ++c) sum += p[size_t(c)] = std::exp(double(l[c]) - double(top));
  for (double& v : p) v /= sum;
  return p;
}

void write_csv(const std::string& path, const std::string& text) {
  write_file_atomic("--out", path, text);
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

// A CSV field: quoted (its quotes doubled) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

// Classifiers: one row per test sample, the most likely class and its probability (a
// table's or image folder's classes by their names; an image's file); the accuracy where
// the samples have labels. An image without a label: FILE<TAB>CLASS on stdout too.
int predict_classes(const EvalArgs& a, ModelConfig mc) {
  SAT_CHECK(a.prompt.empty(), "--prompt applies to the GPT models only, not --model ", a.model);
  SAT_CHECK(a.text.empty(), "--text applies to the language models only (gpt:, llama:), not --model ", a.model);
  DataSplit d = open_test_split(a, mc, true);
  std::unique_ptr<Trainer> t = loaded_trainer(mc, a, a.batch, *d.train, *d.test);
  const std::vector<std::string> names = d.test->class_names();
  auto name = [&](int64_t c) { return c < 0 ? "" : names.empty() ? std::to_string(c) : names[size_t(c)]; };
  const bool files = !d.test->sample_name(0).empty();
  std::ostringstream csv;
  csv << "index,class,probability,label" << (files ? ",file\n" : "\n");
  char prob[32];
  const EvalResult r = t->evaluate([&](const EvalBatch& e) {
    const int32_t* y = e.batch.y.i32();
    for (int64_t k = 0; k < e.batch.valid; ++k) {
      const float* l = e.logits + k * e.classes;
      const int64_t c = std::max_element(l, l + e.classes) - l;
      std::snprintf(prob, sizeof prob, "%.9g", softmax(l, e.classes)[size_t(c)]);
      csv << e.first + k << ',' << csv_field(name(c)) << ',' << prob << ',' << csv_field(name(y[k]));
      const std::string file = files ? d.test->sample_name(e.first + k) : "";
      if (files) csv << ',' << csv_field(file);
      csv << '\n';
      if (files && y[k] < 0) std::printf("%s\t%s\n", file.c_str(), name(c).c_str());
    }
  });
  write_csv(a.out, csv.str());
  if (std::isfinite(r.accuracy))
    std::printf("accuracy %.2f%% (%lld samples)\n", 100 * r.accuracy, (long long)r.samples);
  return 0;
}

// --prompt FILE: whitespace-separated token ids, each below the vocabulary, at most the
// model's context of them (the graph is built for the prompt's length).
std::vector<int32_t> read_prompt(const std::string& path, const ModelConfig& mc) {
  std::istringstream f(read_input_file("--prompt", path));
  std::vector<int32_t> tok;
  std::string word;
  while (f >> word) {
    char* end = nullptr;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    SAT_CHECK(end != word.c_str() && *end == 0 && v >= 0 && v < mc.vocab, "--prompt ", path, ": token ", tok.size() + 1,
              " is '", word, "'; expected token ids 0 to ", mc.vocab - 1, " separated by whitespace");
    tok.push_back(int32_t(v));
  }
  SAT_CHECK(!tok.empty(), "--prompt ", path, ": holds no token ids");
  SAT_CHECK(int64_t(tok.size()) <= mc.context, "--prompt ", path, ": ", tok.size(), " tokens, more than ", mc.name,
            "'s context of ", mc.context);
  return tok;
}

// The k largest logits' indices, largest first (ties: the smaller token first).
std::vector<int64_t> top_k(const std::vector<float>& l, int64_t k) {
  std::vector<int64_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  k = std::min<int64_t>(k, int64_t(order.size()));
  auto before = [&](int64_t i, int64_t j) {
    return l[size_t(i)] > l[size_t(j)] || (l[size_t(i)] == l[size_t(j)] && i < j);
  };
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), before);
  order.resize(size_t(k));
  return order;
}

// The logits after the prompt's last token: the prompt is one sample, the graph built for
// its length, and its labels are its own next tokens (-1 past the end).
std::vector<float> next_token_logits(const EvalArgs& a, ModelConfig mc, const std::vector<int32_t>& tok) {
  const int64_t n = int64_t(tok.size());
  set_seq_len(mc, n);
  std::vector<int32_t> next(tok.begin() + 1, tok.end());
  next.push_back(-1);
  std::unique_ptr<Dataset> ds = make_tensor_dataset(Shape{n}, tok, next, Shape{n}, mc.vocab, "prompt");
  std::unique_ptr<Trainer> t = loaded_trainer(mc, a, 1, *ds, *ds);
  std::vector<float> last;
  t->evaluate([&](const EvalBatch& e) {
    const float* l = e.logits + (n - 1) * e.classes;
    last.assign(l, l + e.classes);
  });
  return last;
}

// The top-k rows of the next token's CSV: rank,token[,text],probability,logit.
std::string next_token_csv(const std::vector<float>& logits, const std::vector<int64_t>& best, const Tokenizer* tok) {
  const std::vector<double> p = softmax(logits.data(), int64_t(logits.size()));
  std::ostringstream csv;
  csv << (tok ? "rank,token,text,probability,logit\n" : "rank,token,probability,logit\n");
  char line[128];
  for (size_t r = 0; r < best.size(); ++r) {
    const size_t i = size_t(best[r]);
    csv << r + 1 << ',' << i << ',';
    if (tok) csv << csv_field(tok->decode({int32_t(i)})) << ',';
    std::snprintf(line, sizeof line, "%.9g,%.9g\n", p[i], double(logits[i]));
    csv << line;
  }
  return csv.str();
}

// --text: the prompt through the tokenizer (as generate encodes it); the top-k next tokens
// printed with their text, and written as CSV with --out.
int predict_after_text(const EvalArgs& a, const ModelConfig& mc) {
  SAT_CHECK(a.prompt.empty(), "--prompt and --text: give one (--prompt FILE of token ids, or --text TEXT)");
  const Tokenizer tok = language_model_tokenizer(a.tokenizer, a.init_weights, mc.vocab);
  const std::vector<int32_t> ids = prompt_tokens(tok, a.text, mc.context, "--text");
  const std::vector<float> logits = next_token_logits(a, mc, ids);
  const std::vector<double> p = softmax(logits.data(), int64_t(logits.size()));
  const std::vector<int64_t> best = top_k(logits, a.top_k);
  std::printf("the next token after %zu tokens of --text, most likely first:\n", ids.size());
  for (size_t r = 0; r < best.size(); ++r) {
    const size_t i = size_t(best[r]);
    std::printf("%3zu  %8.4f%%  token %-6zu '%s'\n", r + 1, 100 * p[i], i, printable(tok.decode({int32_t(i)})).c_str());
  }
  if (!a.out.empty()) write_csv(a.out, next_token_csv(logits, best, &tok));
  return 0;
}

// GPT models: the top-k next tokens after the prompt.
int predict_next_tokens(const EvalArgs& a, const ModelConfig& mc) {
  SAT_CHECK(a.data.empty(), "--data: predict with --prompt or --text reads no data (the prompt is the input)");
  if (!a.text.empty()) return predict_after_text(a, mc);
  SAT_CHECK(!a.prompt.empty(), "--prompt FILE is required for a GPT model (token ids separated by whitespace), or "
            "--text TEXT: predict writes the next token's top-k");
  SAT_CHECK(!a.out.empty(), "--out FILE is required (the CSV of predictions)");
  const std::vector<float> logits = next_token_logits(a, mc, read_prompt(a.prompt, mc));
  write_csv(a.out, next_token_csv(logits, top_k(logits, a.top_k), nullptr));
  return 0;
}

// eval.json: what was evaluated and the figures, under summary.json's names.
void write_eval_json(const EvalArgs& a, const ModelConfig& mc, const DataSplit& d, const EvalResult& r) {
  nlohmann::ordered_json j;
  j["model"] = mc.name;
  j["weights"] = a.init_weights;
  j["data"] = d.description;
  j["batch"] = a.batch;
  if (mc.tokens) j["seq_len"] = mc.seq_len;
  j["samples"] = r.samples;
  j["test_loss"] = r.loss;
  if (mc.tokens) j["test_perplexity"] = std::exp(r.loss);  // the loss is the mean per-token cross-entropy (nats)
  if (r.accuracy >= 0) j["test_accuracy"] = r.accuracy;
  write_file_atomic("--json", a.json, j.dump(2) + "\n");
  std::fprintf(stderr, "wrote %s\n", a.json.c_str());
}

}  // namespace

int run_eval(const EvalArgs& a) {
  check_common(a);
  if (!a.json.empty()) check_output_file("--json", a.json);
  ModelConfig mc = cli::model_for(a.model, a.vocab, a.seq_len);
  DataSplit d = open_test_split(a, mc, false);
  std::unique_ptr<Trainer> t = loaded_trainer(mc, a, a.batch, *d.train, *d.test);
  // After the weights loaded: a mistake is then the one line the user sees.
  std::fprintf(stderr, "saturate eval: %s (%s) on %s\n", mc.name.c_str(), a.init_weights.c_str(),
               d.description.c_str());
  const EvalResult r = t->evaluate();
  std::printf("test loss %.4f", r.loss);
  if (mc.tokens) std::printf(", perplexity %.4g", std::exp(r.loss));
  if (r.accuracy >= 0) std::printf(", test accuracy %.2f%%", 100 * r.accuracy);
  std::printf(" (%lld samples)\n", (long long)r.samples);
  if (!a.json.empty()) write_eval_json(a, mc, d, r);
  return 0;
}

int run_predict(const EvalArgs& a) {
  check_common(a);
  SAT_CHECK(!a.out.empty() || !a.text.empty(), "--out FILE is required (the CSV of predictions)");
  if (!a.out.empty()) check_output_file("--out", a.out);
  SAT_CHECK(a.top_k >= 1, "--top-k: expected a positive number of tokens, got ", a.top_k);
  const ModelConfig mc = cli::model_for(a.model, a.vocab, a.seq_len);
  return mc.tokens ? predict_next_tokens(a, mc) : predict_classes(a, mc);
}

}  // namespace sat
