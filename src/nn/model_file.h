// A model as a file: `--model file:NET.json` on every command. The file names the inputs
// with their per-sample shapes and dtypes, then the layers in the order they run, each by
// name with its type and arguments, wired by the names of their inputs (by default the
// previous layer's output; the first layer reads the first input), and the loss:
//
//   {"inputs": {"x": {"shape": [1, 28, 28]}, "y": {"shape": [], "dtype": "int32"}},
//    "layers": [
//      {"name": "flatten", "type": "flatten"},
//      {"name": "fc1", "type": "linear", "out": 1024, "tp": "column"},
//      {"name": "relu1", "type": "relu"},
//      {"name": "fc2", "type": "linear", "out": 10, "tp": "row"},
//      {"name": "loss", "type": "cross_entropy", "inputs": ["fc2", "y"]}],
//    "loss": "loss"}
//
// Parameter names are "<layer name>.weight" and so on (composites: "<name>.<part>..."), as
// PyTorch names a module's, so safetensors files round-trip. Input and output widths are
// taken from the inputs; given anyway ("in", "in_channels"), they are checked.
//
// Entries of "layers" are a layer, {"block": [layers]} or {"repeat": N, "start": S,
// "layers": [layers]} (N copies, "{i}" in names and inputs replaced by S, S+1, ...). A
// pipeline cuts between blocks: each layer outside a "block" group is a block of its own,
// except the loss, which stays with what precedes it. The composites (transformer_block,
// basic_block) are recompute units for --recompute full. Tensor parallelism: a linear with
// "tp": "column" splits its outputs over the group (its input copied in, or gathered under
// sequence parallelism), one with "tp": "row" reads a column layer's split outputs and its
// partial sums are all-reduced (reduce-scattered); gpt_embedding and transformer_block
// split themselves as Megatron-LM does. The layer types: see kLayerTypes in model_file.cpp
// and the README's "Your own model".
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "nn/models.h"

namespace sat {

struct FileInput {
  std::string name;
  Shape shape;  // per sample
  DType dtype = DType::f32;
};

struct FileLayer {
  std::string name, type;
  std::vector<std::string> inputs;  // resolved: never empty
  JsonRef args;                     // the layer's object (name, type and inputs included)
  bool starts_block = true;         // false inside a "block" group after its first layer, and for the loss
};

struct ModelFile {
  std::string path;
  std::string where;  // how messages name it: "--model file:NET.json", or "model 'NAME'" from the library
  bool lines = false;  // messages give the line (a file someone wrote, not the library's text)
  uint32_t crc = 0;  // of the file's bytes: ranks compare it
  std::vector<FileInput> inputs;  // the sample, then the target
  std::vector<FileLayer> layers;  // expanded, in the order they run
  std::string loss;               // the cross_entropy layer
  int64_t transformer_blocks = 0;
};

// Reads and checks `path` (sat::Error "--model file:PATH:LINE: layer 'NAME' (TYPE): what" for
// each mistake: an unknown type or field, a missing or misspelt one, a dangling or cyclic
// reference, a duplicate name, a shape that does not fit, a loss that is not a scalar) and
// returns the model's configuration: tokens or image input, classes, context and
// vocabulary filled from the file.
ModelConfig model_file_config(const std::string& spec, const std::string& path);

// The same for a model file's text (the library's builders write one): messages name it
// "model 'NAME'".
ModelConfig model_text_config(const std::string& name, const std::string& text);

// The file's layers into `g` (build_model's part for ModelFamily::file): sets m.logits and
// m.loss. The graph's inputs m.x and m.y exist already.
void build_from_file(BuiltModel& m, Graph& g);

// Whether the file has layers that tensor parallelism splits (a "tp" linear, a
// gpt_embedding or a transformer_block), and recompute units (composites) or attention.
bool file_has_tensor_parallel(const ModelFile& f);
bool file_has_recompute_units(const ModelFile& f);
bool file_has_attention(const ModelFile& f);

}  // namespace sat
