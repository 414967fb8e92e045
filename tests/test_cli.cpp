// The `saturate` command as users run it: bad input gives one clear line naming the
// flag or file and exit status 2 (never a crash or a stack trace, nothing saved is
// lost); a good run writes summary.json and metrics.jsonl as the README documents.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/device.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

using sat::test::CmdResult;

// env: extra NAME=VALUE assignments for the command, each followed by a space.
CmdResult saturate(const std::string& args, const std::string& env = "") {
  return sat::test::run_command(env + "OMP_WAIT_POLICY=passive " + SAT_BINARY + " " + args);
}

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sat_cli_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void expect_user_error(const CmdResult& r, const std::string& must_mention) {
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("error"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(must_mention), std::string::npos) << "message should mention '" << must_mention << "': " << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;
}

void write_be32(std::ofstream& f, uint32_t v) {
  unsigned char b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
  f.write(reinterpret_cast<char*>(b), 4);
}

// A tiny MNIST-format directory: n images of 28x28 and n labels; `image_magic` lets
// a test break it.
void write_idx_dir(const fs::path& d, int n, uint32_t image_magic = 2051, bool truncate = false) {
  for (std::string split : {"train", "t10k"}) {
    std::ofstream im(d / (split + "-images-idx3-ubyte"), std::ios::binary);
    write_be32(im, image_magic);
    write_be32(im, uint32_t(n));
    write_be32(im, 28);
    write_be32(im, 28);
    std::string px(size_t(n) * 784 / (truncate ? 2 : 1), '\x40');
    im.write(px.data(), std::streamsize(px.size()));
    std::ofstream lb(d / (split + "-labels-idx1-ubyte"), std::ios::binary);
    write_be32(lb, 2049);
    write_be32(lb, uint32_t(n));
    for (int i = 0; i < n; ++i) lb.put(char(i % 10));
  }
}

}  // namespace

TEST(Cli, UnknownModelAndFlag) {
  expect_user_error(saturate("train --model resnet99 --data synthetic"), "resnet99");
  expect_user_error(saturate("train --model mlp --bogus-flag 3"), "--bogus-flag");
  expect_user_error(saturate("info --model transformer"), "transformer");
  expect_user_error(saturate("train --model mlp --data synthetic --batch 0"), "--batch");
  expect_user_error(saturate("train --model mlp --data synthetic --batch abc"), "--batch");
  expect_user_error(saturate("train --model mlp --data synthetic --optimizer adam"), "--optimizer");
  expect_user_error(saturate("train --model mlp --data synthetic --shuffle maybe"), "--shuffle");
  expect_user_error(saturate("train --model mlp --data synthetic --schedule linear"), "--schedule");
  expect_user_error(saturate("train --model mlp --data imagenet"), "imagenet");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --out /proc/saturate-out"), "--out");
  expect_user_error(saturate("train --model mlp --data synthetic --epochs 0"), "--epochs");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --lr -5"), "--lr");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --lr 0"), "--lr");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --weight-decay -1"), "--weight-decay");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --threads -2"), "--threads");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --zero 2"), "--zero");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --bucket-mb 0"), "--bucket-mb");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --last-batch keep"), "--last-batch");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --dist-backend gloo"), "--dist-backend");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --device cpu --dist-backend nccl"),
                    "--dist-backend nccl needs --device cuda");
  expect_user_error(saturate("bench comm --backend gloo"), "--backend");
  if (sat::cuda_device_count() == 0)  // no GPU (or no NCCL in this build): a clear error, not a crash
    expect_user_error(saturate("bench comm --backend nccl"), "--backend nccl");
  if (sat::cuda_device_count() == 0)  // ZeRO on GPUs is compiled: refused here for want of a GPU, as any cuda run
    expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --zero 3 --device cuda"),
                      "--device cuda: no usable GPU");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --noise-scale"), "--noise-scale needs --accum 2");
  expect_user_error(saturate("info --model mlp --zero 3"), "--zero");
  expect_user_error(saturate("train --model gpt-mini --data synthetic --steps 1 --recompute some"),
                    "--recompute: unknown mode 'some' (expected none, selective or full)");
  expect_user_error(saturate("train --model resnet18 --data synthetic --steps 1 --recompute selective"),
                    "--recompute selective: resnet18 has no attention");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --recompute full"),
                    "--recompute full: mlp has no recomputable blocks");
  expect_user_error(saturate("info --model convnet --recompute full"), "--recompute full: convnet");
  expect_user_error(saturate("info --model mlp --ranks 0"), "--ranks");
}

// --model FAMILY:SPEC in every command that takes --model: info prints the configuration
// (a trillion-parameter GPT plans without allocating it), train writes the user's string
// to summary.json, and each mistake is one line and exit status 2.
TEST(Cli, ModelFamilies) {
  CmdResult big = saturate("info --model gpt:layers=128,heads=160,width=25600,context=2048,vocab=51200 --batch 1");
  ASSERT_EQ(big.status, 0) << big.out;
  EXPECT_NE(big.out.find("parameters  1008038758400 "), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("config      gpt:layers=128,heads=160,width=25600,context=2048,vocab=51200 (128 layers, 160 "
                         "heads of 160 channels"),
            std::string::npos)
      << big.out;
  CmdResult mini = saturate("info --model gpt-mini --batch 1");
  ASSERT_EQ(mini.status, 0) << mini.out;
  EXPECT_NE(mini.out.find("config      gpt:layers=4,heads=4,width=256,context=128,vocab=4096 ("), std::string::npos)
      << mini.out;
  fs::path d = tmpdir("families");
  CmdResult r = saturate("train --model mlp:784-64-32-10 --data synthetic --batch 8 --steps 2 --eval off --out " +
                         d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream sf(d / "summary.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_EQ(s["model"], "mlp:784-64-32-10");
  EXPECT_EQ(s["parameters"], 784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10);
  fs::remove_all(d);

  const std::pair<std::string, std::string> mistakes[] = {
      {"info --model gpt:layers=4,heads=4,width=256,context=128", "--model gpt:layers=4,heads=4,width=256,context=128: "
                                                                  "missing 'vocab'"},
      {"train --data synthetic --model gpt:layers=4,heads=3,width=256,context=128,vocab=64", "width 256 does not "
                                                                                           "divide by heads 3"},
      {"info --model gpt:layers=4,heads=4,width=256,context=128,vocab=64,depth=2", "unknown key 'depth'"},
      {"tune --data synthetic --model resnet:50", "--model resnet:50: expected a depth of 18 or 34"},
      {"info --model mlp:784-x-10", "hidden width 1 must be a positive integer"},
      {"info --model vit:12", "unknown model family 'vit'"},
      {"info --model mlp:784-64-10 --tp 2", "--tp 2: mlp:784-64-10 has no tensor-parallel form"},
      {"train --model mlp --data synthetic:3x32x32 --steps 1", "--model mlp takes inputs of 784 values, but --data "
                                                              "synthetic train has samples of shape [3, 32, 32]"},
  };
  for (auto& [args, want] : mistakes) {
    SCOPED_TRACE(args);
    const CmdResult e = saturate(args);
    expect_user_error(e, want);
    EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out;
  }
}

TEST(Cli, MissingTruncatedAndWrongMagicDatasets) {
  expect_user_error(saturate("train --model mlp --data mnist:/nonexistent/dir --steps 1"), "/nonexistent/dir");
  fs::path d = tmpdir("badmagic");
  write_idx_dir(d, 16, 1234);
  expect_user_error(saturate("train --model mlp --data mnist:" + d.string() + " --steps 1"), "train-images-idx3-ubyte");
  fs::path t = tmpdir("truncated");
  write_idx_dir(t, 16, 2051, true);
  expect_user_error(saturate("train --model mlp --data mnist:" + t.string() + " --steps 1"), "train-images-idx3-ubyte");
  fs::path tok = tmpdir("tokens") / "bad.bin";
  {
    std::ofstream f(tok, std::ios::binary);
    int32_t header[256] = {12345, 1, 10};
    f.write(reinterpret_cast<char*>(header), sizeof header);
    uint16_t toks[10] = {};
    f.write(reinterpret_cast<char*>(toks), sizeof toks);
  }
  expect_user_error(saturate("train --model gpt-mini --data tokens:" + tok.string() + " --steps 1"), tok.string());
}

TEST(Cli, WrongWeightsFileKeepsExistingOutput) {
  fs::path d = tmpdir("weights");
  // Weights of a convnet, then loaded into an mlp: a clear error naming the file.
  CmdResult ok = saturate("train --model convnet --data synthetic --steps 2 --batch 4 --eval off --threads 1 --save-weights " +
                    (d / "convnet.safetensors").string());
  ASSERT_EQ(ok.status, 0) << ok.out;
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --init-weights " + (d / "convnet.safetensors").string()),
                    "convnet.safetensors");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --init-weights " + (d / "missing.safetensors").string()),
                    "missing.safetensors");
  // A failing run must not clobber weights saved before.
  auto before = fs::file_size(d / "convnet.safetensors");
  expect_user_error(saturate("train --model convnet --data mnist:/nonexistent --steps 1 --save-weights " +
                             (d / "convnet.safetensors").string()), "/nonexistent");
  EXPECT_EQ(fs::file_size(d / "convnet.safetensors"), before);
}

TEST(Cli, TrainWritesSummaryAndMetrics) {
  fs::path d = tmpdir("run");
  CmdResult r = saturate("train --model mlp --data synthetic --batch 8 --accum 2 --steps 6 --threads 1 --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("test accuracy"), std::string::npos) << r.out;
  std::ifstream sf(d / "summary.json");
  auto s = nlohmann::json::parse(sf);
  for (auto key : {"model", "parameters", "batch", "accum", "steps", "final_train_loss", "test_loss", "test_accuracy",
                   "samples_per_second", "predicted_memory_bytes", "peak_memory_bytes", "wall_seconds"})
    EXPECT_TRUE(s.contains(key)) << "summary.json lacks " << key;
  EXPECT_EQ(s["model"], "mlp");
  EXPECT_EQ(s["parameters"], 1863690);
  EXPECT_EQ(s["batch"], 8);
  EXPECT_EQ(s["accum"], 2);
  EXPECT_EQ(s["steps"], 6);
  EXPECT_GT(s["samples_per_second"].get<double>(), 0);
  EXPECT_LE(s["peak_memory_bytes"].get<double>(), s["predicted_memory_bytes"].get<double>());
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.0);
  EXPECT_LE(s["test_accuracy"].get<double>(), 1.0);
  std::ifstream mf(d / "metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(mf, line)) {
    auto m = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(m["step"], n);
    for (auto key : {"loss", "lr", "samples_per_second"}) EXPECT_TRUE(m.contains(key)) << line;
  }
  EXPECT_EQ(n, 6);
}

// --noise-scale: every metrics line has the smoothed estimate so far, and summary.json
// the last one.
TEST(Cli, NoiseScaleIsMeasuredDuringTraining) {
  fs::path d = tmpdir("noise");
  CmdResult r = saturate("train --model mlp --data synthetic --batch 16 --accum 2 --steps 30 --lr 0.05 --threads 1 --eval off "
                         "--noise-scale --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gradient noise scale"), std::string::npos) << r.out;
  std::ifstream mf(d / "metrics.jsonl");
  std::string line;
  double last = -1;
  int n = 0;
  while (std::getline(mf, line)) {
    auto m = nlohmann::json::parse(line);
    ASSERT_TRUE(m.contains("noise_scale")) << line;
    last = m["noise_scale"].get<double>();
    EXPECT_GE(last, 0) << line;
    ++n;
  }
  EXPECT_EQ(n, 30);
  std::ifstream sf(d / "summary.json");
  auto s = nlohmann::json::parse(sf);
  ASSERT_TRUE(s["noise_scale"].is_number()) << s.dump();
  EXPECT_GT(s["noise_scale"].get<double>(), 0);
  EXPECT_NEAR(s["noise_scale"].get<double>(), last, 1e-5 * last);
}

