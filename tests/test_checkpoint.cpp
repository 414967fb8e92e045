// Checkpoints (train/checkpoint.h) through the real binary: resuming continues bit for bit
// (one process and dp 2 x pp 2; the loader mid-epoch; stopped by SIGTERM or killed after a
// checkpoint), another layout reshards within 1e-5, a crash while a checkpoint is written
// leaves the previous one complete, and damaged or foreign checkpoints are refused. A run
// owns its checkpoint directory (a second writer is refused, a dead owner's hold is taken
// over), an edited manifest is refused, and what a resumed run may change is decided per
// setting (train/resume_policy.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "mpi_job.h"
#include "run_command.h"
#include "train/checkpoint.h"
#include "train/dir_lock.h"
#include "train/resume_policy.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

#ifndef SAT_MPIEXEC
#define SAT_MPIEXEC "mpirun --oversubscribe"
#endif

namespace {

using Cmd = sat::test::CmdResult;

// `saturate ARGS` (np > 1: under mpirun), waited for.
Cmd run(const std::string& args, int np = 1) {
  std::string launcher;
  if (np > 1)
    launcher = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 300 " SAT_MPIEXEC " -np " +
               std::to_string(np) + " ";
  return sat::test::run_command("OMP_WAIT_POLICY=passive " + launcher + SAT_BINARY + " " + args);
}

// `saturate ARGS` as a child process of its own (its pid is saturate's), output to `log`.
pid_t spawn(const std::string& args, const fs::path& log) {
  const std::string cmd = "exec env OMP_WAIT_POLICY=passive " SAT_BINARY " " + args + " > " + log.string() + " 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

fs::path tmpdir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sat_ckpt_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<double> losses(const fs::path& out_dir) {
  std::vector<double> v;
  std::ifstream f(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find("\"loss\": ");
    if (at != std::string::npos) v.push_back(std::stod(line.substr(at + 8)));
  }
  return v;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

size_t lines_of(const fs::path& p) {
  std::ifstream f(p);
  size_t n = 0;
  for (std::string l; std::getline(f, l);) ++n;
  return n;
}

// Runs `flags` for `steps` steps straight (A) and with a checkpoint at `stop`, the run after
// it removed and resumed with `resume_flags` on `np2` ranks (B). Returns the losses of A's
// steps after `stop` and of B's, and whether the final weights are identical.
struct Pair {
  std::vector<double> straight, resumed;
  bool same_weights = false;
};
Pair straight_and_resumed(const std::string& name, const std::string& flags, int np, int steps, int stop,
                          const std::string& resume_flags = "", int np2 = 0) {
  const fs::path d = tmpdir(name);
  const std::string s = " --steps " + std::to_string(steps);
  Cmd a = run("train " + flags + s + " --out " + (d / "a").string() + " --save-weights " + (d / "a.st").string(), np);
  EXPECT_EQ(a.status, 0) << a.out;
  Cmd b = run("train " + flags + s + " --checkpoint-dir " + (d / "ck").string() + " --checkpoint-every " +
                  std::to_string(stop) + " --out " + (d / "b").string(),
              np);
  EXPECT_EQ(b.status, 0) << b.out;
  for (int k = stop + stop; k <= steps; k += stop) fs::remove_all(d / "ck" / sat::checkpoint_name(k));
  fs::remove_all(d / "ck" / sat::checkpoint_name(steps));
  Cmd c =
      run("train " + (resume_flags.empty() ? flags : resume_flags) + s + " --checkpoint-dir " + (d / "ck").string() +
              " --resume auto --out " + (d / "c").string() + " --save-weights " + (d / "c.st").string(),
          np2 ? np2 : np);
  EXPECT_EQ(c.status, 0) << c.out;
  Pair p;
  const auto la = losses(d / "a");
  if (la.size() == size_t(steps)) p.straight.assign(la.begin() + stop, la.end());
  p.resumed = losses(d / "c");
  p.same_weights = fs::exists(d / "a.st") && bytes_of(d / "a.st") == bytes_of(d / "c.st");
  fs::remove_all(d);
  return p;
}

const std::string kMlp = "--model mlp --data synthetic --batch 64 --threads 1 --eval off --optimizer adamw";
// 10000 samples: 39 steps of 256 per epoch, so step 20 is mid-epoch and 40 steps cross one.
const std::string kMlpEpochs = "--model mlp --data synthetic --batch 256 --threads 1 --eval off --optimizer adamw";
const std::string kGptPlain =
    "--model gpt:layers=2,heads=4,width=64,context=32,vocab=256 --data synthetic --threads 1 --eval off --optimizer "
    "adamw";
const std::string kGpt =
    "--model gpt:layers=2,heads=4,width=64,context=32,vocab=256,dropout=0.1 --data synthetic --threads 1 --eval off "
    "--optimizer adamw";

TEST(Checkpoint, ResumeIsBitExactForEachModel) {
  for (const auto& [name, flags] :
       std::vector<std::pair<std::string, std::string>>{{"mlp", kMlpEpochs},
                                                        {"convnet",
                                                         "--model convnet --data synthetic --batch 8 "
                                                         "--threads 1 --eval off --momentum 0.9"},
                                                        {"gpt", kGpt + " --batch 4"}}) {
    const Pair p = straight_and_resumed(name, flags, 1, 40, 20);
    ASSERT_EQ(p.straight.size(), 20u) << name;
    EXPECT_EQ(p.resumed, p.straight) << name;  // bit for bit
    EXPECT_TRUE(p.same_weights) << name;
  }
}

TEST(Checkpoint, ResumeIsBitExactForDataAndPipelineParallel) {
  const Pair p = straight_and_resumed("dp2pp2", kGpt + " --batch 2 --accum 2 --pp 2", 4, 40, 20);
  ASSERT_EQ(p.straight.size(), 20u);
  EXPECT_EQ(p.resumed, p.straight);
  EXPECT_TRUE(p.same_weights);
}

// Context parallelism: the first cp rank of the first replica writes (the parameters are
// whole on every cp rank), the manifest's layout names cp, and the resumed run follows.
TEST(Checkpoint, ResumeIsBitExactUnderContextParallelism) {
  const Pair p = straight_and_resumed("cp2", kGptPlain + " --batch 2 --cp 2", 2, 8, 4);
  ASSERT_EQ(p.straight.size(), 4u);
  EXPECT_EQ(p.resumed, p.straight);
  EXPECT_TRUE(p.same_weights);
}

// Under ZeRO each rank holds a shard of the optimizer state (stage 3: of the parameters
// too): the writer gathers them, and the resumed run shards them again, bit for bit.
TEST(Checkpoint, ResumeIsBitExactUnderZero) {
  for (int zero : {1, 3}) {
    const Pair p = straight_and_resumed("zero" + std::to_string(zero), kGptPlain + " --batch 2 --zero " +
                                        std::to_string(zero), 2, 24, 12);
    ASSERT_EQ(p.straight.size(), 12u) << zero;
    EXPECT_EQ(p.resumed, p.straight) << zero;
    EXPECT_TRUE(p.same_weights) << zero;
  }
}

// Under bf16 the layers read the parameters' bf16 copy (under ZeRO-3 each rank's shard of
// it): loading a checkpoint refreshes it from the loaded float32 master, bit for bit.
TEST(Checkpoint, ResumeIsBitExactInBf16) {
  for (int zero : {0, 3}) {
    const Pair p = straight_and_resumed("bf16zero" + std::to_string(zero),
                                        kGptPlain + " --batch 2 --precision bf16 --zero " + std::to_string(zero),
                                        zero ? 2 : 1, 24, 12);
    ASSERT_EQ(p.straight.size(), 12u) << zero;
    EXPECT_EQ(p.resumed, p.straight) << zero;
    EXPECT_TRUE(p.same_weights) << zero;
  }
}

// A checkpoint of dp 2 x tp 2 read by other layouts: the same global batch (8), so the same
// samples per step; the sums only change order.
TEST(Checkpoint, ReshardsAcrossLayouts) {
  // Without dropout: its masks are drawn per layout.
  const std::string from = kGptPlain + " --batch 2 --accum 2 --tp 2";
  for (const auto& [name, np, flags] :
       std::vector<std::tuple<std::string, int, std::string>>{{"pp2", 2, kGptPlain + " --batch 2 --accum 4 --pp 2"},
                                                              {"tp4", 4, kGptPlain + " --batch 2 --accum 4 --tp 4"},
                                                              {"zero3", 4, kGptPlain + " --batch 2 --zero 3"},
                                                              {"one", 1, kGptPlain + " --batch 2 --accum 4"}}) {
    const Pair p = straight_and_resumed("reshard_" + name, from, 4, 24, 12, flags, np);
    ASSERT_EQ(p.straight.size(), 12u) << name;
    ASSERT_EQ(p.resumed.size(), 12u) << name;
    for (size_t i = 0; i < 12; ++i)
      EXPECT_NEAR(p.resumed[i], p.straight[i], 1e-5 * std::abs(p.straight[i])) << name << " " << i;
  }
}

// SIGTERM mid-run: the step finishes, a checkpoint is written, the exit status says so
// (128 + 15); the same command with --resume auto then ends where the straight run does.
TEST(Checkpoint, SigtermStopsAfterACheckpointAndResumes) {
  const fs::path d = tmpdir("sigterm");
  const int steps = 300;
  const std::string flags = kMlp + " --steps " + std::to_string(steps) + " --checkpoint-dir " + (d / "ck").string();
  Cmd a = run("train " + kMlp + " --steps " + std::to_string(steps) + " --save-weights " + (d / "a.st").string());
  ASSERT_EQ(a.status, 0) << a.out;
  const pid_t pid = spawn("train " + flags + " --out " + (d / "b").string(), d / "b.log");
  const auto t0 = std::chrono::steady_clock::now();
  while (lines_of(d / "b" / "metrics.jsonl") < 30 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 128 + SIGTERM) << bytes_of(d / "b.log");
  const std::string ck = sat::newest_checkpoint((d / "ck").string());
  ASSERT_FALSE(ck.empty()) << bytes_of(d / "b.log");
  const int64_t stopped = sat::read_manifest(ck).step;
  EXPECT_GE(stopped, 30);
  EXPECT_LT(stopped, steps) << "the run ended before the signal: make it longer";
  EXPECT_EQ(losses(d / "b").size(), size_t(stopped));
  Cmd c =
      run("train " + flags + " --resume auto --out " + (d / "c").string() + " --save-weights " + (d / "c.st").string());
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(losses(d / "c").size(), size_t(steps - stopped));
  EXPECT_EQ(bytes_of(d / "a.st"), bytes_of(d / "c.st"));
  fs::remove_all(d);
}

// Ctrl-C once: like SIGTERM (a checkpoint, status 130); twice: at once, status 130.
TEST(Checkpoint, InterruptOnceStopsCleanlyTwiceAtOnce) {
  const fs::path d = tmpdir("sigint");
  for (int times : {1, 2}) {
    fs::remove_all(d / "ck");
    const pid_t pid = spawn(
        "train " + kMlp + " --steps 100000 --checkpoint-dir " + (d / "ck").string() + " --out " + (d / "o").string(),
        d / "run.log");
    const auto t0 = std::chrono::steady_clock::now();
    while (lines_of(d / "o" / "metrics.jsonl") < 10 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int i = 0; i < times; ++i) {
      if (i) std::this_thread::sleep_for(std::chrono::milliseconds(30));  // two signals, not one merged
      kill(pid, SIGINT);
    }
    EXPECT_EQ(wait_status(pid), 130) << bytes_of(d / "run.log");
    const std::string ck = sat::newest_checkpoint((d / "ck").string());
    if (times == 1) {
      ASSERT_FALSE(ck.empty()) << bytes_of(d / "run.log");
      EXPECT_EQ(size_t(sat::read_manifest(ck).step), losses(d / "o").size());
    } else {
      EXPECT_NE(bytes_of(d / "run.log").find("second interrupt"), std::string::npos) << bytes_of(d / "run.log");
    }
    fs::remove_all(d / "o");
  }
  fs::remove_all(d);
}

// SIGKILL after the step-20 checkpoint: nothing is written at the kill, the resumed run ends
// bit for bit where the straight one does.
TEST(Checkpoint, SigkillAfterACheckpointResumesExactly) {
  const fs::path d = tmpdir("sigkill");
  const std::string flags = kMlp + " --steps 200 --checkpoint-every 20 --checkpoint-dir " + (d / "ck").string();
  Cmd a = run("train " + kMlp + " --steps 200 --save-weights " + (d / "a.st").string());
  ASSERT_EQ(a.status, 0) << a.out;
  const pid_t pid = spawn("train " + flags, d / "b.log");
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(d / "ck" / sat::checkpoint_name(20)) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_status(pid), 128 + SIGKILL);
  const std::string ck = sat::newest_checkpoint((d / "ck").string());
  ASSERT_FALSE(ck.empty());
  EXPECT_LT(sat::read_manifest(ck).step, 200) << "the run ended before the kill: make it longer";
  Cmd c = run("train " + flags + " --resume auto --save-weights " + (d / "c.st").string());
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(bytes_of(d / "a.st"), bytes_of(d / "c.st"));
  fs::remove_all(d);
}

// SIGKILL at random moments of a run that writes a checkpoint every step (so most kills land
// inside one): afterwards the newest complete checkpoint verifies and resumes, every time.
TEST(Checkpoint, KilledWhileWritingLeavesThePreviousComplete) {
  const fs::path d = tmpdir("crash");
  // A checkpoint being written (not the directory's lock file, which a killed run leaves too).
  auto temporary = [](const fs::path& p) { return sat::checkpoint_step_of(p.filename().string(), true) >= 0; };
  std::mt19937 rng(1234);
  int inside = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const std::string flags =
        kMlp + " --steps 100000 --checkpoint-every 1 --keep 2 --checkpoint-dir " + (d / "ck").string();
    std::vector<fs::path> stale;  // the last trial's: a new writer must be seen, not them
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d / "ck", ec))
      if (temporary(e.path())) stale.push_back(e.path());
    const auto stale_time = fs::file_time_type::clock::now();
    const pid_t pid = spawn("train " + flags + (trial ? " --resume auto" : ""), d / "run.log");
    // Wait until a checkpoint is being written (its temporary directory exists), then kill
    // at a random moment of the writing: before, between or after its files, the manifest,
    // the rename.
    const auto t0 = std::chrono::steady_clock::now();
    auto writing = [&] {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(d / "ck", ec))
        if (temporary(e.path()) &&
            (std::find(stale.begin(), stale.end(), e.path()) == stale.end() || e.last_write_time(ec) > stale_time))
          return true;
      return false;
    };
    while ((sat::newest_checkpoint((d / "ck").string()).empty() || !writing()) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    kill(pid, SIGKILL);
    wait_status(pid);
    for (const auto& e : fs::directory_iterator(d / "ck"))
      if (temporary(e.path())) ++inside;  // killed inside a checkpoint
    const std::string ck = sat::newest_checkpoint((d / "ck").string());
    ASSERT_FALSE(ck.empty()) << "trial " << trial << "\n" << bytes_of(d / "run.log");
    EXPECT_NO_THROW(sat::verify_checkpoint(ck, sat::read_manifest(ck))) << "trial " << trial;
  }
  EXPECT_GE(inside, 10) << "too few kills landed inside a checkpoint to mean anything";
  // The last one resumes and trains two more steps.
  const std::string ck = sat::newest_checkpoint((d / "ck").string());
  const int64_t at = sat::read_manifest(ck).step;
  Cmd c = run("train " + kMlp + " --steps " + std::to_string(at + 2) + " --checkpoint-dir " + (d / "ck").string() +
              " --resume auto");
  EXPECT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("resuming from " + ck), std::string::npos) << c.out;
  for (const auto& e : fs::directory_iterator(d / "ck"))  // the dead writers' directories are gone
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
  EXPECT_LE(std::distance(fs::directory_iterator(d / "ck"), fs::directory_iterator()), 2);  // --keep 2
  std::printf("%d of 20 kills landed inside a checkpoint\n", inside);
  fs::remove_all(d);
}

