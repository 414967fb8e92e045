// The model families of --model: the presets are family members (the same graph, plan and
// names), families build the layers their configuration asks for, every mistake in a
// configuration is a clear sat::Error, and building even a trillion-parameter graph is
// cheap (a graph allocates nothing).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "core/alloc.h"
#include "data/dataset.h"
#include "nn/models.h"
#include "nn/params.h"
#include "nn/safetensors.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "error_of.h"

namespace {

using sat::test::error_of;

std::string config_error(const std::string& model) {
  return error_of([&] { sat::model_config(model); });
}

int count_kind(const sat::Graph& g, const std::string& kind) {
  int n = 0;
  for (auto& node : g.nodes()) n += kind == node.layer->kind();
  return n;
}

bool has_param(const sat::Graph& g, const std::string& name) {
  for (auto& p : g.params())
    if (p.name == name) return true;
  return false;
}

// The memory plan of one rank training the model with micro-batch `batch` (AdamW: two
// state slots), on synthetic data of the model's default shape.
sat::MemoryPlan plan_of(const sat::ModelConfig& mc, int64_t batch) {
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  sat::TrainConfig cfg;
  cfg.batch = batch;
  cfg.optim.name = "adamw";
  return sat::plan_rank(mc, cfg, *data.train, nullptr, 0, 1).memory;
}

// Two configurations build the same graph: layers, shapes, parameters, blocks, FLOPs and
// memory plan.
void expect_same_model(const std::string& a, const std::string& b, int64_t batch = 2) {
  SCOPED_TRACE(a + " vs " + b);
  const sat::ModelConfig ca = sat::model_config(a), cb = sat::model_config(b);
  EXPECT_EQ(ca.name, a);
  EXPECT_EQ(cb.name, b);
  const sat::BuiltModel ma = sat::build_model(ca, batch), mb = sat::build_model(cb, batch);
  const sat::Graph &ga = *ma.graph, &gb = *mb.graph;
  ASSERT_EQ(ga.nodes().size(), gb.nodes().size());
  for (size_t i = 0; i < ga.nodes().size(); ++i) {
    EXPECT_EQ(ga.nodes()[i].name, gb.nodes()[i].name);
    EXPECT_STREQ(ga.nodes()[i].layer->kind(), gb.nodes()[i].layer->kind());
    EXPECT_EQ(ga.nodes()[i].setup.output.shape, gb.nodes()[i].setup.output.shape) << ga.nodes()[i].name;
  }
  ASSERT_EQ(ga.params().size(), gb.params().size());
  for (size_t i = 0; i < ga.params().size(); ++i) {
    EXPECT_EQ(ga.params()[i].name, gb.params()[i].name);
    EXPECT_EQ(ga.params()[i].spec.shape, gb.params()[i].spec.shape) << ga.params()[i].name;
  }
  EXPECT_EQ(ga.param_count(), gb.param_count());
  EXPECT_EQ(ga.states().size(), gb.states().size());
  EXPECT_EQ(ga.block_starts(), gb.block_starts());
  EXPECT_EQ(ma.x_shape, mb.x_shape);
  EXPECT_DOUBLE_EQ(ga.flops_forward(), gb.flops_forward());
  EXPECT_DOUBLE_EQ(ga.flops_backward(), gb.flops_backward());
  const sat::MemoryPlan pa = plan_of(ca, batch), pb = plan_of(cb, batch);
  EXPECT_EQ(pa.by_kind, pb.by_kind);
  EXPECT_EQ(pa.transient, pb.transient);
  EXPECT_EQ(pa.total(), pb.total());
  EXPECT_GT(pa.total(), size_t(ga.param_count()) * 4);
}

TEST(ModelFamilies, PresetsAreFamilyMembers) {
  expect_same_model("gpt-mini", "gpt:layers=4,heads=4,width=256,context=128,vocab=4096");
  expect_same_model("gpt-mini", "gpt:vocab=4096,context=128,width=256,heads=4,layers=4");  // keys in any order
  expect_same_model("gpt2-124m", "gpt:layers=12,heads=12,width=768,context=1024,vocab=50257", 1);
  expect_same_model("mlp", "mlp:784-1024-1024-10", 32);
  expect_same_model("resnet18", "resnet:18");
  EXPECT_EQ(sat::build_model(sat::model_config("gpt2-124m"), 1).graph->param_count(), 124439808);
  EXPECT_EQ(sat::build_model(sat::model_config("mlp"), 1).graph->param_count(), 1863690);
}

// ---- model files (--model file:NET.json) -----------------------------------------------

std::string model_file(const std::string& name) { return std::string(SAT_SOURCE_DIR) + "/models/" + name + ".json"; }

// The node names of one rank's graph under a layout: the file inserts the same
// tensor-parallel communication and splits as the builder.
std::vector<std::string> node_names(sat::ModelConfig mc, int tp, bool sp, int rank) {
  mc.tp = tp, mc.tp_rank = rank, mc.sequence_parallel = sp;
  std::vector<std::string> names;
  const sat::BuiltModel m = sat::build_model(mc, 2);
  for (auto& n : m.graph->nodes()) names.push_back(n.name + ":" + n.setup.output.shape.str());
  for (auto& p : m.graph->params()) names.push_back(p.name + ":" + p.spec.shape.str());
  return names;
}

// Every built-in model written as a file (models/) is the same model: layers, shapes,
// parameters, blocks, FLOPs and plan, and the same rank graphs under tensor parallelism.
TEST(ModelFile, BuiltinModelsRebuiltFromTheirFiles) {
  for (const char* m : {"mlp", "convnet", "resnet18", "gpt-mini"}) expect_same_model(m, "file:" + model_file(m));
  expect_same_model("gpt2-124m", "file:" + model_file("gpt2-124m"), 1);
  EXPECT_EQ(sat::build_model(sat::model_config("file:" + model_file("gpt2-124m")), 1).graph->param_count(), 124439808);
  for (auto [m, sp] : {std::pair{"gpt-mini", false}, {"gpt-mini", true}, {"mlp", false}})
    for (int rank : {0, 1})
      EXPECT_EQ(node_names(sat::model_config(m), 2, sp, rank),
                node_names(sat::model_config("file:" + model_file(m)), 2, sp, rank))
          << m << (sp ? " sequence-parallel" : "") << " rank " << rank;
}

// A file written to a temporary directory, and the error it gives ("" if none).
std::string file_error(const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("sat_model_" + std::to_string(getpid()) + ".json");
  std::ofstream(p) << text;
  const std::string e = config_error("file:" + p.string());
  std::filesystem::remove(p);
  return e;
}

// Each mistake in a model file is one sat::Error naming the layer and the field.
TEST(ModelFile, MistakesNameTheLayerAndTheField) {
  const std::string head = R"({"inputs": {"x": {"shape": [1, 28, 28]}, "y": {"shape": [], "dtype": "int32"}}, "layers": [)";
  auto net = [&](const std::string& layers) { return head + layers + "]}"; };
  const std::string flat = R"({"name": "flat", "type": "flatten"}, )";
  const std::string loss = R"({"name": "loss", "type": "cross_entropy", "inputs": ["fc", "y"]})";
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {net(flat + R"({"name": "fc", "type": "dense", "out": 10}, )" + loss), {"layer 'fc'", "unknown type 'dense'", "linear"}},
      {net(flat + R"({"name": "fc", "type": "linear"}, )" + loss), {"layer 'fc' (linear)", "missing field 'out'"}},
      {net(flat + R"({"name": "fc", "type": "linear", "outs": 10}, )" + loss), {"layer 'fc' (linear)", "unknown field 'outs'"}},
      {net(flat + R"({"name": "act", "type": "gelu", "approximate": "fast"}, {"name": "fc", "type": "linear", "out": 10}, )" +
           loss), {"layer 'act' (gelu)", "field 'approximate' must be tanh or none (exact erf), got 'fast'"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10, "in": 100}, )" + loss),
       {"layer 'fc' (linear)", "'in' is 100 but its input 'flat' has 784 features"}},
      {net(flat + R"({"name": "conv", "type": "conv2d", "out_channels": 8, "kernel": 3}, )"
           R"({"name": "fc", "type": "linear", "out": 10}, )" + loss),
       {"layer 'conv' (conv2d)", "expected images [B, C, H, W] as input, got [1, 784]"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10, "inputs": ["flt"]}, )" + loss),
       {"layer 'fc' (linear)", "field 'inputs'", "'flt'", "dangling"}},
      {net(R"({"name": "a", "type": "relu", "inputs": ["b"]}, {"name": "b", "type": "relu", "inputs": ["a"]}, )"
           R"({"name": "fc", "type": "linear", "out": 10}, )" + loss),
       {"layer 'a' (relu)", "field 'inputs'", "cyclic"}},
      {net(flat + R"({"name": "flat", "type": "linear", "out": 10}, )" + loss), {"layer 'flat' (linear)", "used twice"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10})"), {"layer 'fc' (linear)", "loss must be a scalar"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10, "tp": "row"}, )" + loss),
       {"layer 'fc' (linear)", "\"tp\": \"row\"", "'flat' is whole"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10, "weight_init": "gauss"}, )" + loss),
       {"layer 'fc' (linear)", "field 'weight_init'", "'gauss'"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 2.5}, )" + loss), {"layer 'fc' (linear)", "field 'out'"}},
      {net(flat + R"({"name": "fc", "type": "linear", "out": 10}, {"name": "loss", "type": "cross_entropy"})"),
       {"layer 'loss' (cross_entropy)", "field 'inputs'"}},
      {net(flat + R"({"type": "linear", "out": 10}, )" + loss), {"layers[1]", "\"name\""}},
      {net(flat + R"({"repeat": 1e12, "layers": []}, )" + loss), {"layers[1].repeat"}},
      {head + "]", {"1:", "expected"}},
  };
  for (auto& [text, wants] : cases) {
    const std::string e = file_error(text);
    for (auto& want : wants) EXPECT_NE(e.find(want), std::string::npos) << "want '" << want << "' in: " << e << "\nfile: " << text;
  }
  EXPECT_EQ(file_error(net(flat + R"({"name": "fc", "type": "linear", "out": 10}, )" + loss)), "");
  // A device or a directory is refused before anything is read.
  EXPECT_NE(config_error("file:/dev/zero").find("/dev/zero is a character device, not a regular file"), std::string::npos);
  EXPECT_NE(config_error("file:/nonexistent.json").find("/nonexistent.json: cannot read the file"), std::string::npos);
  // Tensor-parallel splits that do not divide name the layer too.
  const sat::ModelConfig mc = sat::model_config("file:" + model_file("mlp"));
  const std::string e = error_of([&] { sat::check_tensor_parallel(mc, 3, false); });
  EXPECT_NE(e.find("--tp 3"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 'fc1' (linear)"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { sat::check_tensor_parallel(mc, 2, true); }).find("--sequence-parallel"), std::string::npos);
}

TEST(ModelFamilies, SpecOfEveryModel) {
  EXPECT_EQ(sat::model_spec(sat::model_config("gpt-mini")), "gpt:layers=4,heads=4,width=256,context=128,vocab=4096");
  EXPECT_EQ(sat::model_spec(sat::model_config("gpt:heads=2,layers=1,width=8,context=4,vocab=16,dropout=0.25")),
            "gpt:layers=1,heads=2,width=8,context=4,vocab=16,dropout=0.25");
  EXPECT_EQ(sat::model_spec(sat::model_config("mlp")), "mlp:784-1024-1024-10");
  EXPECT_EQ(sat::model_spec(sat::model_config("resnet18")), "resnet:18");
  EXPECT_EQ(sat::model_spec(sat::model_config("convnet")), "convnet");
  EXPECT_EQ(sat::model_config("gpt:layers=1,heads=2,width=8,context=4,vocab=16,dropout=0.25").dropout, 0.25f);
  // Regression (fuzz_model): dropout 0.99999992 is the float 0.99999994, which model_spec
  // printed with 6 digits as dropout=1, a spec --model refuses; now every digit it needs.
  const std::string spec =
      sat::model_spec(sat::model_config("gpt:layers=1,heads=2,width=8,context=4,vocab=16,dropout=0.99999992"));
  EXPECT_EQ(spec, "gpt:layers=1,heads=2,width=8,context=4,vocab=16,dropout=0.99999994");
  EXPECT_EQ(sat::model_config(spec).dropout, 0.99999994f);
}

// Llama's spec in its own order whatever the order given, and its parameters under
// HuggingFace LlamaForCausalLM's names and shapes (untied lm_head, no biases).
TEST(ModelFamilies, LlamaHasHuggingFacesNames) {
  const std::string spec = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256";
  EXPECT_EQ(sat::model_spec(sat::model_config("llama:vocab=256,context=32,ffn=96,width=64,kv_heads=2,heads=4,layers=2")),
            spec);
  EXPECT_EQ(sat::describe_model(sat::model_config(spec)), "Llama: 2 layers, 4 heads of 16 channels (2 key/value heads), "
                                                           "width 64, SwiGLU width 96, context 32, vocabulary 256");
  // norm_eps and rope_theta: in the spec and description only where they are not 1e-5 and 10000.
  EXPECT_EQ(sat::model_spec(sat::model_config(spec + ",norm_eps=1e-5,rope_theta=1e4")), spec);
  const sat::ModelConfig l3 = sat::model_config("llama:rope_theta=500000,norm_eps=0.000001," + spec.substr(6));
  EXPECT_EQ(l3.norm_eps, 1e-6f);
  EXPECT_EQ(l3.rope_theta, 500000.0f);
  EXPECT_EQ(sat::model_spec(l3), spec + ",norm_eps=1e-06,rope_theta=500000");
  EXPECT_EQ(sat::model_spec(sat::model_config(sat::model_spec(l3))), sat::model_spec(l3));
  EXPECT_EQ(sat::describe_model(l3), "Llama: 2 layers, 4 heads of 16 channels (2 key/value heads), width 64, SwiGLU "
                                     "width 96, context 32, vocabulary 256, RMSNorm eps 1e-06, rope theta 500000");
  const sat::BuiltModel m = sat::build_model(sat::model_config(spec), 2);
  std::map<std::string, sat::Shape> shapes;
  for (auto& p : m.graph->params()) shapes[p.name] = p.spec.shape;
  const std::string l1 = "model.layers.1.";
  const std::map<std::string, sat::Shape> want_some{
      {"model.embed_tokens.weight", {256, 64}},       {l1 + "input_layernorm.weight", {64}},
      {l1 + "self_attn.q_proj.weight", {64, 64}},     {l1 + "self_attn.k_proj.weight", {32, 64}},
      {l1 + "self_attn.v_proj.weight", {32, 64}},     {l1 + "self_attn.o_proj.weight", {64, 64}},
      {l1 + "post_attention_layernorm.weight", {64}}, {l1 + "mlp.gate_proj.weight", {96, 64}},
      {l1 + "mlp.up_proj.weight", {96, 64}},          {l1 + "mlp.down_proj.weight", {64, 96}},
      {"model.norm.weight", {64}},                    {"lm_head.weight", {256, 64}}};
  for (auto& [name, shape] : want_some) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  EXPECT_EQ(shapes.size(), 2u * 9 + 3);
  const int64_t per_layer = 64 * 64 * 2 + 32 * 64 * 2 + 96 * 64 * 3 + 2 * 64;
  EXPECT_EQ(m.graph->param_count(), 2 * per_layer + 2 * 256 * 64 + 64);
}

// Hidden layers fc1..fcN-1 with relu1..reluN-1, the output layer fcN; none hidden: fc1 alone.
TEST(ModelFamilies, MlpHasTheLayersOfItsWidths) {
  const sat::BuiltModel m = sat::build_model(sat::model_config("mlp:784-300-200-100-10"), 4);
  std::vector<std::string> names;
  for (auto& n : m.graph->nodes()) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"flatten", "fc1", "relu1", "fc2", "relu2", "fc3", "relu3", "fc4", "loss"}));
  EXPECT_EQ(m.graph->param_count(), 784 * 300 + 300 + 300 * 200 + 200 + 200 * 100 + 100 + 100 * 10 + 10);
  const sat::BuiltModel lin = sat::build_model(sat::model_config("mlp:784-10"), 4);
  EXPECT_EQ(lin.graph->nodes().size(), 3u);  // flatten, fc1, loss
  EXPECT_EQ(lin.graph->param_count(), 784 * 10 + 10);
  const sat::BuiltModel flat = sat::build_model(sat::model_config("mlp:12-5-3"), 4);
  EXPECT_EQ(flat.x_shape, (sat::Shape{4, 1, 1, 12}));
  EXPECT_EQ(flat.graph->nodes().back().setup.inputs[0].shape, (sat::Shape{4, 3}));
}