TEST(Cli, GptSummaryHasTokensPerSecond) {
  fs::path d = tmpdir("gpt");
  CmdResult r = saturate("train --model gpt-mini --data synthetic --batch 2 --steps 2 --threads 1 --eval off --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream sf(d / "summary.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_TRUE(s.contains("tokens_per_second"));
  EXPECT_FALSE(s.contains("test_accuracy"));
}

namespace {

// The bytes of the memory table's rows (from the line after `memory plan per rank` up to
// `total`), and the total's.
std::pair<double, double> info_rows_and_total(const std::string& out) {
  std::istringstream in(out.substr(out.find("memory plan per rank")));
  const std::regex row(R"(^  (\S.*?) +(\d+)  \S.*)");
  double rows = 0;
  std::string line;
  std::getline(in, line);
  for (std::smatch m; std::getline(in, line) && std::regex_match(line, m, row);) {
    if (m[1] == "total") return {rows, std::stod(m[2])};
    rows += std::stod(m[2]);
  }
  return {rows, -1};
}

}  // namespace

// info's memory table is what a rank holds at its peak: rows that sum to the total (the
// transient kinds as live then); each kind's sum over its buffers' lifetimes is a line apart.
TEST(Cli, InfoPrintsParametersFlopsAndPlan) {
  CmdResult r = saturate("info --model mlp --batch 32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1863690"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FLOPs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("activations"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total"), std::string::npos) << r.out;
  for (const char* args : {"--model resnet18 --batch 32 --optimizer sgd --momentum 0.9",
                           "--model gpt-mini --batch 4 --ranks 4 --zero 3 --recompute full"}) {
    const CmdResult m = saturate(std::string("info ") + args);
    ASSERT_EQ(m.status, 0) << m.out;
    const auto [rows, total] = info_rows_and_total(m.out);
    EXPECT_GT(total, 0) << m.out;
    EXPECT_EQ(rows, total) << m.out;
    EXPECT_NE(m.out.find("as live at its peak:"), std::string::npos) << m.out;
    EXPECT_NE(m.out.find("live at the step's peak"), std::string::npos) << m.out;
    EXPECT_NE(m.out.find("  buffers over the step, each kind summed over its lifetimes (never all live at once): "
                         "activations "), std::string::npos) << m.out;
  }
  CmdResult g = saturate("info --model gpt2-124m --batch 1");
  ASSERT_EQ(g.status, 0) << g.out;
  EXPECT_NE(g.out.find("124439808"), std::string::npos) << g.out;  // GPT-2 small, tied embeddings
}

// `saturate info --pp` prints every stage's plan; `saturate schedule` draws a schedule
// and says when it is model parallelism; their bad input is a clear error.
TEST(Cli, InfoAndScheduleOfAPipeline) {
  CmdResult i = saturate("info --model gpt-mini --batch 2 --pp 2 --accum 4 --pp-schedule gpipe");
  ASSERT_EQ(i.status, 0) << i.out;
  for (auto want : {"stage 0", "stage 1", "4 micro-batch(es) in flight", "copy of the tied embedding"})
    EXPECT_NE(i.out.find(want), std::string::npos) << want << "\n" << i.out;
  CmdResult g = saturate("schedule --pp 4 --accum 8");
  ASSERT_EQ(g.status, 0) << g.out;
  for (auto want : {"stage 0", "stage 3", "F7", "B7", "27.3%"}) EXPECT_NE(g.out.find(want), std::string::npos) << want;
  CmdResult mp = saturate("schedule --pp 3 --accum 1");
  ASSERT_EQ(mp.status, 0) << mp.out;
  EXPECT_NE(mp.out.find("model parallelism"), std::string::npos) << mp.out;
  EXPECT_NE(mp.out.find("66.7%"), std::string::npos) << mp.out;
  expect_user_error(saturate("schedule --pp 4 --accum 2 --pp-schedule interleaved --virtual-stages 2"), "--accum 2");
  expect_user_error(saturate("schedule --pp 2 --accum 4 --virtual-stages 2"), "--virtual-stages");
  expect_user_error(saturate("schedule --pp 0"), "--pp");
  expect_user_error(saturate("info --model gpt-mini --pp 8"), "--pp 8");
  expect_user_error(saturate("info --model mlp --pp 2 --pp-split 9"), "--pp-split 9");
  expect_user_error(saturate("train --model mlp --data synthetic --pp 2 --steps 1"),
                    "--tp 1 x --pp 2 = 2 does not divide the 1 process");
  expect_user_error(saturate("train --model mlp --data synthetic --batch auto --pp 2"), "--batch auto");
}

// `saturate hardware`: a built-in kind as a table or JSON that reads back as --gpu FILE; this
// machine measured; an unknown kind lists the kinds, a bad file names the key.
TEST(Cli, HardwareKindsFilesAndThisMachine) {
  CmdResult t = saturate("hardware --gpu h100-sxm");
  ASSERT_EQ(t.status, 0) << t.out;
  for (auto want : {"h100-sxm (built-in)", "bf16 989.4 TFLOP/s", "fp8 1979 TFLOP/s", "3350 GB/s", "450 GB/s per direction"})
    EXPECT_NE(t.out.find(want), std::string::npos) << want << "\n" << t.out;
  fs::path d = tmpdir("hardware");
  CmdResult j = saturate("hardware --gpu h100-sxm --json");
  ASSERT_EQ(j.status, 0) << j.out;
  EXPECT_EQ(nlohmann::json::parse(j.out).at("peak_tflops").at("tf32").get<double>(), 494.7);
  std::ofstream(d / "mine.json") << j.out;
  CmdResult back = saturate("hardware --gpu " + (d / "mine.json").string());
  ASSERT_EQ(back.status, 0) << back.out;
  EXPECT_EQ(back.out.substr(back.out.find('\n')), t.out.substr(t.out.find('\n')));  // all but the source line

  CmdResult here = saturate("hardware --gpu this --json");
  ASSERT_EQ(here.status, 0) << here.out;
  const std::string json_text = here.out.substr(here.out.find('{'));  // after the progress line
  const auto h = nlohmann::json::parse(json_text);
  EXPECT_EQ(h.at("gpu"), false);
  EXPECT_GT(h.at("peak_tflops").at("fp32").get<double>(), 0.0);
  EXPECT_GT(h.at("intra_node").at("bandwidth_gbs").get<double>(), 0.0);

  CmdResult unknown = saturate("hardware --gpu a100");
  expect_user_error(unknown, "unknown kind 'a100'");
  EXPECT_NE(unknown.out.find("(expected l4, a10, a10g, l40s, rtx-4090, rtx-a6000, a100-40gb, a100-80gb, h100-sxm, "
                             "h100-pcie, h200, b200, mi300x, this"), std::string::npos) << unknown.out;
  EXPECT_EQ(unknown.out.find('\n'), unknown.out.size() - 1) << "one line: " << unknown.out;
  std::ofstream(d / "bad.json") << R"({"base": "a100-80gb", "inter_node": {"bandwidth_gbs": -25}})";
  expect_user_error(saturate("hardware --gpu " + (d / "bad.json").string()),
                    "bad.json:1: key 'inter_node.bandwidth_gbs': expected a positive number, got -25");
  expect_user_error(saturate("hardware --gpu " + (d / "missing.json").string()), "missing.json: cannot read the file");
  expect_user_error(saturate("hardware --gpu this --threads -1"), "--threads");
  expect_user_error(saturate("hardware --gpus h100-sxm"), "--gpus");
}

// saturate plan: GPT-3 175B on 1024 A100s planned here (every layout it reports fits and
// forms the global batch; the files it writes parse), one given layout predicted, and the
// mistakes a user makes refused with one line and exit status 2.
TEST(Cli, PlanChoosesAFittingLayoutAndRefusesBadInput) {
  fs::path d = tmpdir("plan");
  const std::string gpt3 = "--model gpt:layers=96,heads=96,width=12288,context=2048,vocab=51200";
  CmdResult r = saturate("plan " + gpt3 + " --gpus 1024 --gpu a100-80gb --global-batch 1536 --top 3 --out " +
                         d.string() + " --json " + (d / "layouts.json").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("best: dp="), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(d / "plan.json"));
  EXPECT_EQ(j, nlohmann::json::parse(std::ifstream(d / "layouts.json")));
  ASSERT_EQ(j.at("layouts").size(), 3u);
  for (const auto& l : j.at("layouts")) {
    EXPECT_EQ(l.at("dp").get<int>() * l.at("tp").get<int>() * l.at("pp").get<int>(), 1024);
    EXPECT_EQ(l.at("dp").get<int>() * l.at("micro_batch").get<int>() * l.at("accum").get<int>(), 1536);
    EXPECT_LE(l.at("memory_bytes_per_gpu").get<double>(), 80.0 * (1 << 30));
    // Exact for every layout train runs on the device; a zero-bubble schedule on a GPU (the split
    // backward runs on the CPU engine only) is offered with its estimate and marked refused.
    if (l.at("runnable").get<bool>()) {
      EXPECT_TRUE(l.at("memory_exact").get<bool>()) << l.dump();
    }
    for (auto key : {"schedule", "virtual_stages", "recompute", "sequence_parallel", "zero", "step_seconds",
                     "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "bubble_fraction"})
      EXPECT_TRUE(l.contains(key)) << key;
  }
  EXPECT_EQ(j.at("best"), j.at("layouts")[0]);
  std::ifstream html(d / "plan.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  EXPECT_NE(page.find("<svg"), std::string::npos);

  CmdResult one = saturate("plan " + gpt3 + " --gpus 1024 --gpu a100-80gb --global-batch 1536 --layout "
                           "dp=16,tp=8,pp=8,micro=1,schedule=interleaved,v=2,recompute=full,sp=off,zero=0");
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_NE(one.out.find("best: dp=16,tp=8,pp=8,micro=1,schedule=interleaved,v=2,recompute=full,sp=off,zero=0"),
            std::string::npos) << one.out;

  const std::string mini = "plan --model gpt-mini --gpus 8 --gpu a100-80gb ";
  expect_user_error(saturate(mini + "--global-batch 64 --gpu a100"), "unknown kind 'a100'");
  expect_user_error(saturate(mini + "--global-batch 64 --layout dp=2,tp=2,pp=1"), "--gpus is 8");
  expect_user_error(saturate(mini + "--global-batch 64 --layout tp=8"), "attention heads");
  expect_user_error(saturate(mini + "--global-batch 64 --layout tp=3"), "tp=3 does not divide --gpus 8");
  expect_user_error(saturate(mini + "--global-batch 64 --layout dp=2,mp=2"), "unknown field 'mp'");
  expect_user_error(saturate(mini + "--global-batch 3 --layout dp=2"), "--global-batch 3");
  expect_user_error(saturate(mini), "--global-batch");
  expect_user_error(saturate("plan --model gpt:layers=4,heads=4,width=256,context=128 --gpus 8 --global-batch 8"),
                    "vocab");
  expect_user_error(saturate("plan --model gpt:layers=0,heads=4,width=256,context=128,vocab=64 --gpus 8 "
                             "--global-batch 8"), "layers");
  std::ofstream(d / "cluster.json") << R"({"base": "a100-80gb", "inter_node": {"bandwith_gbs": 25}})";
  expect_user_error(saturate(mini + "--global-batch 64 --gpu " + (d / "cluster.json").string()), "bandwith_gbs");
  CmdResult none = saturate(mini + "--global-batch 64 --memory-budget 1MiB");
  EXPECT_EQ(none.status, 2) << none.out;
  EXPECT_NE(none.out.find("no layout fits: the smallest needs"), std::string::npos) << none.out;
}

// GPT-2 small builds, plans and takes a real training step on the CPU.
TEST(Cli, Gpt2SmallTrainsOneStep) {
  fs::path d = tmpdir("gpt2");
  CmdResult r = saturate("train --model gpt2-124m --data synthetic --batch 1 --steps 1 --eval off --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream sf(d / "summary.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_EQ(s["parameters"], 124439808);
  double loss = s["final_train_loss"];
  EXPECT_NEAR(loss, std::log(50257.0), 0.5);  // an untrained model predicts ~uniformly
  EXPECT_LE(s["peak_memory_bytes"].get<double>(), s["predicted_memory_bytes"].get<double>());
}

// The CPU engine trains in fp32 or bf16: the GPU's other precisions are clear errors, and
// bf16 trains (summary.json says so, the plan is the peak).
TEST(Cli, PrecisionsOfTheCpuEngine) {
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --device cpu --precision fp16"),
                    "--precision fp16 needs --device cuda");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --device cpu --precision tf32"),
                    "--precision tf32 needs --device cuda");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --device cpu --precision bf8"),
                    "--precision: expected fp32, tf32, bf16 or fp16");
  expect_user_error(saturate("plan --gpu this --model mlp --global-batch 8 --precision fp16"), "--precision fp16");
  expect_user_error(saturate("info --model mlp --precision fp16"), "--precision fp16");
  // saturate info --precision bf16: the activations' lines at half of fp32's.
  auto line_bytes = [](const std::string& out, const std::string& kind) {
    const size_t at = out.find("\n  " + kind);
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + 3 + kind.size()));
  };
  const auto i32 = saturate("info --model resnet18 --batch 32");
  const auto i16 = saturate("info --model resnet18 --batch 32 --precision bf16");
  ASSERT_EQ(i32.status, 0) << i32.out;
  ASSERT_EQ(i16.status, 0) << i16.out;
  EXPECT_NE(i16.out.find("bf16 activations"), std::string::npos) << i16.out;
  EXPECT_GT(line_bytes(i32.out, "activations"), 0);
  EXPECT_NEAR(line_bytes(i16.out, "activations") / line_bytes(i32.out, "activations"), 0.5, 1e-3);
  EXPECT_EQ(line_bytes(i16.out, "parameters"), line_bytes(i32.out, "parameters"));
  const auto out = fs::temp_directory_path() / ("sat_cli_bf16_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = saturate("train --model mlp --data synthetic --steps 3 --batch 16 --precision bf16 --out " +
                          out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream f(out / "summary.json");
  const auto s = nlohmann::json::parse(f);
  EXPECT_EQ(s["precision"], "bf16");
  EXPECT_EQ(s["peak_memory_bytes"], s["predicted_memory_bytes"]);
  EXPECT_TRUE(std::isfinite(s["final_train_loss"].get<double>()));
  fs::remove_all(out);
}

// `saturate info --device cuda` plans the GPU engine here: under bf16 the low-precision copy
// of the fp32 master is sharded as the master is, whole under ZeRO-1, 1/dp under ZeRO-3.
TEST(Cli, InfoOnAGpuShardsTheLowPrecisionCopyAsTheMaster) {
  auto line_bytes = [](const std::string& out, const std::string& kind) {
    const size_t at = out.find("\n  " + kind);
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + 3 + kind.size()));
  };
  const std::string args = "info --model gpt-mini --batch 4 --ranks 4 --precision bf16 --device cuda --zero ";
  const auto z1 = saturate(args + "1"), z3 = saturate(args + "3");
  ASSERT_EQ(z1.status, 0) << z1.out;
  ASSERT_EQ(z3.status, 0) << z3.out;
  EXPECT_NE(z3.out.find("memory plan per rank on a GPU"), std::string::npos) << z3.out;
  const double whole = line_bytes(z1.out, "parameters"), shard = line_bytes(z3.out, "parameters");
  EXPECT_GT(whole, 0);
  EXPECT_EQ(line_bytes(z1.out, "low-precision parameters") * 2, whole) << z1.out;
  EXPECT_EQ(line_bytes(z3.out, "low-precision parameters") * 2, shard) << z3.out;
  EXPECT_LT(shard, whole / 3) << z3.out;
  EXPECT_NE(z3.out.find(", low-precision parameters "), std::string::npos) << z3.out;  // in what ZeRO-3 saves
}

TEST(Cli, TuneAndBudgetMistakesAreClearErrors) {
  expect_user_error(saturate("tune --model mlp --data synthetic --memory-budget lots"), "--memory-budget");
  expect_user_error(saturate("tune --model mlp --data synthetic --memory-budget 1KiB"), "--memory-budget");
  expect_user_error(saturate("tune --model mlp --data synthetic --batch 8"), "--batch");
  expect_user_error(saturate("tune --model mlp --data synthetic --memory-budget 64MiB --objective speed"), "--objective");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --global-batch 64"), "--global-batch");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --batch 4096 --memory-budget 20MiB"),
                    "--memory-budget");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 1 --batch auto --accum 2"), "--accum");
}

