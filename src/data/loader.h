// BatchLoader: batches of a Dataset in a seeded order, prefetched by a background thread.
//
// Order of an epoch: with shuffle, the Fisher-Yates permutation drawn from
// Rng(mix_seed(seed, epoch)) (core/rng.h):
//     p = [0, 1, ..., N-1];  for i = N-1 down to 1: j = rng.below(i+1); swap(p[i], p[j])
// (a peer script can reproduce it exactly); without shuffle, file order 0..N-1.
// Batch k takes p[k*B .. k*B+B). With drop_last a partial final batch is dropped
// (training); without it (evaluation) the final batch is padded to B rows: padded x is
// zero and padded y is -1 (ignored by the loss), and Batch::valid says how many rows are
// real. Every batch therefore has exactly B rows, so the static plan sees one shape.
//
// Memory: a ring of `prefetch` batch buffers (x and y per slot), allocated through
// sat::Buffer so they are counted; buffer_bytes() predicts them exactly. A worker thread
// fills up to `prefetch` batches ahead; the batch handed out by next() stays valid (its
// slot is not refilled) until the following call to next() or start_epoch(). With
// prefetch = 0 there is no thread: next() reads the batch itself into a single buffer.
// The worker waits on condition variables (no busy-waiting); an exception thrown while
// reading (by Dataset::get) is rethrown by next() (after the batches read before it),
// and again by every later next(): a loader that failed stays failed. The destructor
// stops and joins the worker (it finishes at most the batch it is filling).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace sat {

struct Batch {
  Tensor x;            // [B, sample_shape...], f32 (images) or i32 (tokens)
  Tensor y;            // [B, label_shape...], i32; -1 in padded rows
  int64_t valid = 0;   // rows [0, valid) are real samples
  int64_t epoch = 0;   // epoch this batch belongs to
  int64_t index = 0;   // batch number within the epoch
};

class BatchLoader {
 public:
  BatchLoader(const Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool drop_last, int prefetch = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Bytes the ring allocates (counted through sat::Buffer) for these arguments.
  static size_t buffer_bytes(const Dataset& ds, int64_t batch, int prefetch);

  // Begins epoch `epoch` (its order and its first batches start being read). Any batch
  // handed out before is invalid afterwards. next() without start_epoch() starts epoch 0.
  void start_epoch(int64_t epoch);
  // The next batch of the current epoch; false when the epoch is over.
  bool next(Batch& out);

  int64_t batches_per_epoch() const { return batches_; }
  int64_t batch_size() const { return batch_; }
  int64_t epoch() const { return epoch_; }
  // The sample order of the current epoch (valid after start_epoch).
  const std::vector<int64_t>& order() const { return order_; }
  // The order of any epoch, computed without touching the loader's state.
  static std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

 private:
  struct Slot {
    Buffer x, y;
  };
  void fill(int64_t b, Slot& slot) const;  // reads batch b of the current order into slot
  void worker();
  Batch make_batch(int64_t b, Slot& slot) const;

  const Dataset& ds_;
  const int64_t batch_;
  const bool shuffle_, drop_last_;
  const uint64_t seed_;
  const int prefetch_;
  int64_t batches_ = 0;
  size_t x_row_bytes_ = 0;
  int64_t y_row_ = 0;
  Shape x_shape_, y_shape_;
  std::vector<Slot> slots_;  // max(prefetch, 1)

  // State shared with the worker, guarded by mu_. Batch b of the epoch lives in slot
  // b % slots. The worker may fill batch `filled_` once filled_ < released_ + slots
  // (the slot's previous occupant has been given back by the consumer).
  std::mutex mu_;
  std::condition_variable work_cv_;   // wakes the worker: new epoch, slot released, stop
  std::condition_variable ready_cv_;  // wakes the consumer: batch filled, worker idle, error
  std::vector<int64_t> order_;        // written only while the worker is idle
  int64_t epoch_ = 0;
  bool started_ = false;
  int64_t filled_ = 0;    // batches [0, filled_) are in the ring
  int64_t given_ = 0;     // batches handed out by next()
  int64_t released_ = 0;  // batches whose slot may be reused
  bool busy_ = false;     // the worker is filling a slot (outside the lock)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace sat