// Parameters of the CIFAR ResNet-34 for 10 classes, by hand. A BasicBlock (cin -> w) has
// two 3x3 convolutions (9 cin w + 9 w w) and two BatchNorms (2w + 2w), plus a 1x1
// downsample and its BatchNorm (cin w + 2w) when it changes the width.
//   stem     3*64*9 + 2*64                                   =      1,856
//   layer1   3 x (2 * 64*64*9 + 4*64)                         =    221,952
//   layer2   (64*128*9 + 128*128*9 + 4*128 + 64*128 + 2*128)  =    230,144
//            + 3 x (2 * 128*128*9 + 4*128)                    =    886,272
//   layer3   (128*256*9 + 256*256*9 + 4*256 + 128*256 + 2*256) =   919,040
//            + 5 x (2 * 256*256*9 + 4*256)                    =  5,903,360
//   layer4   (256*512*9 + 512*512*9 + 4*512 + 256*512 + 2*512) = 3,673,088
//            + 2 x (2 * 512*512*9 + 4*512)                    =  9,441,280
//   fc       512*10 + 10                                      =      5,130
//   total                                                     = 21,282,122
// (torchvision's ImageNet resnet34, 21,797,672, less its 7x7 stem's 9,408 - 1,728 and its
// 1000-class head's 513,000 - 5,130.) ResNet-18 likewise: 11,173,962.
TEST(ModelFamilies, ResnetDepths) {
  const sat::BuiltModel r34 = sat::build_model(sat::model_config("resnet:34"), 2);
  EXPECT_EQ(r34.graph->param_count(), 21282122);
  EXPECT_TRUE(has_param(*r34.graph, "layer3.5.conv2.weight"));
  EXPECT_TRUE(has_param(*r34.graph, "layer4.0.downsample.0.weight"));
  EXPECT_FALSE(has_param(*r34.graph, "layer4.3.conv1.weight"));
  EXPECT_EQ(count_kind(*r34.graph, "Conv2d"), 1 + 2 * 16 + 3);
  EXPECT_EQ(sat::build_model(sat::model_config("resnet:18"), 2).graph->param_count(), 11173962);
  sat::ModelConfig full = sat::model_config("resnet:34");
  full.recompute = sat::Recompute::full;
  const sat::BuiltModel rc = sat::build_model(full, 2);
  int units = 0;
  for (auto& n : rc.graph->nodes()) units += n.rc_first >= 0 && n.rc_last == int(&n - rc.graph->nodes().data());
  EXPECT_EQ(units, 16);  // one per BasicBlock
}