// Under mpirun: SIGKILL one rank of a dp 2 job mid-run (the job ends, no rank hangs), and
// SIGTERM to mpirun (it passes the signal on: both ranks stop at the same step after a
// checkpoint); each time the same command with --resume auto ends bit for bit where the
// straight run does.
TEST(Checkpoint, KilledRankAndTerminatedJobResumeExactly) {
  const fs::path d = tmpdir("mpi_kill");
  const std::string base = kGptPlain + " --batch 4 --steps 1500";
  Cmd a = run("train " + base + " --save-weights " + (d / "a.st").string(), 2);
  ASSERT_EQ(a.status, 0) << a.out;
  const std::string flags = base + " --checkpoint-every 10 --checkpoint-dir " + (d / "ck").string();
  {  // SIGKILL rank 1 after the step-10 checkpoint
    sat::test::Job j = sat::test::start_job(2, "train " + flags, 120);
    const auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(d / "ck" / sat::checkpoint_name(10)) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const pid_t r1 = sat::test::find_rank(j, 1);
    ASSERT_GT(r1, 0);
    kill(r1, SIGKILL);
    const sat::test::JobEnd e = sat::test::wait_job(j);
    EXPECT_NE(e.status, 0) << e.out;
    EXPECT_LT(e.seconds, 100) << e.out;
    const std::string ck = sat::newest_checkpoint((d / "ck").string());
    ASSERT_FALSE(ck.empty());
    EXPECT_LT(sat::read_manifest(ck).step, 1500) << "the run ended before the kill: make it longer";
  }
  {  // SIGTERM to mpirun
    sat::test::Job j = sat::test::start_job(2, "train " + flags + " --resume auto --out " + (d / "b").string(), 120);
    const auto t0 = std::chrono::steady_clock::now();
    const size_t before = std::distance(fs::directory_iterator(d / "ck"), fs::directory_iterator());
    while (std::distance(fs::directory_iterator(d / "ck"), fs::directory_iterator()) <= long(before) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(std::system(("pkill -TERM -f '^[^ ]*(mpiexec|mpirun|orterun) .*" + (d / "ck").string() + "'").c_str()),
              0);
    const sat::test::JobEnd e = sat::test::wait_job(j);
    EXPECT_NE(e.status, 0) << e.out;
    EXPECT_NE(e.out.find("stopped by signal 15 after step"), std::string::npos) << e.out;
    const std::string ck = sat::newest_checkpoint((d / "ck").string());
    ASSERT_FALSE(ck.empty());
    EXPECT_LT(sat::read_manifest(ck).step, 1500) << "the run ended before the signal: make it longer";
  }
  {  // SIGUSR1 to mpirun (Slurm's warning): mpirun passes on the ranks' status, 128 + 10.
    // A run of its own, long enough that the signal always comes before its end.
    const std::string usr1 = kGptPlain + " --batch 4 --steps 1000000 --checkpoint-every 10 --checkpoint-dir " +
                             (d / "ck_usr1").string();
    sat::test::Job j = sat::test::start_job(2, "train " + usr1, 120);
    const auto t0 = std::chrono::steady_clock::now();
    while (sat::newest_checkpoint((d / "ck_usr1").string()).empty() &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(std::system(("pkill -USR1 -f '^[^ ]*(mpiexec|mpirun|orterun) .*" + (d / "ck_usr1").string() + "'").c_str()),
              0);
    const sat::test::JobEnd e = sat::test::wait_job(j);
    EXPECT_EQ(e.status, 138) << e.out;
    EXPECT_NE(e.out.find("stopped by signal 10 after step"), std::string::npos) << e.out;
  }
  Cmd c = run("train " + flags + " --resume auto --save-weights " + (d / "c.st").string(), 2);
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(bytes_of(d / "a.st"), bytes_of(d / "c.st"));
  fs::remove_all(d);
}

// --checkpoint-every-minutes by rank 0's clock, --keep, and the flags' refusals.
TEST(Checkpoint, EveryMinutesKeepAndFlagRefusals) {
  const fs::path d = tmpdir("minutes");
  // The checkpoints a run wrote into `dir`, by its output's lines.
  auto written_into = [](const Cmd& c, const fs::path& dir) {
    size_t n = 0;
    for (size_t at = c.out.find("checkpoint "); at != std::string::npos; at = c.out.find("checkpoint ", at + 1))
      n += c.out.compare(at, 11 + dir.string().size(), "checkpoint " + dir.string()) == 0;
    return n;
  };
  auto count = [](const fs::path& dir) {
    return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
  };
  // An interval shorter than any step (60 ns): a checkpoint after every step; --keep 3 leaves
  // the newest three.
  Cmd each = run("train " + kMlp + " --steps 5 --checkpoint-every-minutes 1e-9 --keep 3 --checkpoint-dir " +
                 (d / "each").string());
  ASSERT_EQ(each.status, 0) << each.out;
  EXPECT_EQ(written_into(each, d / "each"), 5u) << each.out;
  EXPECT_EQ(count(d / "each"), 3u);
  EXPECT_EQ(sat::read_manifest(sat::newest_checkpoint((d / "each").string())).step, 5);
  // 0.12 s apart, and the last: how many fit in the run is the machine's speed; --keep 3 leaves
  // the newest three of them.
  Cmd c = run("train " + kMlp + " --steps 150 --checkpoint-every-minutes 0.002 --keep 3 --checkpoint-dir " +
              (d / "ck").string());
  ASSERT_EQ(c.status, 0) << c.out;
  const size_t written = written_into(c, d / "ck");
  EXPECT_GE(written, 1u) << c.out;
  EXPECT_EQ(count(d / "ck"), std::min<size_t>(written, 3)) << c.out;
  EXPECT_FALSE(sat::newest_checkpoint((d / "ck").string()).empty());
  EXPECT_EQ(sat::read_manifest(sat::newest_checkpoint((d / "ck").string())).step, 150);
  for (const auto& [flags, words] : std::vector<std::pair<std::string, std::string>>{
           {"--checkpoint-every 5", "--checkpoint-dir"},
           {"--checkpoint-dir " + (d / "x").string() + " --checkpoint-every -1", "--checkpoint-every"},
           {"--checkpoint-dir " + (d / "x").string() + " --checkpoint-every-minutes -2", "--checkpoint-every-minutes"},
           {"--checkpoint-dir " + (d / "x").string() + " --keep -1", "--keep"},
           {"--resume auto", "--resume auto needs --checkpoint-dir"},
           {"--checkpoint-dir " + (d / "ck" / sat::checkpoint_name(150) / "manifest.json").string(),
            "not a directory"}}) {
    const Cmd r = run("train " + kMlp + " --steps 2 " + flags);
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << flags << "\n" << r.out;
  }
  fs::remove_all(d);
}

// Damaged or foreign checkpoints: one line naming the file and what is wrong, exit 2, and
// the checkpoint untouched.
TEST(Checkpoint, DamagedOrForeignCheckpointsAreRefused) {
  const fs::path d = tmpdir("refuse");
  const std::string flags = kMlp + " --checkpoint-every 2 --checkpoint-dir " + (d / "ck").string();
  ASSERT_EQ(run("train " + flags + " --steps 4").status, 0);
  const fs::path ck = d / "ck" / sat::checkpoint_name(4);
  const fs::path shard = ck / "rank-00000.safetensors";
  const std::string good = bytes_of(shard);
  auto refused = [&](const std::string& extra, const std::string& words) {
    const Cmd c = run("train " + flags + " --steps 6 --resume " + ck.string() + extra);
    EXPECT_EQ(c.status, 2) << c.out;
    EXPECT_NE(c.out.find(words), std::string::npos) << "expected '" << words << "' in:\n" << c.out;
    EXPECT_EQ(c.out.find("terminate called"), std::string::npos) << c.out;
  };
  {  // a flipped byte
    std::string bad = good;
    bad[bad.size() / 2] ^= 0x40;
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bad;
    refused("", "checksum mismatch");
    EXPECT_EQ(bytes_of(shard), bad);  // left as it was
  }
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 100);
  refused("", "truncated");
  fs::remove(shard);
  refused("", "missing");
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
  refused(" --model mlp:784-64-10", "a checkpoint of model mlp");
  refused(" --seed 3", "--seed");
  refused(" --batch 32", "global batch");
  refused(" --optimizer sgd", "--optimizer");
  {
    std::ofstream(ck / "manifest.json", std::ios::app) << "x";
    refused("", "manifest.json");
  }
  const Cmd none = run("train " + kMlp + " --resume " + (d / "nothing").string());
  EXPECT_EQ(none.status, 2);
  EXPECT_NE(none.out.find("--resume"), std::string::npos) << none.out;
  fs::remove_all(d);
}

// --init-weights DIR takes a checkpoint's parameters: saved again, they are the bytes the
// run that wrote it saved with --save-weights.
TEST(Checkpoint, InitWeightsFromACheckpointDirectory) {
  const fs::path d = tmpdir("init");
  ASSERT_EQ(run("train " + kMlp + " --steps 4 --checkpoint-dir " + (d / "ck").string() + " --save-weights " +
                (d / "a.st").string())
                .status,
            0);
  sat::ModelConfig mc = sat::model_config("mlp");
  sat::TrainConfig cfg;
  cfg.batch = 64, cfg.evaluate = false, cfg.optim.name = "adamw";
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  sat::Trainer t(mc, cfg, *data.train, nullptr);
  t.load_weights((d / "ck").string());
  t.save_weights((d / "b.st").string());
  EXPECT_EQ(bytes_of(d / "a.st"), bytes_of(d / "b.st"));
  fs::remove_all(d);
}

TEST(Checkpoint, ManifestRoundTripsAndNamesBadKeys) {
  sat::Manifest m;
  m.model = "mlp";
  m.parameters = 8;
  m.step = 3, m.total_steps = 9, m.epoch = 1, m.step_in_epoch = 0, m.global_batch = 8, m.micro_batch = 2, m.accum = 2;
  m.seed = 5, m.optimizer = "adamw", m.optimizer_steps = 3, m.slots = {"exp_avg", "exp_avg_sq"};
  m.layout.dp = 2, m.layout.world = 2;
  m.losses = {1.5, 1.25, 1.0};
  m.files["rank-00000.safetensors"] = {100, 42};
  m.tensors["param/w"] = {{2, 4},
                          "F32",
                          {{"rank-00000.safetensors", "param/w@tp0/2", 1, 2, 0, 1},
                           {"rank-00000.safetensors", "param/w@tp1/2", 1, 2, 1, 1}}};
  const sat::Manifest back = sat::parse_manifest(sat::manifest_json(m), "m.json");
  EXPECT_EQ(sat::manifest_json(back), sat::manifest_json(m));
  auto error_of = [](const std::string& text) {
    try {
      sat::parse_manifest(text, "m.json");
    } catch (const sat::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string j = sat::manifest_json(m);
  EXPECT_NE(error_of(j.substr(0, j.size() / 2)).find("not valid JSON"), std::string::npos);
  auto resealed = [](std::string t) {  // the checksum of the edited text: the edit itself is refused
    nlohmann::json e = nlohmann::json::parse(t);
    e["checksum"] = sat::manifest_checksum(t);
    return e.dump(1);
  };
  auto without = [&](const std::string& key) {
    std::string t = j;
    const auto at = t.find("\"" + key + "\"");
    t.replace(at, key.size() + 2, "\"x" + key + "\"");
    return resealed(t);
  };
  EXPECT_NE(error_of(without("step")).find("'step'"), std::string::npos);
  EXPECT_NE(error_of(without("dp")).find("'layout.dp'"), std::string::npos);
  std::string evil = j;
  const std::string name = "\"rank-00000.safetensors\": {";
  evil.replace(evil.find(name), name.size(), "\"../../etc/passwd\": {");
  EXPECT_NE(error_of(evil).find("edited or damaged"), std::string::npos) << error_of(evil);
  EXPECT_NE(error_of(resealed(evil)).find("not a plain file name"), std::string::npos) << error_of(resealed(evil));
  // The checksum covers the content, not its layout: the same manifest spelled compactly reads.
  EXPECT_NO_THROW(sat::parse_manifest(nlohmann::json::parse(j).dump(), "m.json"));
}

// The hold on a checkpoint directory: a second holder is refused with the owner's pid, host
// and start; a holder killed with SIGKILL holds nothing, and its hold is taken over; the
// file goes away with a holder that ends normally. Then the same through the binary: a
// second run on a running run's directory is refused at its start, with status 2.
TEST(Checkpoint, ARunOwnsItsCheckpointDirectory) {
  const fs::path d = tmpdir("lock");
  const std::string dir = (d / "ck").string(), lock = sat::dir_lock_path(dir);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    try {
      sat::DirLock hold(dir, "--checkpoint-dir");
      const char c = 1;
      if (write(ready[1], &c, 1) == 1) pause();
    } catch (...) {
    }
    _exit(1);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  try {
    sat::DirLock second(dir, "--checkpoint-dir");
    ADD_FAILURE() << "a second hold on " << dir << " was granted";
  } catch (const sat::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--checkpoint-dir: " + dir + " is in use by another run (pid " + std::to_string(child) +
                     " on host "), std::string::npos) << m;
    EXPECT_NE(m.find(" since "), std::string::npos) << m;
    EXPECT_NE(m.find("): give another directory, or wait for it to end"), std::string::npos) << m;
  }
  kill(child, SIGKILL);
  EXPECT_EQ(wait_status(child), 128 + SIGKILL);
  EXPECT_TRUE(fs::exists(lock));  // the dead owner's file is left...
  {
    sat::DirLock taken(dir, "--checkpoint-dir");  // ...but not its hold
    EXPECT_NE(bytes_of(lock).find("pid " + std::to_string(getpid()) + " on host "), std::string::npos) << bytes_of(lock);
  }
  EXPECT_FALSE(fs::exists(lock));

  // Two runs: the first holds the directory while it trains, the second is refused before
  // it trains; with the first killed, the directory is free again.
  const std::string flags = kMlp + " --checkpoint-every 25 --keep 3 --checkpoint-dir " + (d / "ck2").string();
  const pid_t first = spawn("train " + flags + " --steps 1000000", d / "first.log");
  const std::string lock2 = sat::dir_lock_path((d / "ck2").string());
  const auto t0 = std::chrono::steady_clock::now();
  while (bytes_of(lock2).find("pid ") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const Cmd second = run("train " + flags + " --steps 100 --out " + (d / "second").string());
  EXPECT_EQ(second.status, 2) << second.out;
  EXPECT_NE(second.out.find("--checkpoint-dir: " + (d / "ck2").string() + " is in use by another run (pid " +
                            std::to_string(first) + " on host "), std::string::npos) << second.out;
  EXPECT_EQ(second.out.find("terminate called"), std::string::npos) << second.out;
  EXPECT_FALSE(fs::exists(d / "second" / "metrics.jsonl"));  // refused before training
  kill(first, SIGKILL);
  EXPECT_EQ(wait_status(first), 128 + SIGKILL);
  const std::string newest = sat::newest_checkpoint((d / "ck2").string());
  const int64_t at = newest.empty() ? 0 : sat::read_manifest(newest).step;
  const Cmd after = run("train " + flags + " --steps " + std::to_string(at + 2) + " --resume auto");
  EXPECT_EQ(after.status, 0) << after.out;
  EXPECT_FALSE(fs::exists(lock2));
  fs::remove_all(d);
}

namespace {

// A manifest's text changed by `edit`; with `reseal`, given the checksum of its new content
// (as a forger who knows the format would).
std::string edited(const std::string& text, const std::function<void(nlohmann::json&)>& edit, bool reseal) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  if (reseal) j["checksum"] = sat::manifest_checksum(j.dump());
  return j.dump(1);
}

}  // namespace

// A manifest edited by hand is refused for its checksum; one edited and given a matching
// checksum is refused for the fields that no longer agree (the losses are one per step, the
// optimizer counts one update per step, the data position is the step's, the settings are
// the header's); restored, it resumes.
TEST(Checkpoint, EditedManifestsAreRefused) {
  const fs::path d = tmpdir("edited");
  const std::string flags = kMlpEpochs + " --checkpoint-dir " + (d / "ck").string();  // 39 steps per epoch
  ASSERT_EQ(run("train " + flags + " --steps 10").status, 0);
  const fs::path manifest = d / "ck" / sat::checkpoint_name(10) / "manifest.json";
  const std::string good = bytes_of(manifest);
  auto refused = [&](const std::string& text, const std::string& words) {
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
    const Cmd c = run("train " + flags + " --steps 20 --resume " + manifest.parent_path().string());
    EXPECT_EQ(c.status, 2) << c.out;
    EXPECT_NE(c.out.find(manifest.string() + ": the manifest has "), std::string::npos) << c.out;
    EXPECT_NE(c.out.find(words), std::string::npos) << "expected '" << words << "' in:\n" << c.out;
  };
  using J = nlohmann::json;
  refused(edited(good, [](J& j) { j["step"] = 15; }, false), "edited or damaged (its checksum does not match");
  refused(edited(good, [](J& j) { j["epoch"] = 1; }, false), "edited or damaged (its checksum does not match");
  refused(edited(good, [](J& j) { j["losses"][3] = 0.5; }, false), "edited or damaged (its checksum does not match");
  refused(edited(good, [](J& j) { j.erase("checksum"); }, false), "has no checksum");
  refused(edited(good, [](J& j) { j["step"] = 15; }, true), "'losses' holds 10 values, one per step, but 'step' is 15");
  refused(edited(good, [](J& j) { j["optimizer"]["steps"] = 5; }, true), "'optimizer.steps' is 5");
  refused(edited(good, [](J& j) { j["losses"].push_back(1.0); }, true), "'losses' holds 11 values");
  refused(edited(good, [](J& j) { j["epoch"] = 3; }, true), "epoch 3, step 10 of it, does not follow from step 10");
  // A position consistent in itself (4 + 1 x 6 = 10), but not this data's (39 steps per epoch).
  refused(edited(good, [](J& j) { j["epoch"] = 1, j["step_in_epoch"] = 4; }, true),
          "is not where step 10 is at 39 steps per epoch");
  refused(edited(good, [](J& j) { j["settings"]["seed"] = "7"; }, true), "'settings.seed' is 7");
  refused(edited(good, [](J& j) { j["global_batch"] = 128; }, true), "'global_batch' 128 is not micro_batch x accum x dp");
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << good;
  const Cmd c = run("train " + flags + " --steps 12 --resume " + manifest.parent_path().string());
  EXPECT_EQ(c.status, 0) << c.out;
  fs::remove_all(d);
}

// The per-setting policy on two records (the CLI's refusals and records: test_cli).
TEST(Checkpoint, ResumePolicyNamesTheSettingAndBothValues) {
  const sat::Settings was = sat::settings_of("lr=0.1;steps=10;tp=1;optimizer=adamw;shuffle=1;global_batch=64");
  EXPECT_EQ(was.at("lr"), "0.1");
  EXPECT_EQ(was.size(), 6u);
  auto refusal = [&](const sat::Settings& now, const std::set<std::string>& allowed) {
    try {
      sat::resume_changes(was, now, allowed, "ck/step-00000010");
    } catch (const sat::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  sat::Settings now = was;
  now["lr"] = "0.5";
  EXPECT_EQ(refusal(now, {}), "--resume: the checkpoint ck/step-00000010 was trained with --lr 0.1; this run has --lr "
                              "0.5 (add --resume-change lr to change it)");
  now["steps"] = "40", now["tp"] = "2";  // the run's length and layout may change
  const auto changes = sat::resume_changes(was, now, {"lr"}, "ck");
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "lr");
  EXPECT_EQ(changes[0].from, "0.1");
  EXPECT_EQ(changes[0].to, "0.5");
  now = was;
  now["shuffle"] = "0";
  EXPECT_NE(refusal(now, {}).find("--shuffle on; this run has --shuffle off (add --resume-change shuffle"),
            std::string::npos);
  now = was;
  now["optimizer"] = "sgd";
  EXPECT_NE(refusal(now, {"lr"}).find("--optimizer adamw; this run has --optimizer sgd (the optimizer's state"),
            std::string::npos);
  now = was;
  now["global_batch"] = "32";
  EXPECT_NE(refusal(now, {}).find("data position would not carry over"), std::string::npos);
  now = was;
  now["mystery"] = "1";
  EXPECT_NE(refusal(now, {}).find("records the setting 'mystery' as (not recorded); this run has 1"), std::string::npos);
  // A checkpoint written before --clip-grad-norm and --min-lr were recorded trained without them.
  now = was;
  now["clip_grad_norm"] = "off", now["min_lr"] = "0";
  EXPECT_EQ(refusal(now, {}), "accepted");
  now["clip_grad_norm"] = "1";
  EXPECT_EQ(refusal(now, {}), "--resume: the checkpoint ck/step-00000010 was trained with --clip-grad-norm off; this run "
                              "has --clip-grad-norm 1 (add --resume-change clip_grad_norm to change it)");
  EXPECT_EQ(refusal(now, {"clip_grad_norm"}), "accepted");
  EXPECT_EQ(sat::parse_resume_change("weight-decay,lr,data"), (std::set<std::string>{"data", "lr", "weight_decay"}));
  EXPECT_EQ(sat::parse_resume_change("train_samples,steps"), (std::set<std::string>{"data"}));
  for (const auto& [list, words] : std::vector<std::pair<std::string, std::string>>{
           {"bogus", "'bogus' is not a setting a resumed run may change"},
           {"lr,", "expected setting names separated by commas"},
           {"", "expected setting names"},
           {"optimizer", "optimizer cannot change on resume"},
           {"global_batch", "global_batch cannot change on resume"}}) {
    try {
      sat::parse_resume_change(list);
      ADD_FAILURE() << list << " accepted";
    } catch (const sat::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

}  // namespace
