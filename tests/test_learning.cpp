// Learning on real data: one epoch on Fashion-MNIST (Debian's dataset-fashion-mnist,
// installed by scripts/test) must reach mlp >= 85% and convnet >= 88% test accuracy.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "train/trainer.h"

namespace {

double one_epoch(const std::string& model) {
  sat::cpu::set_num_threads(2);
  auto mc = sat::model_config(model);
  auto data = sat::open_dataset("fashion-mnist", sat::data_options_for(mc, 0));
  sat::TrainConfig cfg;
  cfg.batch = 64;
  cfg.epochs = 1;
  cfg.optim.name = "adamw";
  cfg.optim.lr = 1e-3f;
  cfg.progress = 0;
  sat::Trainer t(mc, cfg, *data.train, data.test.get());
  auto r = t.run();
  EXPECT_EQ(r.test->samples, 10000);
  std::printf("[ learning ] %-8s 1 epoch of Fashion-MNIST: test accuracy %.2f%%, test loss %.4f\n", model.c_str(),
              100 * r.test->accuracy, r.test->loss);
  return r.test->accuracy;
}

bool have_data() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

}  // namespace

TEST(Learning, MlpReaches85PercentInOneEpoch) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  EXPECT_GE(one_epoch("mlp"), 0.85);
}

TEST(Learning, ConvnetReaches88PercentInOneEpoch) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  EXPECT_GE(one_epoch("convnet"), 0.88);
}