TEST(ModelFamilies, MistakesAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"transformer", "--model: unknown model 'transformer' (expected one of: mlp, convnet, resnet18, gpt-mini, "
                      "gpt2-124m; or a family: gpt:layers=L"},
      {"vit:depth=12", "--model vit:depth=12: unknown model family 'vit' (families: gpt:"},
      {"gpt:layers=4,heads=4,width=256,context=128", "--model gpt:layers=4,heads=4,width=256,context=128: missing "
                                                     "'vocab'"},
      {"gpt:layers=4,heads=4,context=128,vocab=64", "missing 'width'"},
      {"gpt:layers=0,heads=4,width=256,context=128,vocab=64", "'layers' must be a positive integer"},
      {"gpt:layers=4,heads=-4,width=256,context=128,vocab=64", "'heads' must be a positive integer up to 100000000, "
                                                               "got '-4'"},
      {"gpt:layers=4,heads=4,width=2.5,context=128,vocab=64", "'width' must be a positive integer"},
      {"gpt:layers=4,heads=4,width=256,context=,vocab=64", "'context' must be a positive integer"},
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=1e3", "'vocab' must be a positive integer"},
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=99999999999", "'vocab' must be a positive integer"},
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=64,depth=3", "unknown key 'depth'"},
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=64,layers=5", "'layers' is given twice"},
      {"gpt:layers=4,heads,width=256,context=128,vocab=64", "expected KEY=VALUE items"},
      {"gpt:layers=4,heads=3,width=256,context=128,vocab=64", "width 256 does not divide by heads 3"},
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=64,dropout=1", "'dropout' must be a probability in [0, 1)"},
      // Regression: below 1 as a double, 1 as the float the layers keep (every activation dropped).
      {"gpt:layers=4,heads=4,width=256,context=128,vocab=64,dropout=0.99999999", "'dropout' must be a probability"},
      {"gpt:layers=1,heads=256,width=256,context=10000000,vocab=64", "heads x context^2 = 2.56e+16 attention "
                                                                     "probabilities per sample is beyond 1e15"},
      {"llama:layers=2,heads=4,width=64,ffn=96,context=32,vocab=256", "missing 'kv_heads' (llama:layers=L,heads=H,"
                                                                      "kv_heads=K,width=C,ffn=F,context=T,vocab=V[,"
                                                                      "norm_eps=E][,rope_theta=R])"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,context=32,vocab=256", "missing 'ffn'"},
      {"llama:layers=2,heads=4,kv_heads=3,width=64,ffn=96,context=32,vocab=256", "heads 4 does not divide by kv_heads 3"},
      {"llama:layers=2,heads=4,kv_heads=0,width=64,ffn=96,context=32,vocab=256", "'kv_heads' must be a positive"},
      {"llama:layers=2,heads=4,kv_heads=2,width=12,ffn=96,context=32,vocab=256", "width / heads = 3 channels per head "
                                                                                 "is odd"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,dropout=0.1", "unknown key 'dropout'"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,norm_eps=0",
       "'norm_eps' must be a number above 0, got '0'"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,norm_eps=1e-50",
       "'norm_eps' must be a number above 0, got '1e-50'"},  // 0 as a float
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,norm_eps=small",
       "'norm_eps' must be a number above 0, got 'small'"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,rope_theta=1",
       "'rope_theta' must be a number above 1, got '1'"},
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,rope_theta=1e39",
       "'rope_theta' must be a number above 1, got '1e39'"},  // beyond float
      {"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256,rope_theta=",
       "'rope_theta' must be a number above 1, got ''"},
      {"resnet:50", "--model resnet:50: expected a depth of 18 or 34"},
      {"resnet:eighteen", "expected a depth of 18 or 34"},
      {"mlp:784", "expected the widths IN-HIDDEN...-CLASSES"},
      {"mlp:784--10", "hidden width 1 must be a positive integer"},
      {"mlp:784-0-10", "hidden width 1 must be a positive integer"},
      {"mlp:784-1024-x", "the number of classes must be a positive integer"},
      {"mlp:-784-10", "the input width must be a positive integer"},
  };
  for (auto& [model, want] : cases) {
    const std::string e = config_error(model);
    EXPECT_NE(e.find(want), std::string::npos) << model << ": " << e;
  }
  for (const char* good : {"gpt:layers=1,heads=1,width=1,context=1,vocab=1", "mlp:1-1", "resnet:34", "convnet"})
    EXPECT_EQ(config_error(good), "") << good;
}