TEST(Cli, TuneWritesItsReportAndBatchAutoReusesIt) {
  fs::path d = tmpdir("tune"), cache = tmpdir("tune_cache");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  CmdResult t = saturate("tune --model mlp --data synthetic --memory-budget 40MiB --threads 1 --out " + d.string());
  ASSERT_EQ(t.status, 0) << t.out;
  std::ifstream jf(d / "tune.json");
  auto j = nlohmann::json::parse(jf);
  const int64_t micro = j["choice"]["micro_batch"].get<int64_t>();
  EXPECT_GE(micro, 1);
  EXPECT_LE(micro, j["max_micro_batch"].get<int64_t>());
  EXPECT_LE(j["confirm_peak_bytes"].get<double>(), 40.0 * 1024 * 1024);
  EXPECT_EQ(j["failed_allocations"], 0);
  EXPECT_GT(j["candidates"].size(), 2u);
  EXPECT_TRUE(fs::exists(d / "tune.html"));
  EXPECT_NE(t.out.find("tune: micro-batch"), std::string::npos) << t.out;

  // --batch auto tunes (and caches), then trains with the choice; the second run reuses it.
  fs::path o1 = tmpdir("auto1"), o2 = tmpdir("auto2");
  const std::string run = "train --model mlp --data synthetic --batch auto --memory-budget 40MiB --steps 3 --threads 1 ";
  CmdResult r1 = saturate(run + "--out " + o1.string(), env);
  ASSERT_EQ(r1.status, 0) << r1.out;
  EXPECT_EQ(r1.out.find("cached"), std::string::npos) << r1.out;
  EXPECT_TRUE(fs::exists(o1 / "tune.json"));
  CmdResult r2 = saturate(run + "--out " + o2.string(), env);
  ASSERT_EQ(r2.status, 0) << r2.out;
  EXPECT_NE(r2.out.find("using the cached choice"), std::string::npos) << r2.out;
  auto s1 = nlohmann::json::parse(std::ifstream(o1 / "summary.json"));
  auto s2 = nlohmann::json::parse(std::ifstream(o2 / "summary.json"));
  EXPECT_EQ(s1["batch"], s2["batch"]);
  EXPECT_EQ(s1["accum"], s2["accum"]);
  EXPECT_EQ(s1["optimizer"]["lr"], s2["optimizer"]["lr"]);
  EXPECT_LE(s1["peak_memory_bytes"].get<double>(), 40.0 * 1024 * 1024);
}

// --layout auto: each mistake in its flags is one line and exit status 2, before anything is
// measured; a budget no layout fits says the smallest layout's need.
TEST(Cli, LayoutAutoMistakesAreClearErrors) {
  const std::string run = "train --model gpt-mini --data synthetic --steps 1 --threads 1 ";
  expect_user_error(saturate("tune --model mlp --data synthetic --layout auto"),
                    "--layout auto needs --global-batch (the samples per optimizer step the layouts share)");
  expect_user_error(saturate(run + "--layout auto --global-batch 8 --accum 2"), "--accum: not with --layout");
  expect_user_error(saturate(run + "--layout auto --global-batch 8 --pp-split 2"), "--pp-split: not with --layout");
  expect_user_error(saturate(run + "--layout tp=2 --tp 4 --global-batch 8"), "--tp 4 disagrees with --layout's tp=2");
  expect_user_error(saturate(run + "--layout zero=1 --zero 2 --global-batch 8"), "--zero 2 disagrees with --layout's zero=1");
  expect_user_error(saturate(run + "--layout micro=2 --batch 4 --global-batch 8"), "--batch 4 disagrees with --layout's micro=2");
  expect_user_error(saturate(run + "--layout sp=off --sequence-parallel --global-batch 8"),
                    "--sequence-parallel disagrees with --layout's sp=off");
  expect_user_error(saturate(run + "--layout tp=two --global-batch 8"), "--layout: tp=two: expected a positive integer");
  expect_user_error(saturate(run + "--layout bogus=1 --global-batch 8"), "--layout: unknown field 'bogus'");
  expect_user_error(saturate(run + "--layout auto --global-batch 8 --layout-candidates 0"), "--layout-candidates");
  expect_user_error(saturate(run + "--layout auto --global-batch 8 --memory-budget 1MiB"),
                    "fits the memory budget of 1.0 MiB per rank (--memory-budget): the smallest");
}

// saturate tune --layout auto on one process: the table of predicted beside measured, tune.json
// with the layouts and the choice, and train --layout auto taking the cached choice.
TEST(Cli, LayoutAutoTunesAndTrainReusesIt) {
  fs::path d = tmpdir("layout"), cache = tmpdir("layout_cache"), o = tmpdir("layout_train");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  const std::string flags = "--model mlp --data synthetic --threads 1 --layout auto --global-batch 32 "
                            "--layout-candidates 2 --memory-budget 64MiB ";
  CmdResult t = saturate("tune " + flags + "--out " + d.string(), env);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("<- chosen"), std::string::npos) << t.out;
  auto j = nlohmann::json::parse(std::ifstream(d / "tune.json"));
  ASSERT_EQ(j["layouts"].size(), 2u);
  EXPECT_EQ(j["layouts"][0]["dp"].get<int>() * j["layouts"][0]["micro_batch"].get<int>() *
                j["layouts"][0]["accum"].get<int>(), 32);
  EXPECT_TRUE(j.contains("layout_choice"));
  EXPECT_TRUE(fs::exists(d / "tune.html"));
  CmdResult r = saturate("train " + flags + "--steps 2 --out " + o.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("using the cached choice"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layout auto: dp=1,tp=1,pp=1,micro=" + std::to_string(j["layout_choice"]["micro_batch"].get<int>())),
            std::string::npos) << r.out;
  auto s = nlohmann::json::parse(std::ifstream(o / "summary.json"));
  EXPECT_EQ(s["batch"], j["layout_choice"]["micro_batch"]);
  EXPECT_EQ(s["global_batch"], 32);
  EXPECT_TRUE(fs::exists(o / "tune.json"));
}

