// The flags train, tune and info share (cli/args.h): info takes train's layout and model
// flags, and with --device cuda prints what runs on GPUs (the support matrix,
// backend/support.h) after the plan.
#include <gtest/gtest.h>

#include <string>

#include "backend/support.h"
#include "run_command.h"

namespace {

sat::test::CmdResult saturate(const std::string& args) {
  return sat::test::run_command("OMP_WAIT_POLICY=passive " SAT_BINARY " " + args);
}

}  // namespace

TEST(CliArgs, InfoWithDeviceCudaPrintsTheSupportMatrix) {
  const auto plain = saturate("info --model mlp --batch 8");
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_EQ(plain.out.find("what runs where"), std::string::npos) << plain.out;
  for (const char* device : {"cpu", "auto"}) {
    const auto same = saturate(std::string("info --model mlp --batch 8 --device ") + device);
    ASSERT_EQ(same.status, 0) << same.out;
    EXPECT_EQ(same.out, plain.out) << device;
  }
  const auto cuda = saturate("info --model mlp --batch 8 --device cuda");
  ASSERT_EQ(cuda.status, 0) << cuda.out;
  // The GPU engine's plan (its library workspace, which the CPU's has not), then the matrix.
  EXPECT_NE(cuda.out.find("library workspace"), std::string::npos) << cuda.out;
  EXPECT_EQ(plain.out.find("library workspace"), std::string::npos) << plain.out;
  EXPECT_NE(cuda.out.find(sat::support_table()), std::string::npos) << cuda.out;  // the matrix, as the code states it
  const auto bad = saturate("info --model mlp --device gpu");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--device: expected cpu or cuda, got 'gpu'"), std::string::npos) << bad.out;
}

// info's layout flags are train's: the same names, ranges and messages.
TEST(CliArgs, InfoTakesTrainsLayoutFlags) {
  const auto r = saturate("info --model gpt-mini --batch 2 --tp 2 --pp 2 --accum 4 --pp-schedule interleaved "
                          "--virtual-stages 2 --recompute selective --ranks 2 --zero 1");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* want : {"tensor      2-way", "2 model chunks per stage", "stage 1", "recompute selective:", "ZeRO-1 saves"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  const auto split = saturate("info --model gpt-mini --pp 2 --pp-split 1,2");
  EXPECT_EQ(split.status, 2) << split.out;
  EXPECT_NE(split.out.find("--pp-split 1,2: expected 1 cut point(s)"), std::string::npos) << split.out;
  const auto batch = saturate("info --model mlp --batch auto");
  EXPECT_EQ(batch.status, 2) << batch.out;
  EXPECT_NE(batch.out.find("--batch: expected an integer from 1 to"), std::string::npos) << batch.out;
}

// --loader-workers and --prefetch: the plan's rings (exact: 4 + 4 slots of 64 samples of
// 784 floats and a label) and the loader's line; bad values name the flag.
TEST(CliArgs, LoaderFlagsShapeThePlan) {
  const auto r = saturate("info --model convnet --batch 64 --loader-workers 3 --prefetch 4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("loader: 3 workers per loader, 4 batches ahead: rings of 4 + 4 batches"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::to_string(8 * 64 * (784 * 4 + 4))), std::string::npos) << r.out;
  const auto sync = saturate("info --model convnet --batch 64 --loader-workers 0");
  ASSERT_EQ(sync.status, 0) << sync.out;
  EXPECT_NE(sync.out.find("loader: read by the step (no workers): rings of 2 + 2 batches"), std::string::npos)
      << sync.out;
  const auto bad = saturate("info --model mlp --loader-workers many");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--loader-workers: expected auto or a number of threads from 0 to 256, got 'many'"),
            std::string::npos) << bad.out;
  const auto deep = saturate("train --model mlp --data synthetic --steps 1 --prefetch 65");
  EXPECT_EQ(deep.status, 2) << deep.out;
  EXPECT_NE(deep.out.find("--prefetch: expected an integer from 0 to 64, got '65'"), std::string::npos) << deep.out;
}