// An mlp's input width is part of its name: data of another size is refused, naming the
// model, the data's shape and the model that would fit; other image models take the data.
TEST(ModelFamilies, MlpInputMustMatchTheData) {
  sat::DataOptions o;
  o.image_shape = sat::Shape{3, 32, 32};
  sat::DataSplit cifar = sat::open_dataset("synthetic", o);
  sat::ModelConfig mlp = sat::model_config("mlp");
  const std::string e = error_of([&] { sat::fit_to_data(mlp, *cifar.train); });
  for (const char* want : {"--model mlp takes inputs of 784 values", "[3, 32, 32] (3072 values)",
                           "use --model mlp:3072-1024-1024-10"})
    EXPECT_NE(e.find(want), std::string::npos) << e;
  sat::ModelConfig wide = sat::model_config("mlp:3072-1024-1024-10");
  sat::fit_to_data(wide, *cifar.train);
  EXPECT_EQ(wide.image, (sat::Shape{3, 32, 32}));
  EXPECT_EQ(sat::build_model(wide, 2).graph->param_count(), 3072 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  sat::ModelConfig res = sat::model_config("resnet:34");
  sat::DataSplit fashion = sat::open_dataset("synthetic", sat::DataOptions{});
  sat::fit_to_data(res, *fashion.train);
  EXPECT_EQ(res.image, fashion.train->sample_shape());
  sat::ModelConfig stale = sat::model_config("mlp");
  stale.image = sat::Shape{3, 28, 28};
  EXPECT_NE(error_of([&] { sat::build_model(stale, 2); }).find("takes inputs of 784 values"), std::string::npos);
}

// Tensor parallelism over the hidden layers in pairs: column- then row-parallel (with an
// all-reduce), a later pair entered through a copy; the last layer whole.
TEST(ModelFamilies, MlpTensorParallelPairs) {
  auto tp_graph = [](const std::string& name) {
    sat::ModelConfig mc = sat::model_config(name);
    mc.tp = 2;
    mc.tp_rank = 1;
    return sat::build_model(mc, 4);
  };
  const sat::BuiltModel four = tp_graph("mlp:784-64-32-48-16-10");
  EXPECT_EQ(count_kind(*four.graph, "TPCopy"), 1);
  EXPECT_EQ(count_kind(*four.graph, "TPAllReduce"), 2);
  std::map<std::string, sat::Shape> in, out;  // per layer
  for (auto& n : four.graph->nodes()) in[n.name] = n.setup.inputs[0].shape, out[n.name] = n.setup.output.shape;
  EXPECT_EQ(out["fc1"], (sat::Shape{4, 32}));  // column-parallel: half of 64
  EXPECT_EQ(in["fc2"], (sat::Shape{4, 32}));   // row-parallel: half of 64 in, 32 out
  EXPECT_EQ(out["fc2"], (sat::Shape{4, 32}));
  EXPECT_EQ(out["fc3"], (sat::Shape{4, 24}));  // half of 48
  EXPECT_EQ(in["fc5"], (sat::Shape{4, 16}));   // whole
  EXPECT_EQ(out["fc5"], (sat::Shape{4, 10}));
  const sat::BuiltModel three = tp_graph("mlp:784-64-32-48-10");  // fc3 and fc4 whole
  EXPECT_EQ(count_kind(*three.graph, "TPCopy"), 0);
  EXPECT_EQ(count_kind(*three.graph, "TPAllReduce"), 1);
  EXPECT_EQ(three.graph->param_count(), 784 * 32 + 32 + 32 * 32 + 32 + 32 * 48 + 48 + 48 * 10 + 10);

  auto tp_error = [](const std::string& name, int tp) {
    return error_of([&] { sat::check_tensor_parallel(sat::model_config(name), tp, false); });
  };
  EXPECT_EQ(tp_error("mlp:784-64-30-48-16-10", 2), "");  // 30 and 16 are not split
  EXPECT_NE(tp_error("mlp:784-64-32-50-16-10", 4).find("--tp 4: mlp:784-64-32-50-16-10's hidden width 50 (fc3's"),
            std::string::npos);
  EXPECT_NE(tp_error("mlp:784-1024-10", 2).find("has no tensor-parallel form"), std::string::npos);
  EXPECT_FALSE(sat::has_tensor_parallel_form(sat::model_config("mlp:784-1024-10")));
  EXPECT_TRUE(sat::has_tensor_parallel_form(sat::model_config("mlp:784-8-8-10")));
  EXPECT_TRUE(sat::has_tensor_parallel_form(sat::model_config("gpt-mini")));
  EXPECT_FALSE(sat::has_tensor_parallel_form(sat::model_config("resnet:34")));
}

TEST(ModelFamilies, RecomputeFollowsTheFamily) {
  auto error_with = [](const std::string& name, sat::Recompute r) {
    sat::ModelConfig mc = sat::model_config(name);
    mc.recompute = r;
    return error_of([&] { sat::check_recompute(mc); });
  };
  const std::string gpt = "gpt:layers=2,heads=2,width=16,context=8,vocab=32";
  EXPECT_EQ(error_with(gpt, sat::Recompute::selective), "");
  EXPECT_EQ(error_with(gpt, sat::Recompute::full), "");
  const std::string llama = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256";
  EXPECT_EQ(error_with(llama, sat::Recompute::selective), "");
  EXPECT_EQ(error_with(llama, sat::Recompute::full), "");
  EXPECT_EQ(error_with("resnet:34", sat::Recompute::full), "");
  EXPECT_NE(error_with("resnet:34", sat::Recompute::selective).find("--recompute selective: resnet:34 has no attention"),
            std::string::npos);
  EXPECT_NE(error_with("mlp:784-64-64-64-10", sat::Recompute::full).find("--recompute full: mlp:784-64-64-64-10 has no "
                                                                         "recomputable blocks"),
            std::string::npos);
}

// Building a graph never touches a device: a GPU's recomputing graphs build in a process
// that has none (the trainer refuses to run them).
TEST(ModelFamilies, GpuGraphsBuildWithoutAGpu) {
  for (auto [name, r] : {std::pair{"gpt-mini", sat::Recompute::selective}, std::pair{"gpt-mini", sat::Recompute::full},
                         std::pair{"resnet:34", sat::Recompute::full}}) {
    sat::ModelConfig mc = sat::model_config(name);
    mc.device = sat::Device::cuda;
    mc.act = sat::DType::bf16;
    mc.recompute = r;
    sat::ModelConfig keep = mc;
    keep.recompute = sat::Recompute::none;
    const sat::BuiltModel m = sat::build_model(mc, 2), k = sat::build_model(keep, 2);
    EXPECT_EQ(m.graph->param_count(), k.graph->param_count()) << name;
  }
  // Selective recomputation keeps no probabilities P on the GPU either.
  sat::ModelConfig sel = sat::model_config("gpt-mini");
  sel.device = sat::Device::cuda;
  sel.recompute = sat::Recompute::selective;
  size_t saved = 0;
  const sat::BuiltModel m = sat::build_model(sel, 2);
  for (auto& n : m.graph->nodes())
    if (std::string(n.layer->kind()) == "CausalSelfAttention") saved += n.setup.saved.size();
  EXPECT_EQ(saved, 0u);
}

// A GPT of about a trillion parameters (128 layers of width 25600): its graph is shapes and
// numbers only, so it builds at once and allocates nothing; its counts need int64.
TEST(ModelFamilies, TrillionParameterGptBuildsAtOnce) {
  const sat::ModelConfig mc = sat::model_config("gpt:layers=128,heads=160,width=25600,context=2048,vocab=51200");
  const size_t allocated = sat::mem_stats().current;
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  const auto t0 = std::chrono::steady_clock::now();
  const sat::BuiltModel m = sat::build_model(mc, 1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  getrusage(RUSAGE_SELF, &after);
  std::printf("gpt 1T: built in %.3f s, max RSS %ld -> %ld KiB\n", seconds, before.ru_maxrss, after.ru_maxrss);
  EXPECT_EQ(sat::mem_stats().current, allocated);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024);  // KiB
  // 12 C^2 + 13 C per layer, the embeddings (V + T) C, the final LayerNorm 2 C.
  const int64_t C = 25600, L = 128, V = 51200, T = 2048;
  const int64_t params = L * (12 * C * C + 13 * C) + (V + T) * C + 2 * C;
  EXPECT_EQ(m.graph->param_count(), params);
  EXPECT_GT(params, int64_t(1'000'000'000'000));
  // Forward FLOPs per token: 2 x the weights' multiply-adds, plus attention's.
  EXPECT_GT(m.graph->flops_forward(), 2.0 * double(params - (V + T) * C) * double(T));
  EXPECT_LT(m.graph->flops_forward(), 2.5 * double(params) * double(T));
}

}  // namespace

