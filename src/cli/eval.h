// `saturate eval` and `saturate predict`: a trained model's weights on the test split,
// through the trainer's own evaluation (Trainer::evaluate), so that eval's figures are
// train's final evaluation's, bit for bit, for the same weights, data and --batch.
#pragma once
#include <cstdint>
#include <string>

namespace sat {

struct EvalArgs {
  std::string model = "mlp", data, init_weights, normalize;
  std::string label;        // tables (csv:): train's --label (the weights know it)
  double val_fraction = 0;  // tables, image folders: train's --val-fraction (its test split)
  bool skip_bad_images = false;  // image folders: leave out the files that cannot be read
  std::string json;    // eval: --json FILE
  std::string out;     // predict: --out FILE (CSV)
  std::string prompt;  // predict, GPT models: --prompt FILE of token ids
  std::string text;       // predict, language models: --text, the prompt as text
  std::string tokenizer;  // ... through --tokenizer (default: the one the weights record)
  int64_t batch = 64, vocab = 0, seq_len = 0, top_k = 10;
  uint64_t seed = 0;  // synthetic data is generated from it, as in train
  int threads = 0;
};

// Prints the test loss (and accuracy for classifiers); with --json writes them. Returns
// the exit status; user mistakes are sat::Error naming the flag or file.
int run_eval(const EvalArgs& a);
// Classifiers: a CSV index,class,probability,label of the test split (a table's or image
// folder's classes and labels by their own names; the label empty where the data has none;
// image folders add a column file, the image's path in its folder, and a folder of images
// without class folders prints FILE<TAB>CLASS per image). GPT models: the top-k next tokens
// after --prompt, a CSV rank,token,probability,logit; after --text (encoded as generate
// encodes a prompt), printed with their text, and with --out a CSV
// rank,token,text,probability,logit.
int run_predict(const EvalArgs& a);

}  // namespace sat