// Every floating-point flag of every command refuses NaN and infinities (one validator on
// all of them), naming the flag, before anything runs.
TEST(Cli, NonFiniteNumbersAreRefused) {
  const std::string run = "train --model mlp --data synthetic --steps 1 --threads 1 ";
  for (const std::string flag : {"--lr nan", "--lr inf", "--gamma -inf", "--weight-decay nan", "--momentum 1e999",
                                 "--bucket-mb inf", "--knee nan"})
    expect_user_error(saturate(run + flag), flag.substr(0, flag.find(' ')) + ": expected a finite number");
  expect_user_error(saturate("tune --model mlp --data synthetic --knee inf"), "--knee: expected a finite number");
  expect_user_error(saturate("info --model mlp --momentum nan"), "--momentum: expected a finite number");
  expect_user_error(saturate(run + "--lr 0.1x"), "--lr: expected a number");
  expect_user_error(saturate(run + "--lr 1e300"), "--lr: expected a finite number (at most 3.4e38 in magnitude)");
  expect_user_error(saturate(run + "--bucket-mb 1e30"), "--bucket-mb: expected a size from 0 to 1048576");
}


// SAT_CONV (a forced convolution path) with a value it cannot take is a clear error, not a
// silent fallback to the default choice; auto and the known paths train.
TEST(Cli, UnknownConvolutionPathIsRefused) {
  const std::string run = "train --model convnet --data synthetic --batch 4 --steps 1 --threads 1 --eval off";
  expect_user_error(saturate(run, "SAT_CONV=winograd "),
                    "SAT_CONV: expected auto, rule, im2col, onednn, winograd2 or winograd4, got 'winograd'");
  for (const char* ok : {"auto", "rule", "im2col", "winograd2"}) {
    const CmdResult r = saturate(run, std::string("SAT_CONV=") + ok + " ");
    EXPECT_EQ(r.status, 0) << ok << ": " << r.out;
  }
}

// A run whose parameters stop being finite fails (status 2) naming the step, and saves
// neither weights nor a summary (summary.json marks the run failed): in the last update
// (the loss never saw it), or earlier.
TEST(Cli, DivergedRunFailsAndSavesNothing) {
  fs::path d = tmpdir("diverged");
  const std::string run = "train --model mlp --data synthetic --batch 8 --threads 1 --eval off --lr 1e10 "
                          "--weight-decay 1e30 --save-weights " + (d / "w.safetensors").string() + " --out " +
                          (d / "out").string();
  expect_user_error(saturate(run + "1 --steps 1"), "the parameters are not finite after step 1 of 1");
  expect_user_error(saturate(run + "3 --steps 3"), "the parameters first became non-finite in the update of step 1");
  EXPECT_FALSE(fs::exists(d / "w.safetensors"));
  for (const char* out : {"out1", "out3"}) {  // the directory is marked failed, with no results
    const nlohmann::json s = nlohmann::json::parse(std::ifstream(d / out / "summary.json"));
    EXPECT_EQ(s["status"], "failed") << out;
    EXPECT_FALSE(s.contains("final_train_loss")) << out;
  }
}

// Every integer flag is range-checked before any arithmetic (no overflow, no huge
// allocation from a typo), naming the flag and the range.
TEST(Cli, IntegerFlagsAreRangeChecked) {
  const std::string run = "train --model mlp --data synthetic --steps 1 --threads 1 ";
  expect_user_error(saturate(run + "--accum 0"), "--accum: expected an integer from 1 to");
  expect_user_error(saturate(run + "--accum 99999999999999999999"), "--accum: expected an integer from 1 to");
  expect_user_error(saturate(run + "--tp 0"), "--tp: expected an integer from 1 to 4096");
  expect_user_error(saturate(run + "--seed -1"), "--seed: expected an integer from 0 to 18446744073709551615");
  expect_user_error(saturate("train --model mlp --data synthetic --threads 5000"), "--threads: expected an integer from 0 to 1024");
  expect_user_error(saturate(run + "--batch 99999999999"), "--batch: expected a micro-batch size from 1 to");
  expect_user_error(saturate(run + "--global-batch 1e9"), "--global-batch: expected an integer");
  expect_user_error(saturate("info --model mlp --batch 4000000000"), "--batch: expected an integer from 1 to");
  expect_user_error(saturate("schedule --pp 4 --accum 10000000"), "--accum: expected an integer from 1 to 4096");
  expect_user_error(saturate("hardware --gpu h200 --threads 100000"), "--threads: expected an integer from 0 to 1024");
  expect_user_error(saturate("plan --gpus 0"), "--gpus: expected an integer from 1 to");
  expect_user_error(saturate("bench comm --iters 0"), "--iters: expected an integer from 1 to");
  expect_user_error(saturate("launch -n 5000 -- train --steps 1"), "-n: expected a number of processes from 1 to 4096");
  expect_user_error(saturate("launch -n 99999999999999999999 -- train --steps 1"), "-n: expected a number of processes");
  expect_user_error(saturate(run + "--memory-budget 1e30TiB"), "--memory-budget");
  expect_user_error(saturate("plan --global-batch 64 --layout tp=4294967298"), "--layout: tp=4294967298: expected a positive integer");
}

// Outputs are checked before anything is read or trained: a target that exists and is not a
// regular file is refused and left as it is, an impossible directory is refused at once.
TEST(Cli, OutputsAreCheckedBeforeTraining) {
  fs::path d = tmpdir("outputs");
  fs::create_directories(d / "adir");
  { std::ofstream(d / "afile") << "keep me\n"; }
  const std::string run = "train --model mlp --data synthetic --steps 1 --batch 8 --threads 1 --eval off ";
  auto refused = [](const CmdResult& r, const std::string& mention) {
    expect_user_error(r, mention);
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << "refused only after training: " << r.out;
  };
  refused(saturate(run + "--save-weights /dev/null"), "--save-weights: /dev/null exists and is not a regular file");
  EXPECT_FALSE(fs::is_regular_file("/dev/null"));
  refused(saturate(run + "--save-weights " + (d / "adir").string()), "is not a regular file (a directory)");
  EXPECT_TRUE(fs::is_directory(d / "adir"));
  refused(saturate(run + "--save-weights /proc/saturate.safetensors"), "--save-weights");
  refused(saturate(run + "--save-weights " + (d / "missing" / "w.safetensors").string()), "does not exist");
  refused(saturate(run + "--out " + (d / "afile").string()), "--out: " + (d / "afile").string() + " exists and is not a directory");
  EXPECT_EQ(fs::file_size(d / "afile"), 8u);
  refused(saturate(run + "--out /proc/saturate-out/run"), "--out: cannot create directory");
  fs::create_directories(d / "run" / "metrics.jsonl");  // a directory where a file goes
  refused(saturate(run + "--overwrite --out " + (d / "run").string()), "metrics.jsonl exists and is not a regular file");
  expect_user_error(saturate("tune --model mlp --data synthetic --out /dev/null"), "--out: /dev/null");
  expect_user_error(saturate("plan --global-batch 64 --json /dev/null"), "--json: /dev/null exists and is not a regular file");
  expect_user_error(saturate("plan --global-batch 64 --out " + (d / "afile").string()), "is not a directory");
}

// A new run never truncates an earlier run's metrics.jsonl: the directory is refused unless
// --overwrite says to replace it.
TEST(Cli, OutDirOfAnotherRunNeedsOverwrite) {
  fs::path d = tmpdir("overwrite");
  const std::string run = "train --model mlp --data synthetic --steps 2 --batch 8 --threads 1 --eval off --out " + d.string();
  ASSERT_EQ(saturate(run).status, 0);
  const auto metrics = fs::file_size(d / "metrics.jsonl");
  const std::string summary = nlohmann::json::parse(std::ifstream(d / "summary.json")).dump();
  expect_user_error(saturate(run + " --steps 3"), "--out: " + d.string() + " already holds the results of another run");
  EXPECT_NE(saturate(run + " --steps 3").out.find("--overwrite"), std::string::npos);
  EXPECT_EQ(fs::file_size(d / "metrics.jsonl"), metrics);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(d / "summary.json")).dump(), summary);
  CmdResult r = saturate(run + " --steps 3 --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(d / "summary.json"))["steps"], 3);
  for (auto& e : fs::directory_iterator(d))  // no temporary files left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

namespace {
nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}
}  // namespace

// A run's --out is always one run's, complete or clearly marked incomplete: summary.json
// says "running" from the start, "complete" at the end, "failed" after an error; an earlier
// run's results replaced with --overwrite are gone from the start (never beside the new
// run's partial metrics.jsonl); a metrics.jsonl that cannot be written stops the run with
// an error naming it and keeps whole lines only; tune does not replace tune.json without
// --overwrite.
TEST(Cli, OutDirIsOneRunsCompleteOrMarkedIncomplete) {
  fs::path d = tmpdir("one_run");
  const std::string run = "train --model mlp --data synthetic --batch 8 --threads 1 --eval off --out " + d.string();
  ASSERT_EQ(saturate(run + " --steps 3").status, 0);
  EXPECT_EQ(read_json_file(d / "summary.json")["status"], "complete");
  std::ofstream(d / "tune.json") << "{}\n";  // an earlier run's report: not this run's
  // A file size limit stands in for a full disk: metrics.jsonl fails after 100-odd lines (16 KiB;
  // config.toml, written before, is smaller).
  CmdResult full = sat::test::run_command("ulimit -f 16; OMP_WAIT_POLICY=passive " + std::string(SAT_BINARY) + " " +
                                          run + " --steps 400 --overwrite");
  EXPECT_EQ(full.status, 2) << full.out;
  EXPECT_NE(full.out.find("--out: cannot write " + (d / "metrics.jsonl").string() + ": File too large"),
            std::string::npos) << full.out;
  EXPECT_EQ(read_json_file(d / "summary.json")["status"], "failed");
  EXPECT_FALSE(fs::exists(d / "tune.json"));
  std::ifstream mf(d / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(mf, line); ++lines)
    EXPECT_TRUE(nlohmann::json::accept(line)) << "line " << lines + 1 << ": " << line;
  EXPECT_GT(lines, 5);
  EXPECT_LT(lines, 400);
  // Killed at any moment: the mark says running, not the earlier run's "complete".
  ASSERT_EQ(saturate(run + " --steps 3 --overwrite").status, 0);
  CmdResult killed = sat::test::run_command(
      "OMP_WAIT_POLICY=passive " + std::string(SAT_BINARY) + " " + run + " --steps 100000000 --overwrite & P=$!; "
      "for i in $(seq 200); do grep -q running " + (d / "summary.json").string() + " && break; sleep 0.1; done; "
      "sleep 1; kill -9 $P; wait $P");
  EXPECT_EQ(read_json_file(d / "summary.json")["status"], "running") << killed.out;
  // tune keeps an earlier tune.json unless told to replace it.
  fs::path t = tmpdir("one_tune");
  std::ofstream(t / "tune.json") << "{\"earlier\": 1}\n";
  expect_user_error(saturate("tune --model mlp --data synthetic --threads 1 --out " + t.string()),
                    "--out: " + t.string() + " already holds the results of another tuning (tune.json)");
  EXPECT_EQ(read_json_file(t / "tune.json")["earlier"], 1);
}

namespace {
using sat::test::mpirun;
}  // namespace

