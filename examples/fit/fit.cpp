// A small CNN fitted to Fashion-MNIST with saturate as a library; prints its test accuracy.
// Usage: fit_fashion_mnist [DATA] (a --data spec; default fashion-mnist).
#include <saturate/saturate.h>

#include <cstdio>

int main(int argc, char** argv) try {
  using namespace saturate;
  Model model = Sequential({1, 28, 28}, "small-cnn")
                    .add(Conv2d(16, 3, 1, 1)).add(ReLU()).add(MaxPool2d(2))
                    .add(Flatten()).add(Linear(128)).add(ReLU()).add(Linear(10))
                    .build();
  std::printf("%s\n", model.summary().c_str());
  std::fflush(stdout);
  Data data = load_data(argc > 1 ? argv[1] : "fashion-mnist", model);

  FitOptions options;  // AdamW 1e-3, warm-up then cosine decay: saturate's defaults
  options.batch_size = 64;
  options.epochs = 1;
  options.validation = data.test;
  options.on_epoch = [](const EpochLog& e) {
    std::printf("epoch %lld: loss %.4f, validation accuracy %.2f%%\n", (long long)e.epoch, e.loss, 100 * e.val_accuracy);
    return true;
  };
  History history = fit(model, data.train, options);

  Evaluation test = evaluate(model, *data.test);
  std::printf("test accuracy %.2f%% (loss %.4f, %lld samples) after %lld steps at %.0f samples/s\n",
              100 * test.accuracy, test.loss, (long long)test.samples, (long long)history.steps,
              history.samples_per_second);
  model.save("small-cnn.safetensors");
  return 0;
} catch (const saturate::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}