// ------------------------------------------------------------------------- safetensors

namespace {

// A safetensors file of one tensor entry (header JSON as given) and `data` bytes.
std::string safetensors_file(const std::string& name, const std::string& entry, size_t data) {
  const std::string header = "{\"" + name + "\": " + entry + "}";
  std::string f(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(f.data(), &n, 8);
  f += header + std::string(data, '\0');
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sat_test_models_" + std::to_string(getpid()) + ".safetensors")).string();
  std::ofstream(path, std::ios::binary) << f;
  return path;
}

}  // namespace

// Regression (fuzz_safetensors): a header's shape or offsets of 1e30, -1 or 2.5 went through
// nlohmann's conversion to integers (undefined behaviour for 1e30 and -1), and a shape of huge
// dimensions overflowed its element count; now each is an error naming the file and tensor.
TEST(Safetensors, HeaderNumbersMustBeWholeAndInRange) {
  sat::ModelConfig c = sat::model_config("convnet");
  sat::BuiltModel m = sat::build_model(c, 2);
  sat::ParamStore ps(m.graph->params(), m.graph->states(), 0);
  const std::string w = ps.decl(0).name, counter = "bn1.num_batches_tracked";
  struct Case { std::string name, entry, want; };
  const std::vector<Case> cases{
      {w, "{\"dtype\": \"F32\", \"shape\": [1e30], \"data_offsets\": [0, 8]}", "'shape' holds 1e+30"},
      {w, "{\"dtype\": \"F32\", \"shape\": [-1, 2], \"data_offsets\": [0, 8]}", "'shape' holds -1"},
      {w, "{\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}", "'shape' holds 2.5"},
      {w, "{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 8]}", "'data_offsets' holds -8"},
      {w, "{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 1e300]}", "'data_offsets' holds 1e+300"},
      {w, "{\"dtype\": \"F32\", \"shape\": 7, \"data_offsets\": [0, 8]}", "'shape' is not an array"},
      {w, "{\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}", "7 dimensions"},
      {counter, "{\"dtype\": \"I64\", \"shape\": [1099511627776, 1099511627776, 1099511627776], "
                "\"data_offsets\": [0, 8]}", "has shape"},
  };
  for (const auto& k : cases) {
    const std::string path = safetensors_file(k.name, k.entry, 8);
    std::string e;
    try {
      sat::load_safetensors(path, ps);
    } catch (const sat::Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find(path), std::string::npos) << k.entry << ": " << e;
    EXPECT_NE(e.find(k.want), std::string::npos) << k.entry << ": " << e;
    std::filesystem::remove(path);
  }
}

// --seq-len: the window T is the graph's (its input, FLOPs and activations), the context
// the parameters' (the position embedding keeps its rows, so weights are interchangeable).
TEST(ModelFamilies, SeqLenIsTheWindowNotTheContext) {
  sat::ModelConfig full = sat::model_config("gpt-mini"), window = full;
  sat::set_seq_len(window, 64);
  EXPECT_EQ(window.context, 128);
  EXPECT_EQ(sat::model_spec(window), sat::model_spec(full));
  const sat::BuiltModel a = sat::build_model(full, 2), b = sat::build_model(window, 2);
  EXPECT_EQ(b.x_shape, (sat::Shape{2, 64}));
  EXPECT_EQ(b.y_shape, (sat::Shape{2, 64}));
  ASSERT_EQ(a.graph->params().size(), b.graph->params().size());
  for (size_t i = 0; i < a.graph->params().size(); ++i) {
    EXPECT_EQ(a.graph->params()[i].name, b.graph->params()[i].name);
    EXPECT_EQ(a.graph->params()[i].spec.shape, b.graph->params()[i].spec.shape) << a.graph->params()[i].name;
  }
  EXPECT_LT(b.graph->flops_forward(), 0.55 * a.graph->flops_forward());
  sat::set_seq_len(window, 0);  // 0: not given, the window stays
  EXPECT_EQ(window.seq_len, 64);
  for (int64_t bad : {-1, 129}) EXPECT_THROW(sat::set_seq_len(window, bad), sat::Error) << bad;
  sat::ModelConfig mlp = sat::model_config("mlp");
  EXPECT_THROW(sat::set_seq_len(mlp, 8), sat::Error);
}

// An input shape whose element count would overflow int64 once batched (undefined
// behaviour in Shape::numel before it was checked) is refused where the file gives it.
TEST(ModelFile, InputShapesTooLargeToCountAreRefused) {
  const std::string e = file_error(R"({"inputs": {"x": {"shape": [100000000, 100000000, 100000000]}, "y": {"shape": []}},
    "layers": [{"name": "fc", "type": "linear", "out": 10}], "loss": "cross_entropy"})");
  EXPECT_NE(e.find("inputs.x.shape: a sample of more than 4294967296 elements; expected fewer"), std::string::npos) << e;
}