// Under mpirun the ranks agree on the resolved configuration and on the weights they start
// from, or every rank says why (one line each) and the job ends with status 2, no hang.
TEST(Cli, RanksMustAgreeOnConfigurationAndWeights) {
  const std::string mpi = mpirun();
  if (mpi.empty()) GTEST_SKIP() << "no mpirun";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SAT_COMM_TIMEOUT=60 ";
  const std::string launch = mpi + " --oversubscribe --bind-to none -np 1 ";
  const std::string bin = std::string(SAT_BINARY);
  fs::path d = tmpdir("agree");
  const std::string run = " train --model mlp --data synthetic --steps 1 --batch 8 --threads 1 --eval off";
  auto both = [&](const std::string& a0, const std::string& a1) {
    return sat::test::run_command(env + launch + bin + run + a0 + " : -np 1 " + bin + run + a1);
  };
  CmdResult lr = both(" --lr 0.01", " --lr 0.02");
  EXPECT_EQ(lr.status, 2) << lr.out;
  EXPECT_NE(lr.out.find("error on rank 1: the ranks disagree on the configuration: this rank has lr 0.02 where rank 0 "
                        "has 0.01"), std::string::npos) << lr.out;
  EXPECT_NE(lr.out.find("error on rank 0: the ranks disagree on the configuration"), std::string::npos) << lr.out;
  // --normalize is part of the data every rank must share.
  CmdResult norm = both("", " --normalize 0.5,0.5");
  EXPECT_EQ(norm.status, 2) << norm.out;
  EXPECT_NE(norm.out.find("error on rank 1: the ranks disagree on the configuration: this rank has normalize "
                          "(pixels/255 - 0.5)/0.5 where rank 0 has pixels/255"), std::string::npos) << norm.out;
  // Weights of another file under each rank's --init-weights: refused before the broadcast hides it.
  ASSERT_EQ(saturate(run + " --save-weights " + (d / "a.safetensors").string()).status, 0);
  ASSERT_EQ(saturate(run + " --seed 5 --save-weights " + (d / "b.safetensors").string()).status, 0);
  CmdResult w = both(" --init-weights " + (d / "a.safetensors").string(), " --init-weights " + (d / "b.safetensors").string());
  EXPECT_EQ(w.status, 2) << w.out;
  EXPECT_NE(w.out.find("error on rank 1: the data-parallel replicas disagree on the weights from --init-weights"),
            std::string::npos) << w.out;
  EXPECT_NE(w.out.find("error on rank 0: the data-parallel replicas disagree"), std::string::npos) << w.out;
  // The same flags and file on both: trains.
  CmdResult ok = both(" --init-weights " + (d / "a.safetensors").string(), " --init-weights " + (d / "a.safetensors").string());
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// saturate launch: -n bounded by the slots of this machine unless --oversubscribe; a signal
// to launch reaches mpirun and its ranks, and whether launch is stopped (SIGTERM) or killed
// (SIGKILL), no process of the job outlives it.
TEST(Cli, LaunchIsBoundedAndLeavesNothingBehind) {
  if (mpirun().empty()) GTEST_SKIP() << "no mpirun";
  const int cores = int(std::thread::hardware_concurrency());
  expect_user_error(saturate(sat::str_cat("launch -n ", cores + 1, " -- train --steps 1")),
                        sat::str_cat("-n ", cores + 1, ": this machine offers ", cores, " slot(s)"));
  for (const char* sig : {"TERM", "KILL"}) {
    SCOPED_TRACE(sig);
    const std::string marker = sat::str_cat("--seed 4242", sig[0] == 'T' ? 1 : 2);
    const std::string script = sat::str_cat(
        "OMP_WAIT_POLICY=passive ", SAT_BINARY, " launch -n 2 -- train --model mlp --data synthetic --steps 100000000 "
        "--batch 8 --threads 1 --eval off ", marker, " >/dev/null 2>&1 & L=$!; "
        "for i in $(seq 100); do [ $(pgrep -f -- '", marker, "' | wc -l) -ge 4 ] && break; sleep 0.2; done; "
        "echo started $(pgrep -f -- '", marker, "' | wc -l); kill -", sig, " $L; wait $L; "
        "for i in $(seq 100); do [ $(pgrep -f -- '", marker, "' | wc -l) -eq 0 ] && break; sleep 0.2; done; "
        "echo left $(pgrep -f -- '", marker, "' | wc -l)");
    const fs::path file = tmpdir("launch_signals") / sat::str_cat("run-", sig, ".sh");
    std::ofstream(file) << script << "\n";
    const CmdResult r = sat::test::run_command("bash " + file.string());
    EXPECT_NE(r.out.find("started 4"), std::string::npos) << r.out;  // launch, mpirun and 2 ranks
    EXPECT_NE(r.out.find("left 0"), std::string::npos) << r.out;
  }
}

// --threads 0 (the default) is the cores a rank may use: saturate launch -n 2 and plain
// mpirun -np 2 never run more threads than the host has cores (on a 2-core machine, 1
// thread per rank), and summary.json says what rank 0 ran with.
TEST(Cli, LaunchedRanksShareTheCoresByDefault) {
  const std::string mpi = mpirun();
  if (mpi.empty()) GTEST_SKIP() << "no mpirun";
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  if (cores < 2) GTEST_SKIP() << "one core: 2 ranks oversubscribe whatever the threads";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
  const std::string run = " train --model mlp --data synthetic --steps 2 --batch 8 --eval off --out ";
  const fs::path d = tmpdir("default_threads");
  const std::vector<std::pair<std::string, std::string>> launches = {
      {"launch", env + SAT_BINARY + " launch -n 2 --" + run + (d / "launch").string()},
      {"mpirun", env + mpi + " -np 2 " + SAT_BINARY + run + (d / "mpirun").string()},
      {"mpirun, OMP_NUM_THREADS unset, bound to nothing",
       "env -u OMP_NUM_THREADS " + env + mpi + " --bind-to none -np 2 " + SAT_BINARY + run + (d / "unbound").string()}};
  for (const auto& [name, cmd] : launches) {
    SCOPED_TRACE(name);
    const CmdResult r = sat::test::run_command(cmd);
    ASSERT_EQ(r.status, 0) << r.out;
    const fs::path out = d / (name == "launch" ? "launch" : name == "mpirun" ? "mpirun" : "unbound");
    std::ifstream sf(out / "summary.json");
    const int threads = nlohmann::json::parse(sf).at("threads").get<int>();
    EXPECT_GE(threads, 1);
    EXPECT_LE(2 * threads, cores) << "2 ranks x " << threads << " threads on " << cores << " cores";
  }
}

// saturate launch on hosts: --hosts and --hostfile go to mpirun as given (and show in the
// command launch prints), -n is bounded by their slots, and a spec mpirun could not take is
// one line naming the flag, status 2, before anything starts. The run takes about 2 s.
TEST(Cli, LaunchRunsOnTheHostsGiven) {
  if (mpirun().empty()) GTEST_SKIP() << "no mpirun";
  const fs::path d = tmpdir("launch_hosts");
  const std::string run = " -- train --model mlp --data synthetic --steps 2 --batch 8 --eval off --out ";
  const CmdResult r = saturate("launch -n 2 --hosts localhost:2" + run + (d / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("saturate: running mpirun -np 2 --host localhost:2 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 rank(s)"), std::string::npos) << r.out;
  std::ifstream sf(d / "run" / "summary.json");
  ASSERT_TRUE(sf) << r.out;
  EXPECT_EQ(nlohmann::json::parse(sf).at("steps").get<int>(), 2);

  std::ofstream(d / "hosts") << "# two slots here\nlocalhost slots=2  # this machine\n";
  std::ofstream(d / "bad") << "localhost slots=2\nnode2 slot=8\n";
  std::ofstream(d / "none") << "# no host\n\n";
  const std::string hosts = (d / "hosts").string(), bad = (d / "bad").string(), none = (d / "none").string();
  expect_user_error(saturate("launch -n 3 --hosts localhost:2" + run + "x"),
                    "-n 3: the hosts of --hosts localhost:2 offer 2 slot(s)");
  expect_user_error(saturate("launch -n 3 --hostfile " + hosts + run + "x"),
                    "-n 3: the hosts of --hostfile " + hosts + " offer 2 slot(s)");
  expect_user_error(saturate("launch -n 2 --hosts localhost:0" + run + "x"), "--hosts: 'localhost:0' is not HOST:SLOTS");
  expect_user_error(saturate("launch -n 2 --hosts a:1,,b:1" + run + "x"), "--hosts 'a:1,,b:1': '' is not HOST:SLOTS");
  expect_user_error(saturate("launch -n 2 --hosts localhost" + run + "x"), "--hosts: 'localhost' is not HOST:SLOTS");
  expect_user_error(saturate("launch -n 2 --hosts" + run + "x"), "--hosts: expected HOST:SLOTS");
  expect_user_error(saturate("launch -n 2 --hostfile " + bad + run + "x"),
                    "--hostfile " + bad + ": line 2: expected HOST [slots=N] [max_slots=N]");
  expect_user_error(saturate("launch -n 2 --hostfile " + none + run + "x"), "--hostfile " + none + ": names no host");
  expect_user_error(saturate("launch -n 2 --hostfile " + (d / "missing").string() + run + "x"),
                    "--hostfile: cannot read '" + (d / "missing").string() + "'");
  expect_user_error(saturate("launch -n 2 --hosts localhost:2 --hostfile " + hosts + run + "x"),
                    "--hosts and --hostfile: give one of them, not both");
  EXPECT_FALSE(fs::exists("x"));
}

// One rank failing its own setup (its flags, its data, its files) while the others succeed:
// the job's first collective is the verdict, so whichever rank fails, every rank prints the
// failing rank's message and the job exits 2 at once (no MPI_ERR_TRUNCATE, no wait for a
// watchdog). The bound only catches a hang: the job takes about 2 s.
TEST(Cli, OneRankFailingSetupStopsEveryRank) {
  const std::string mpi = mpirun();
  if (mpi.empty()) GTEST_SKIP() << "no mpirun";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SAT_COMM_TIMEOUT=60 ";
  const std::string bin = std::string(SAT_BINARY);
  fs::path d = tmpdir("one_rank_fails");
  const std::string run = " train --model mlp --data synthetic --steps 300 --batch 8 --threads 1 --eval off";
  struct Bad {
    std::string flags, message;
  };
  const std::vector<Bad> bads = {
      {" --data mnist:" + (d / "nonexistent").string(), "--data mnist:" + (d / "nonexistent").string()},
      {" --batch 0", "--batch: expected a micro-batch size"},
      {" --resume " + (d / "nonexistent").string(), "--resume: "},
      {" --model " + (d / "missing.json").string(), (d / "missing.json").string()},
      {" --no-such-flag", "--no-such-flag"},
  };
  int which = 0;
  for (int ranks : {2, 4})
    for (int failing = 0; failing < ranks; ++failing) {
      const Bad& bad = bads[size_t(which++) % bads.size()];
      SCOPED_TRACE(sat::str_cat(ranks, " ranks, rank ", failing, " fails with", bad.flags));
      std::string cmd = env + mpi + " --oversubscribe --bind-to none --tag-output";
      for (int r = 0; r < ranks; ++r) cmd += sat::str_cat(r ? " :" : "", " -np 1 ", bin, run, r == failing ? bad.flags : "");
      const auto t0 = std::chrono::steady_clock::now();
      const CmdResult res = sat::test::run_command(cmd);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(res.status, 2) << res.out;
      EXPECT_LT(seconds, 60) << "a hang";
      EXPECT_EQ(res.out.find("MPI_ERR"), std::string::npos) << res.out;
      EXPECT_EQ(res.out.find("did not complete"), std::string::npos) << res.out;
      for (int r = 0; r < ranks; ++r) {  // every rank's own line names the failing rank and its message
        const std::string tag = sat::str_cat("[1,", r, "]<stderr>:saturate: ");
        const std::string says = r == failing ? sat::str_cat("error on rank ", r, ": ")
                                              : sat::str_cat("rank ", r, " stops: error on rank ", failing, ": ");
        const size_t at = res.out.find(tag + says);
        ASSERT_NE(at, std::string::npos) << "rank " << r << " does not say '" << says << "':\n" << res.out;
        const std::string line = res.out.substr(at, res.out.find('\n', at) - at);
        EXPECT_NE(line.find(bad.message), std::string::npos) << line;
      }
    }
}

namespace {

// A safetensors file's tensors: name -> shape (its JSON header; __metadata__ left out).
std::map<std::string, std::vector<int64_t>> safetensors_shapes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  std::map<std::string, std::vector<int64_t>> out;
  const nlohmann::json j = nlohmann::json::parse(header);  // (items() of a temporary would dangle)
  for (auto& [name, t] : j.items())
    if (name != "__metadata__") out[name] = t["shape"].get<std::vector<int64_t>>();
  return out;
}

// The predicted bytes of the kind `what` ("activations") in saturate info's plan.
double info_plan_bytes(const std::string& args, const std::string& what) {
  CmdResult r = saturate("info " + args);
  EXPECT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.find("\n  " + what);
  if (at == std::string::npos) ADD_FAILURE() << "no '" << what << "' line in:\n" << r.out;
  return at == std::string::npos ? -1 : std::strtod(r.out.c_str() + r.out.find_first_of("0123456789", at), nullptr);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// Mistakes that are not the parser's: exactly one line, naming the flag or file.
void expect_one_line_error(const CmdResult& r, const std::string& must_mention) {
  expect_user_error(r, must_mention);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

}  // namespace

// The command `saturate plan` prints for its best layout runs as printed: planned for 4
// ranks of this machine, run through the shell with saturate and mpirun from PATH (and the
// run's length, its output directory and OpenMPI's consent to root added), it trains that
// layout: summary.json's ranks, layout and batch are the plan's. The search's best, and the
// best with tensor and pipeline parallelism fixed (their flags, the schedule's).
TEST(Cli, PlannedCommandRunsAsPrinted) {
  const std::string mpi = mpirun();
  if (mpi.empty()) GTEST_SKIP() << "no mpirun";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive "
                          "SAT_COMM_TIMEOUT=120 PATH=" + fs::path(SAT_BINARY).parent_path().string() + ":$PATH ";
  for (const std::string fixed : {"", " --layout tp=2,pp=2"}) {
    SCOPED_TRACE(fixed);
    fs::path d = tmpdir("plan_run");
    CmdResult plan = saturate("plan --model gpt-mini --gpus 4 --gpu this --global-batch 16 --top 3 --json " +
                              (d / "plan.json").string() + fixed);
    ASSERT_EQ(plan.status, 0) << plan.out;
    const size_t at = plan.out.find("\nrun: ");
    ASSERT_NE(at, std::string::npos) << plan.out;
    const std::string cmd = plan.out.substr(at + 6, plan.out.find('\n', at + 1) - at - 6);
    const nlohmann::json j = read_json_file(d / "plan.json");
    EXPECT_EQ(j.at("run"), cmd);
    const nlohmann::json& best = j.at("layouts")[0];  // every layout runs on the CPU: the best is the one to run
    EXPECT_TRUE(best.at("runnable").get<bool>());
    EXPECT_EQ(best.at("command"), cmd);
    EXPECT_NE(plan.out.find("\n #1: " + cmd + "\n"), std::string::npos) << plan.out;
    EXPECT_EQ(cmd.rfind("mpirun ", 0), 0u) << cmd;
    EXPECT_NE(cmd.find(" saturate train --model gpt-mini --data synthetic --device cpu "), std::string::npos) << cmd;
    const CmdResult run = sat::test::run_command(env + cmd + " --steps 2 --eval off --out " + (d / "run").string());
    ASSERT_EQ(run.status, 0) << cmd << "\n" << run.out;
    const nlohmann::json s = read_json_file(d / "run" / "summary.json");
    EXPECT_EQ(s.at("status"), "complete");
    EXPECT_EQ(s.at("steps"), 2);
    EXPECT_EQ(s.at("device"), "cpu");
    EXPECT_EQ(s.at("world_size"), 4);
    EXPECT_EQ(s.at("global_batch"), 16);
    for (const char* k : {"dp", "tp", "pp"}) EXPECT_EQ(s.at("layout").at(k), best.at(k)) << k;
    EXPECT_EQ(s.at("batch"), best.at("micro_batch"));
    EXPECT_EQ(s.at("accum"), best.at("accum"));
    EXPECT_EQ(s.at("zero"), best.at("zero"));
    EXPECT_EQ(s.at("recompute"), best.at("recompute"));
    EXPECT_EQ(s.at("sequence_parallel"), best.at("sequence_parallel"));
    if (best.at("pp") > 1) {
      EXPECT_EQ(s.at("pp_schedule"), best.at("schedule"));
      EXPECT_EQ(s.at("virtual_stages"), best.at("virtual_stages"));
    }
    if (!fixed.empty()) {
      EXPECT_EQ(s.at("layout").at("tp"), 2);
      EXPECT_EQ(s.at("layout").at("pp"), 2);
    }
  }
}

// plan on GPUs: the layouts train refuses there today (recomputation on the GPU engine) are
// marked `!` in their rows and said under the table; --runnable-only leaves them out of the
// search, counts them, and every layout it prints runs.
TEST(Cli, PlanMarksWhatTrainRefusesAndRunnableOnlyLeavesItOut) {
  fs::path d = tmpdir("plan_runnable");
  const std::string mini = "plan --model gpt-mini --gpus 8 --gpu a100-80gb --global-batch 64 --top 20 ";
  CmdResult all = saturate(mini + "--json " + (d / "all.json").string());
  ASSERT_EQ(all.status, 0) << all.out;
  EXPECT_NE(all.out.find(" ! saturate train refuses #"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find(" on cuda today: --recompute needs --device cpu for now"), std::string::npos) << all.out;
  const nlohmann::json a = read_json_file(d / "all.json");
  int refused = 0;
  for (const auto& l : a.at("layouts")) {
    refused += !l.at("runnable").get<bool>();
    EXPECT_EQ(l.at("runnable").get<bool>(), l.at("refusals").empty()) << l;
    // (zb-h1's and zb-v's split backward runs on the CPU only yet: refused on cuda too)
    EXPECT_EQ(l.at("runnable").get<bool>(),
              l.at("recompute") == "none" && l.at("schedule") != "zb-h1" && l.at("schedule") != "zb-v") << l;
    EXPECT_NE(all.out.find(l.at("command").get<std::string>()), std::string::npos) << l;
  }
  EXPECT_GT(refused, 0) << all.out;
  CmdResult only = saturate(mini + "--runnable-only --json " + (d / "only.json").string());
  ASSERT_EQ(only.status, 0) << only.out;
  EXPECT_NE(only.out.find("that saturate train refuses on cuda today (--runnable-only)"), std::string::npos)
      << only.out;
  EXPECT_EQ(only.out.find(" ! "), std::string::npos) << only.out;
  const nlohmann::json o = read_json_file(d / "only.json");
  EXPECT_TRUE(o.at("runnable_only").get<bool>());
  EXPECT_GT(o.at("not_runnable").get<int>(), 0);
  ASSERT_FALSE(o.at("layouts").empty());
  for (const auto& l : o.at("layouts")) {
    EXPECT_TRUE(l.at("runnable").get<bool>()) << l;
    EXPECT_TRUE(l.at("refusals").empty()) << l;
  }
  EXPECT_EQ(o.at("run"), o.at("layouts")[0].at("command"));
  expect_user_error(saturate(mini + "--runnable-only --layout recompute=full"), "--runnable-only");
}

// --seq-len T: gpt-mini learns on windows of 64 of its 128 positions, plans less
// activation memory for them, and its weights keep the full context's shapes (they load
// into a run without --seq-len).
TEST(Cli, SeqLenTrainsOnShorterWindows) {
  fs::path d = tmpdir("seqlen");
  CmdResult r = saturate("train --model gpt-mini --data synthetic --seq-len 64 --batch 4 --steps 24 --optimizer adamw "
                         "--lr 0.003 --threads 1 --eval off --out " + (d / "run").string() + " --save-weights " +
                         (d / "w64.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<double> loss;
  std::ifstream mf(d / "run" / "metrics.jsonl");
  for (std::string line; std::getline(mf, line);) loss.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  ASSERT_EQ(loss.size(), 24u);
  const double first = (loss[0] + loss[1] + loss[2]) / 3, last = (loss[21] + loss[22] + loss[23]) / 3;
  EXPECT_LT(last, first - 0.5) << "first steps " << first << ", last steps " << last;
  const double a64 = info_plan_bytes("--model gpt-mini --batch 4 --seq-len 64", "activations");
  const double a128 = info_plan_bytes("--model gpt-mini --batch 4", "activations");
  EXPECT_GT(a64, 0);
  EXPECT_LT(a64, 0.6 * a128) << "activations at T=64: " << a64 << ", at T=128: " << a128;
  const double s64 = info_plan_bytes("--model gpt-mini --batch 4 --seq-len 64", "saved for backward");
  EXPECT_LT(s64, 0.6 * info_plan_bytes("--model gpt-mini --batch 4", "saved for backward"));
  CmdResult full = saturate("train --model gpt-mini --data synthetic --batch 2 --steps 1 --threads 1 --eval off "
                            "--init-weights " + (d / "w64.safetensors").string() + " --save-weights " +
                            (d / "w128.safetensors").string());
  ASSERT_EQ(full.status, 0) << full.out;
  const auto shapes64 = safetensors_shapes(d / "w64.safetensors"), shapes128 = safetensors_shapes(d / "w128.safetensors");
  EXPECT_EQ(shapes64, shapes128);
  ASSERT_TRUE(shapes64.count("transformer.wpe.weight"));
  EXPECT_EQ(shapes64.at("transformer.wpe.weight"), (std::vector<int64_t>{128, 256}));
}

TEST(Cli, SeqLenMistakesAreRefused) {
  expect_user_error(saturate("train --model gpt-mini --data synthetic --steps 1 --seq-len 129"), "--seq-len");
  expect_user_error(saturate("train --model gpt-mini --data synthetic --steps 1 --seq-len 0"), "--seq-len");
  expect_user_error(saturate("train --model gpt-mini --data synthetic --steps 1 --seq-len x"), "--seq-len");
  expect_one_line_error(saturate("train --model mlp --data synthetic --steps 1 --seq-len 64"),
                        "--seq-len applies to the GPT models only");
  expect_one_line_error(saturate("tune --model convnet --data synthetic --seq-len 8"), "--seq-len");
  expect_one_line_error(saturate("info --model gpt-mini --seq-len 200"), "--seq-len: expected a window of 1 to 128");
  // Sequence parallelism splits the window, not the context.
  expect_one_line_error(saturate("info --model gpt-mini --tp 2 --sequence-parallel --seq-len 63"),
                        "sequence length 63 (--seq-len) does not divide by --tp 2");
  CmdResult ok = saturate("info --model gpt-mini --tp 2 --sequence-parallel --seq-len 64");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// A checkpoint of a --seq-len run: its weights load into a full-context run (--init-weights
// DIR), but resuming it at another window is refused (the data position would move).
TEST(Cli, SeqLenCheckpointsResumeOnlyAtTheirWindow) {
  fs::path d = tmpdir("seqlen_ckpt");
  const std::string run = "train --model gpt:layers=1,heads=2,width=32,context=64,vocab=128 --data synthetic --batch 8 "
                          "--threads 1 --eval off ";
  const std::string ck = (d / "ck").string();
  ASSERT_EQ(saturate(run + "--seq-len 16 --steps 2 --checkpoint-dir " + ck).status, 0);
  CmdResult full = saturate(run + "--steps 1 --init-weights " + ck);
  EXPECT_EQ(full.status, 0) << full.out;
  expect_user_error(saturate(run + "--steps 4 --checkpoint-dir " + ck + " --resume auto"),
                    "written with windows of 16 tokens (--seq-len), this run's are 64");
  expect_user_error(saturate(run + "--seq-len 32 --steps 4 --checkpoint-dir " + ck + " --resume auto"),
                    "written with windows of 16 tokens");
  CmdResult same = saturate(run + "--seq-len 16 --steps 4 --checkpoint-dir " + ck + " --resume auto");
  EXPECT_EQ(same.status, 0) << same.out;
}

// --resume goes on with the run it continues: a longer run of another layout is taken (and
// each change recorded in metrics.jsonl and summary.json); another optimizer setting,
// schedule, data or normalisation only when --resume-change names it, a run no longer than
// the checkpoint never. Each refusal names the setting and both values, status 2.
TEST(Cli, ResumeIsCheckedAgainstTheRunItContinues) {
  fs::path d = tmpdir("resume_policy");
  fs::create_directories(d / "idx");
  write_idx_dir(d / "idx", 128);
  const std::string ck = (d / "ck").string(), at = ck + "/step-00000010";
  const std::string run = "train --model mlp --data synthetic --batch 32 --threads 1 --eval off --lr 0.1 "
                          "--checkpoint-dir " + ck + " ";
  ASSERT_EQ(saturate(run + "--steps 10").status, 0);
  const std::string resume = run + "--steps 20 --resume auto ";
  for (const auto& [flags, words] : std::vector<std::pair<std::string, std::string>>{
           {"--lr 0.5", "was trained with --lr 0.1; this run has --lr 0.5 (add --resume-change lr to change it)"},
           {"--weight-decay 0.1", "was trained with --weight-decay 0.01; this run has --weight-decay 0.1 (add "
                                  "--resume-change weight_decay to change it)"},
           {"--schedule constant", "was trained with --schedule cosine; this run has --schedule constant (add --resume-change schedule"},
           {"--normalize 0.5,0.5", "was trained with --normalize pixels/255; this run has --normalize (pixels/255 - 0.5)/0.5 (add "
                                   "--resume-change normalize"},
           {"--data mnist:" + (d / "idx").string(), "was trained with --data synthetic train; this run has --data mnist train "
                                                    "(add --resume-change data"},
           {"--betas 0.8,0.999", "was trained with --betas,--eps 0.9,0.999,1e-08; this run has --betas,--eps "
                                 "0.8,0.999,1e-08 (add --resume-change betas to change it)"},
           {"--eps 1e-6", "was trained with --betas,--eps 0.9,0.999,1e-08; this run has --betas,--eps 0.9,0.999,1e-06 "
                          "(add --resume-change betas"},
           {"--clip-grad-norm 1", "was trained with --clip-grad-norm off; this run has --clip-grad-norm 1 (add "
                                  "--resume-change clip_grad_norm to change it)"},
           {"--min-lr 0.01", "was trained with --min-lr 0; this run has --min-lr 0.01 (add --resume-change min_lr"},
           {"--lr 0.5 --resume-change weight_decay", "was trained with --lr 0.1; this run has --lr 0.5"},
           {"--resume-change bogus", "--resume-change: 'bogus' is not a setting a resumed run may change"},
           {"--resume-change optimizer", "--resume-change: optimizer cannot change on resume"}})
    expect_user_error(saturate(resume + flags), flags.rfind("--resume-change", 0) == 0 ? words :
                      "--resume: the checkpoint " + at + " " + words);
  expect_user_error(saturate(run + "--steps 5 --resume auto"),
                    "--steps 5: the checkpoint " + at + " is at step 10 already; give more steps");
  expect_user_error(saturate(run + "--steps 10 --resume auto"), "is at step 10 already");
  expect_user_error(saturate(run + "--steps 20 --resume-change lr"), "holds another run's checkpoints (step-00000010)");
  expect_user_error(saturate("train --model mlp --data synthetic --steps 20 --resume-change lr"),
                    "--resume-change needs --resume");
  // Allowed: a longer run, another layout, and the learning rate and clipping named.
  const fs::path out = d / "out";
  CmdResult ok = saturate(resume + "--lr 0.05 --batch 16 --accum 2 --clip-grad-norm 1 --resume-change lr,clip_grad_norm "
                          "--out " + out.string());
  ASSERT_EQ(ok.status, 0) << ok.out;
  std::ifstream metrics(out / "metrics.jsonl");
  std::vector<nlohmann::json> events;
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("event")) events.push_back(j);
    steps += j.contains("step");
  }
  EXPECT_EQ(steps, 10);
  ASSERT_EQ(events.size(), 1u);
  const nlohmann::json want = {{"accum", {"1", "2"}}, {"batch", {"32", "16"}}, {"clip_grad_norm", {"off", "1"}},
                               {"lr", {"0.1", "0.05"}}, {"steps", {"10", "20"}}};
  EXPECT_EQ(events[0]["event"], "resume");
  EXPECT_EQ(events[0]["from"], at);
  EXPECT_EQ(events[0]["from_step"], 10);
  EXPECT_EQ(events[0]["changes"], want) << events[0].dump();
  const nlohmann::json s = read_json(out / "summary.json");
  EXPECT_EQ(s["resume"]["from"], at);
  EXPECT_EQ(s["resume"]["changes"], want) << s.dump();
}

// eval on the weights train saved gives train's final evaluation exactly (the same
// Trainer::evaluate, the same batch); predict's rows are that evaluation's samples.
TEST(Cli, EvalAndPredictMatchTrainsFinalEvaluation) {
  fs::path d = tmpdir("eval");
  const std::string w = (d / "mlp.safetensors").string();
  CmdResult t = saturate("train --model mlp --data synthetic --batch 32 --steps 20 --lr 0.05 --threads 1 --seed 3 "
                         "--out " + (d / "run").string() + " --save-weights " + w + " --checkpoint-dir " +
                         (d / "ckpt").string());
  ASSERT_EQ(t.status, 0) << t.out;
  const nlohmann::json s = read_json(d / "run" / "summary.json");
  for (const std::string& weights : {w, (d / "ckpt").string()}) {
    CmdResult e = saturate("eval --model mlp --data synthetic --seed 3 --batch 32 --threads 1 --init-weights " + weights +
                           " --json " + (d / "eval.json").string());
    ASSERT_EQ(e.status, 0) << e.out;
    EXPECT_NE(e.out.find("test loss"), std::string::npos) << e.out;
    const nlohmann::json j = read_json(d / "eval.json");
    EXPECT_EQ(j["test_loss"].get<double>(), s["test_loss"].get<double>()) << weights;
    EXPECT_EQ(j["test_accuracy"].get<double>(), s["test_accuracy"].get<double>()) << weights;
    EXPECT_EQ(j["samples"].get<int64_t>(), s["test_samples"].get<int64_t>()) << weights;
  }
  const int64_t n = s["test_samples"].get<int64_t>();
  CmdResult p = saturate("predict --model mlp --data synthetic --seed 3 --batch 32 --threads 1 --init-weights " + w +
                         " --out " + (d / "pred.csv").string());
  ASSERT_EQ(p.status, 0) << p.out;
  std::ifstream f(d / "pred.csv");
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "index,class,probability,label");
  int64_t rows = 0, correct = 0;
  while (std::getline(f, line)) {
    long long index = -1, cls = -1, label = -1;
    double prob = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "%lld,%lld,%lf,%lld", &index, &cls, &prob, &label), 4) << line;
    EXPECT_EQ(index, rows) << line;
    EXPECT_TRUE(cls >= 0 && cls < 10) << line;
    EXPECT_TRUE(label >= 0 && label < 10) << line;
    // The most likely of 10 classes has at least 1/10 of the probability.
    EXPECT_TRUE(prob >= 0.1 - 1e-9 && prob <= 1.0) << line;
    correct += cls == label;
    ++rows;
  }
  EXPECT_EQ(rows, n);
  // The classes are the argmax train's accuracy counted.
  EXPECT_EQ(double(correct) / double(n), s["test_accuracy"].get<double>());
}

// A GPT model's predict: the top-k next tokens after a prompt of token ids, from weights
// trained with a window shorter than the context.
TEST(Cli, PredictNextTokensAfterAPrompt) {
  fs::path d = tmpdir("prompt");
  const std::string gpt = "gpt:layers=1,heads=2,width=32,context=64,vocab=128";
  const std::string w = (d / "gpt.safetensors").string();
  CmdResult t = saturate("train --model " + gpt + " --data synthetic --seq-len 16 --batch 8 --steps 5 --threads 1 "
                         "--save-weights " + w + " --out " + (d / "run").string());
  ASSERT_EQ(t.status, 0) << t.out;
  CmdResult e = saturate("eval --model " + gpt + " --data synthetic --seq-len 16 --batch 8 --threads 1 --init-weights " +
                         w + " --json " + (d / "eval.json").string());
  ASSERT_EQ(e.status, 0) << e.out;
  const nlohmann::json s = read_json(d / "run" / "summary.json"), j = read_json(d / "eval.json");
  EXPECT_EQ(j["test_loss"].get<double>(), s["test_loss"].get<double>());
  EXPECT_FALSE(j.contains("test_accuracy"));
  // A language model's perplexity: e to the mean per-token cross-entropy.
  EXPECT_DOUBLE_EQ(j["test_perplexity"].get<double>(), std::exp(j["test_loss"].get<double>()));
  EXPECT_NE(e.out.find(", perplexity "), std::string::npos) << e.out;
  std::ofstream(d / "prompt.txt") << "5 17 3\n99 0";
  CmdResult p = saturate("predict --model " + gpt + " --init-weights " + w + " --prompt " + (d / "prompt.txt").string() +
                         " --top-k 5 --threads 1 --out " + (d / "next.csv").string());
  ASSERT_EQ(p.status, 0) << p.out;
  std::ifstream f(d / "next.csv");
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "rank,token,probability,logit");
  int rows = 0;
  double prev = 2, sum = 0;
  while (std::getline(f, line)) {
    int rank = 0, token = -1;
    double prob = -1, logit = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d,%d,%lf,%lf", &rank, &token, &prob, &logit), 4) << line;
    EXPECT_EQ(rank, ++rows);
    EXPECT_TRUE(token >= 0 && token < 128) << line;
    EXPECT_TRUE(prob > 0 && prob <= prev) << line;  // most likely first
    prev = prob;
    sum += prob;
  }
  EXPECT_EQ(rows, 5);
  EXPECT_LE(sum, 1.0 + 1e-9);
}

TEST(Cli, EvalAndPredictMistakes) {
  fs::path d = tmpdir("evalbad");
  const std::string w = (d / "mlp.safetensors").string(), cw = (d / "convnet.safetensors").string();
  ASSERT_EQ(saturate("train --model mlp --data synthetic --steps 1 --batch 4 --eval off --threads 1 --save-weights " + w).status, 0);
  ASSERT_EQ(saturate("train --model convnet --data synthetic --steps 1 --batch 4 --eval off --threads 1 --save-weights " + cw).status, 0);
  expect_user_error(saturate("eval --model mlp --data synthetic"), "--init-weights");
  expect_user_error(saturate("eval --model mlp --data synthetic --init-weights " + w + " --bogus 1"), "--bogus");
  expect_user_error(saturate("predict --model mlp --data synthetic --init-weights " + w), "--out");
  expect_one_line_error(saturate("eval --model mlp --init-weights " + w), "--data");
  expect_one_line_error(saturate("eval --model mlp --data synthetic --init-weights " + (d / "none").string()), "none");
  expect_one_line_error(saturate("eval --model mlp --data synthetic --init-weights " + cw), "convnet.safetensors");
  expect_one_line_error(saturate("eval --model mlp --data synthetic --init-weights " + w + " --json /proc/x.json"), "--json");
  expect_one_line_error(saturate("eval --model mlp --data synthetic --init-weights " + w + " --seq-len 4"), "--seq-len");
  expect_one_line_error(saturate("predict --model mlp --data synthetic --init-weights " + w + " --prompt x --out " +
                                 (d / "p.csv").string()), "--prompt");
  // A token file without a validation file has no test split.
  {
    std::ofstream tok(d / "train.bin", std::ios::binary);
    int32_t hdr[256] = {20240520, 1, 300};
    tok.write(reinterpret_cast<char*>(hdr), sizeof hdr);
    for (uint16_t i = 0; i < 300; ++i) tok.write(reinterpret_cast<char*>(&i), 2);
  }
  const std::string gpt = "gpt:layers=1,heads=2,width=32,context=16,vocab=512";
  const std::string gw = (d / "gpt.safetensors").string();
  ASSERT_EQ(saturate("train --model " + gpt + " --data tokens:" + (d / "train.bin").string() +
                     " --steps 1 --batch 2 --threads 1 --save-weights " + gw).status, 0);
  expect_one_line_error(saturate("eval --model " + gpt + " --data tokens:" + (d / "train.bin").string() +
                                 " --init-weights " + gw), "has no test split");
  const std::string out = " --out " + (d / "n.csv").string();
  expect_one_line_error(saturate("predict --model " + gpt + " --init-weights " + gw + out), "--prompt FILE is required");
  std::ofstream(d / "bad.txt") << "1 2 512";
  expect_one_line_error(saturate("predict --model " + gpt + " --init-weights " + gw + " --prompt " +
                                 (d / "bad.txt").string() + out), "bad.txt: token 3 is '512'");
  std::ofstream(d / "long.txt") << "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
  expect_one_line_error(saturate("predict --model " + gpt + " --init-weights " + gw + " --prompt " +
                                 (d / "long.txt").string() + out), "17 tokens, more than");
  EXPECT_FALSE(fs::exists(d / "n.csv"));
}

// A command that must end on its own: `timeout` turns a hang into status 124 (the bound
// only catches a hang).
CmdResult saturate_within(int seconds, const std::string& args) {
  return sat::test::run_command("timeout " + std::to_string(seconds) + " env OMP_WAIT_POLICY=passive " + SAT_BINARY +
                                " " + args);
}

// Every input read through core/io.h's InputFile: a FIFO without a writer (whose open
// would block forever), given as any kind of input, is refused at once naming the flag.
TEST(Cli, FifosGivenAsInputsAreRefusedAtOnce) {
  const fs::path d = tmpdir("fifo_inputs");
  const std::string f = (d / "f.json").string(), ck = (d / "ck").string();
  ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0);
  fs::create_directories(ck);
  ASSERT_EQ(::mkfifo((fs::path(ck) / "manifest.json").c_str(), 0600), 0);
  const std::string fifo = " is a FIFO, not a regular file";
  const std::string train = "train --model mlp --data synthetic --steps 1 --threads 1 --out " + (d / "o").string();
  expect_user_error(saturate_within(60, train + " --init-weights " + f), "--init-weights: " + f + fifo);
  expect_user_error(saturate_within(60, "eval --model mlp --data synthetic --init-weights " + f),
                    "--init-weights: " + f + fifo);
  expect_user_error(saturate_within(60, "plan --model gpt-mini --gpus 8 --global-batch 64 --gpu " + f), "--gpu: " + f + fifo);
  expect_user_error(saturate_within(60, "hardware --gpu " + f), "--gpu: " + f + fifo);
  expect_user_error(saturate_within(60, "plan --model gpt-mini --gpus 8 --global-batch 64 --gpu h100-sxm --calibrate " + f),
                    "--calibrate: " + f + fifo);
  expect_user_error(saturate_within(60, "info --model file:" + f), "--model file:" + f + ": " + f + fifo);
  expect_user_error(saturate_within(60, "train --model gpt-mini --steps 1 --data tokens:" + f), "--data: " + f + fifo);
  expect_user_error(saturate_within(60, train + " --init-weights " + ck), "checkpoint manifest: " + ck + "/manifest.json" + fifo);
  expect_user_error(saturate_within(60, train + " --resume " + ck), "manifest.json" + fifo);
}

