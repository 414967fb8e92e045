// Choosing a layer's kernel by timing the candidates on the machine that runs, once per
// shape (as cuDNN's benchmark mode does), for layers with several implementations of one
// computation (Conv2d's im2col, oneDNN and Winograd paths; bf16 kernels may add theirs).
//
// A layer asks at setup time, before it declares its scratch (the choice decides the
// scratch, so the memory plan is the chosen kernel's, exactly):
//   choose_kernel(key, {"im2col", "onednn", ...}, make_runner)
// make_runner(name) builds one candidate (its own buffers, outside sat::alloc: they never
// count in a run's measured peak, and are freed before choose_kernel returns) and returns a
// function that runs it once (forward + backward). Each candidate runs once to warm up
// (oneDNN compiles its kernels then), then the candidates run in turn, up to kKernelReps
// rounds while the shape's time cap lasts (at least one); the lowest best time wins. One
// candidate: no measuring.
//
// The winner is kept for the process, and in a per-machine JSON file beside the tune cache:
// $XDG_CACHE_HOME/saturate/tune/kernels-<hash>.json (~/.cache without XDG_CACHE_HOME), the
// hash of the machine key (CPU model, its vector flags, OpenBLAS's and oneDNN's versions),
// which the file also holds; the thread count is part of each choice's key. The file is written atomically; a damaged one is
// ignored with a warning and rewritten.
//
// Ranks on one machine (data and tensor parallelism) take the same kernel for the same key:
// the process holds an exclusive lock (flock on the file's ".lock" beside it) from reading
// the file to writing its measurement, so the first rank to reach a key measures it (alone:
// no two saturate processes measure at once) and every later one reads its choice.
// SAT_KERNEL_CACHE=off keeps to the process (no file, no lock; ranks may then differ).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/layer.h"

namespace sat {

// What a choice depends on besides the machine: the layer kind, its shape (every parameter
// the kernels' speed depends on), the dtype they compute in and the thread count.
struct KernelKey {
  std::string kind;   // "Conv2d"
  std::string shape;  // "C64 H32 W32 O64 k3 s1 p1 g1 bias train"
  std::string dtype;  // "f32"
  int threads = 1;
  std::string str() const;
};

struct KernelChoice {
  std::string key;                                   // KernelKey::str()
  std::string chosen;
  std::vector<std::pair<std::string, double>> ms;    // per candidate, best ms (measured: this process or the file's)
  enum class Source { measured, cache, only } source = Source::measured;  // only: one candidate fitted
};
const char* kernel_source_name(KernelChoice::Source s);

constexpr int kKernelReps = 3;                 // timed runs per candidate, at most
constexpr double kKernelShapeSeconds = 1.0;    // the time cap per shape, warm-ups included (at least one timed round)

// The chosen candidate's name, one of `names` (not empty). make_runner is called only when
// measuring. A candidate that throws is left out (with a warning); all throwing: the first.
std::string choose_kernel(const KernelKey& key, const std::vector<std::string>& names,
                          const std::function<std::function<void()>(const std::string&)>& make_runner);

// Every choice this process made (one per key, in order), for --profile.
std::vector<KernelChoice> kernel_choices();
// --profile's account of them: per key the choice, where it came from and each candidate's ms.
std::string kernel_choices_table();
// The per-machine cache file (see above), and the machine key it belongs to.
std::string kernel_cache_file();
std::string kernel_machine_key();
// Forgets the choices of this process (tests: the next choice reads the file again).
void forget_kernel_choices();

// A runner for a layer already set up (s: its LayerSetup; float32 tensors): allocates its
// inputs, output, parameters, gradients and scratch (plain heap memory, filled with small
// values), and each call runs forward then, when s.training, backward.
std::function<void()> layer_runner(std::shared_ptr<Layer> layer, const LayerSetup& s);

}  // namespace sat
