// saturate as a C++ library: models. A model is a network of saturate's layers, the same
// networks `--model` trains: a built-in ("mlp", "resnet18", "gpt:layers=...", "llama:..."),
// a model file (README "Your own model"), or a Sequential built here, which writes a model
// file's text and goes through the same checks. A Model also holds its weights once it has
// any (after fit, or load_weights); copies of a Model share them.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace saturate {

// Every mistake (a layer's missing or wrong field, data that does not fit the model, a file
// that cannot be read) is a saturate::Error whose message names the layer, field or file.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One layer: a type of the model-file format with its fields as a JSON object, e.g.
// Layer("conv2d", R"({"out_channels": 16, "kernel": 3, "padding": 1})"). Named after its
// type and position unless named; it reads the previous layer's output unless given inputs
// (layer names, or the input "x"): that is how branches and residual sums are wired.
class Layer {
 public:
  explicit Layer(std::string type, std::string fields_json = "{}");
  Layer& named(std::string name);
  Layer& reads(std::vector<std::string> inputs);

  const std::string& type() const { return type_; }
  const std::string& name() const { return name_; }
  const std::vector<std::string>& inputs() const { return inputs_; }
  const std::string& fields() const { return fields_; }

 private:
  std::string type_, fields_, name_;
  std::vector<std::string> inputs_;
};

// The common layers (PyTorch's defaults where a field is left out).
Layer Linear(int64_t out, bool bias = true);
Layer Conv2d(int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true);
Layer BatchNorm2d();
Layer LayerNorm();
Layer ReLU();
Layer GELU();  // the tanh approximation
Layer SiLU();  // x sigmoid(x)
Layer Flatten();
Layer Dropout(double p);
Layer MaxPool2d(int64_t kernel, int64_t stride = 0);  // stride 0: the kernel
Layer GlobalAvgPool2d();                              // [C, H, W] -> [C, 1, 1]
Layer Add(const std::string& a, const std::string& b);  // the sum of two layers' outputs

class Model;

// Layers in the order they run, from one input of per-sample shape [C, H, W] (images as the
// readers give them; a feature vector is [1, 1, F]) to the class logits; build() adds the
// cross-entropy loss on them.
class Sequential {
 public:
  explicit Sequential(std::vector<int64_t> input_shape, std::string name = "sequential");
  Sequential& add(Layer layer);
  // The model file this describes (saturate train --model file:NET.json trains it too).
  std::string json() const;
  // The checked model: a saturate::Error names the layer and field of any mistake.
  Model build() const;

 private:
  std::vector<int64_t> input_;
  std::string name_;
  std::vector<Layer> layers_;
};

class Model {
 public:
  // A built-in or family spec as --model takes it ("mlp", "convnet", "resnet:34",
  // "gpt:layers=2,heads=2,width=64,context=32,vocab=256", "file:NET.json"), or a path
  // ending in .json (a model file).
  static Model load(const std::string& spec);
  // A model file's text (what Sequential::json() writes, or saturate import): checked as
  // --model file: checks a file; messages name it "model 'NAME'".
  static Model from_json(const std::string& text, const std::string& name = "model");

  const std::string& name() const;
  std::string summary() const;          // in words, with the parameter count
  int64_t parameters() const;           // trainable values
  std::vector<int64_t> input_shape() const;  // per sample: [C, H, W], or [T] tokens
  int64_t classes() const;              // the logits' width (the vocabulary for token models)
  bool takes_tokens() const;
  // The model file's text (a file, from_json or a Sequential); "" for a built-in.
  std::string json() const;

  // Weights: none until fit() or load_weights() (fit then starts from a seeded
  // initialisation). Names are PyTorch's ("fc1.weight", "bn1.running_mean").
  bool has_weights() const;
  std::vector<std::string> weight_names() const;
  std::vector<float> weight(const std::string& name) const;  // Error when absent
  // The model's weights by name, whether it holds values yet or not, and each one's shape.
  std::vector<std::string> declared_weights() const;
  std::vector<int64_t> weight_shape(const std::string& name) const;  // Error naming an unknown one
  // Sets weights from row-major values by name: each a weight of the model with its number
  // of values (an Error names the first that is not). A model without weights yet needs
  // every parameter and statistic (its counters, num_batches_tracked, start at 0 when left
  // out); one with weights keeps those left out.
  void set_weights(const std::map<std::string, std::vector<float>>& weights);
  // safetensors, as saturate train --save-weights writes and --init-weights reads.
  void save(const std::string& path) const;
  void load_weights(const std::string& path);

  struct Impl;
  explicit Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace saturate