// Sizes are checked against what this machine holds before anything is allocated: a graph
// of 10^8 layers (or 10^6, to plan), synthetic samples of 16 GiB; planning itself
// allocates no data and is linear in the layers (10000 of them plan in seconds; the bound
// only catches a hang).
TEST(Cli, SizesBeyondThisMachineAreRefusedBeforeAllocating) {
  const std::string gpt = "gpt:heads=4,width=64,context=32,vocab=256,layers=";
  expect_user_error(saturate_within(60, "info --model " + gpt + "100000000"), "--model " + gpt + "100000000: its graph");
  expect_user_error(saturate_within(60, "plan --gpus 8 --gpu h100-sxm --global-batch 64 --model " + gpt + "1000000"),
                    "more than half of the");
  // The search holds a graph per tensor-parallel size, micro-batch, ...: counted before the first.
  expect_user_error(saturate_within(60, "plan --gpus 8 --gpu h100-sxm --global-batch 64 --model " + gpt + "100000"),
                    "planning it searches");
  expect_user_error(saturate_within(60, "train --model mlp --steps 1 --data synthetic:1x65536x65536"),
                    "--data synthetic: a sample of [1, 65536, 65536]");
  const CmdResult deep = saturate_within(300, "info --model " + gpt + "10000");
  EXPECT_EQ(deep.status, 0) << deep.out;
  EXPECT_NE(deep.out.find("100004 in 10000 blocks"), std::string::npos) << deep.out;
}

// Leftovers of the probe: a mistyped command is named (with the nearest one); sizes that
// are not whole bytes, or not whole float32 elements, are refused, not rounded; bytes of
// the user's that would drive the terminal (escapes, invalid UTF-8) are printed as \xNN.
TEST(Cli, MistypedCommandsFractionalSizesAndRawBytes) {
  const CmdResult r = saturate("trian --model mlp");
  expect_user_error(r, "unknown command 'trian': expected one of launch, train, tune");
  EXPECT_NE(r.out.find("(did you mean 'train'?)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("A subcommand is required"), std::string::npos) << r.out;
  expect_user_error(saturate("zzzzzz"), "unknown command 'zzzzzz'");
  expect_user_error(saturate("tune --model mlp --data synthetic --memory-budget 0.5"), "--memory-budget");
  expect_user_error(saturate("tune --model mlp --data synthetic --memory-budget 64KiB"),
                    "--memory-budget: 64KiB is 65536 bytes, less than the 1048576 bytes");
  expect_user_error(saturate("plan --model gpt-mini --gpus 8 --global-batch 64 --memory-budget 1.5"), "--memory-budget");
  expect_user_error(saturate("bench comm --min-bytes 5"), "--min-bytes: expected a multiple of 4 bytes");
  expect_user_error(saturate("bench comm --max-bytes 4099"), "--max-bytes: expected a multiple of 4 bytes");
  expect_user_error(saturate("bench comm --min-bytes 4096 --max-bytes 1024"), "--min-bytes 4096 is more than --max-bytes 1024");
  const CmdResult raw = saturate("info --model \"$(printf 'gpt\\033[31m\\377\\303\\251')\"");
  expect_user_error(raw, "unknown model 'gpt\\x1B[31m\\xFF\xc3\xa9'");  // (é is UTF-8: kept)
  EXPECT_EQ(raw.out.find('\x1b'), std::string::npos) << raw.out;
  const fs::path d = tmpdir("raw_bytes");
  expect_user_error(saturate("info --model 'file:" + (d / "a\x07" "b.json").string() + "'"), "a\\x07b.json");
}

// --clip-grad-norm, --betas, --eps and --min-lr out of range: one line naming the flag, status
// 2, before anything runs (train and tune alike).
TEST(Cli, ClipBetasEpsAndMinLrAreRangeChecked) {
  const std::string run = "train --model mlp --data synthetic --steps 1 --threads 1 ";
  for (const auto& [flags, words] : std::vector<std::pair<std::string, std::string>>{
           {"--clip-grad-norm 0", "--clip-grad-norm: expected a norm > 0, got 0"},
           {"--clip-grad-norm -1", "--clip-grad-norm: expected a norm > 0, got -1"},
           {"--clip-grad-norm 1e-60", "--clip-grad-norm: expected a norm > 0"},
           {"--betas 0.9", "--betas: expected two numbers in [0, 1) separated by a comma (such as 0.9,0.95), got '0.9'"},
           {"--betas 0.9,1", "--betas: expected two numbers in [0, 1)"},
           {"--betas 0.9,x", "--betas: expected two numbers in [0, 1)"},
           {"--betas -0.1,0.9", "--betas: expected two numbers in [0, 1)"},
           {"--betas 0.9,0.99,0.9", "--betas: expected two numbers in [0, 1)"},
           {"--eps -1e-8", "--eps: expected a number >= 0, got -1e-08"},
           {"--optimizer sgd --betas 0.9,0.99", "--betas applies to --optimizer adamw, not sgd"},
           {"--optimizer sgd --eps 1e-6", "--eps applies to --optimizer adamw, not sgd"},
           {"--min-lr -1e-4", "--min-lr: expected a learning rate from 0 to --lr (0.001), got -0.0001"},
           {"--lr 0.01 --min-lr 0.1", "--min-lr: expected a learning rate from 0 to --lr (0.01), got 0.1"},
           {"--schedule constant --min-lr 1e-4", "--min-lr applies to --schedule cosine and step"}})
    expect_one_line_error(saturate(run + flags), words);
  expect_user_error(saturate(run + "--clip-grad-norm abc"), "--clip-grad-norm: expected a number, got 'abc'");
  expect_user_error(saturate(run + "--clip-grad-norm nan"), "--clip-grad-norm: expected a finite number");
  expect_user_error(saturate(run + "--eps inf"), "--eps: expected a finite number");
  expect_one_line_error(saturate("tune --model mlp --data synthetic --clip-grad-norm 0"), "--clip-grad-norm");
}

// --clip-grad-norm: every metrics.jsonl line carries the step's norm before clipping and
// whether it clipped; summary.json the bound, the steps clipped, AdamW's betas and eps and
// the schedule's --min-lr.
TEST(Cli, ClippingIsLoggedEveryStep) {
  const fs::path d = tmpdir("clip_metrics");
  CmdResult r = saturate("train --model mlp --data synthetic --batch 16 --steps 6 --threads 1 --eval off "
                         "--clip-grad-norm 0.05 --betas 0.8,0.95 --eps 1e-6 --min-lr 1e-4 --out " +
                         (d / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("grad norm "), std::string::npos) << r.out;
  std::ifstream metrics(d / "run" / "metrics.jsonl");
  int lines = 0, clipped = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("grad_norm") && j.contains("clipped")) << line;
    EXPECT_GT(j["grad_norm"].get<double>(), 0) << line;
    EXPECT_EQ(j["clipped"].get<bool>(), j["grad_norm"].get<double>() > 0.05) << line;
    clipped += j["clipped"].get<bool>();
  }
  EXPECT_EQ(lines, 6);
  const nlohmann::json s = read_json(d / "run" / "summary.json");
  EXPECT_FLOAT_EQ(s["optimizer"]["clip_grad_norm"].get<float>(), 0.05f);
  EXPECT_EQ(s["optimizer"]["clipped_steps"].get<int>(), clipped);
  EXPECT_GE(clipped, 1);
  EXPECT_FLOAT_EQ(s["optimizer"]["betas"][0].get<float>(), 0.8f);
  EXPECT_FLOAT_EQ(s["optimizer"]["betas"][1].get<float>(), 0.95f);
  EXPECT_FLOAT_EQ(s["optimizer"]["eps"].get<float>(), 1e-6f);
  EXPECT_FLOAT_EQ(s["schedule"]["min_lr"].get<float>(), 1e-4f);
}
