// BatchLoader: batches of a Dataset in a seeded order, prefetched by a background thread,
// optionally one rank's shard of a data-parallel run.
//
// Order of an epoch: with shuffle, the Fisher-Yates permutation drawn from
// Rng(mix_seed(seed, epoch)) (core/rng.h):
//     p = [0, 1, ..., N-1];  for i = N-1 down to 1: j = rng.below(i+1); swap(p[i], p[j])
// (a peer script can reproduce it exactly); without shuffle, file order 0..N-1. Every
// rank draws the same permutation (the seed does not depend on the rank).
//
// Training (train = true; the argument was called drop_last): micro-batch b = `batch`,
// Sharding{rank r, world w, accum K, last}; the global batch is G = w*K*b. Global batch k
// (optimizer step k of the epoch) covers permutation positions [k*G, (k+1)*G); rank r's
// micro-batch m (0 <= m < K) of it is positions [k*G + (r*K + m)*b, ... + b). Rank r hands
// out its micro-batches in the order (k, m), so Batch::index = k*K + m. Concatenating the
// ranks' K micro-batches rank-major gives exactly batch k of a one-process loader with
// batch G; with w = 1, K = 1 this is plain batch k = p[k*b .. k*b+b).
//   last = drop: floor(N/G) global batches; the last N mod G positions are not used.
//   last = pad:  ceil(N/G) global batches; the last one is completed with the epoch's first
//                samples again (position q >= N reads p[q mod N]), so every rank gets full
//                micro-batches of real samples.
// Every training batch has b real rows (valid == b). With drop and N < G there would be
// no batch at all: the constructor throws, naming G and N.
//
// Evaluation (train = false): the epoch's N samples are split into w contiguous shards
// (rank r gets N/w samples, plus one when r < N mod w) and each shard is batched by b;
// the final batch is padded to b rows: padded x is zero and padded y is -1 (ignored by
// the loss), and Batch::valid says how many rows are real. Every sample is evaluated
// exactly once across ranks, and every rank gets the same number of batches,
// eval_batches(N, b, w) (ranks with fewer real batches get batches with valid == 0, all
// y == -1), so collectives stay in step. Every batch therefore has exactly b rows, so
// the static plan sees one shape.
//
// Memory: a ring of `max(prefetch, 1) + keep - 1` batch buffers (x and y per slot; ring_slots()),
// allocated through sat::Buffer so they are counted; buffer_bytes() predicts them exactly
// (they hold one micro-batch of b rows each, whatever the sharding or the workers). The last
// `keep` batches handed out by next() stay valid (their slots are not refilled) until as
// many further calls to next() or start_epoch() (keep > 1: a pipeline stage holds several
// micro-batches in flight, and a layer's backward reads its input).
//
// Workers: a pool of W threads fills the ring ahead of the consumer. They claim the batches
// of the ring in order, `rows_per_claim` rows at a time (default: a batch split into about
// 2W pieces, so that W workers fill one batch together and a slow sample holds up only its
// piece; one worker claims whole batches), and each row lands in its fixed place: the
// batches are the same bytes whatever W, and next() hands them out in order. With W = 0 or
// prefetch = 0 there is no thread: next() reads the batch itself into the ring. The workers
// wait on condition variables (no busy-waiting). An exception thrown while reading (by
// Dataset::get) is rethrown by next() after every batch before it, and it is the one a
// synchronous read would have thrown (the first failing row in order: rows before it are
// all read first); every later next() throws it again: a loader that failed stays failed.
// start_epoch() stops new claims and waits for the pieces being read (the reading of an
// epoch begins there: nothing of it is read ahead of it); the destructor stops
// and joins every worker (each finishes at most the piece it is reading). Dataset::get and
// get_train must be thread-safe and reentrant (dataset.h); each worker may hold
// Dataset::worker_scratch_bytes() of host memory of its own (worker_host_bytes()).
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

// How a training epoch ends when N is not a multiple of the global batch (see above).
enum class LastBatch { drop, pad };

// This process's part of a data-parallel run. The defaults are a single process.
struct Sharding {
  int rank = 0;                      // 0 <= rank < world
  int world = 1;                     // number of ranks
  int64_t accum = 1;                 // K: micro-batches per optimizer step (training)
  LastBatch last = LastBatch::drop;  // training only; evaluation always pads with -1
};

// How the loader reads ahead (see above).
struct LoaderOptions {
  int prefetch = 2;            // batches read ahead of the consumer (0: read in next())
  int keep = 1;                // batches handed out that stay valid (>= 1)
  int workers = 1;             // reading threads (0: read in next())
  int64_t rows_per_claim = 0;  // rows a worker claims at once (0: automatic)
};

// What the consumer met, counted since the loader was made: next() calls that found their
// batch already read (ready) or had to wait for it (waited), and the most pieces read at
// once (concurrency: at most the workers).
struct LoaderStats {
  int64_t ready = 0, waited = 0;
  int max_reading = 0;
};

// --loader-workers auto: the cores a rank leaves free, from 1 to 8: cores / ranks_on_host
// minus the rank's compute threads (the CPU backend's OpenMP threads; a GPU run's host thread
// that drives the device). A CPU run computing on every core gets 1: one reader beside the
// compute (its threads would otherwise lose cores to the readers); a GPU rank gets its share
// of the host's cores but one, 8 at most (more with --loader-workers N).
int auto_loader_workers(int cores, int ranks_on_host, int compute_threads);
constexpr int kMaxLoaderWorkers = 256;

class BatchLoader {
 public:
  // `batch` is the micro-batch b; `train` selects the training order (true: global
  // batches, the tail dropped or padded per shard.last) or evaluation (false: contiguous
  // shards padded with -1).
  BatchLoader(const Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool train, const Sharding& shard,
              const LoaderOptions& opt);
  BatchLoader(const Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool train, int prefetch = 2,
              const Sharding& shard = {}, int keep = 1)
      : BatchLoader(ds, batch, shuffle, seed, train, shard, LoaderOptions{prefetch, keep, 1, 0}) {}
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Bytes the ring allocates (counted through sat::Buffer) for `slots` = ring_slots().
  static size_t buffer_bytes(const Dataset& ds, int64_t batch, int slots);
  // The ring's batch slots: max(prefetch, 1) + keep - 1.
  static int ring_slots(int prefetch, int keep);
  // The threads that read (W, or the consumer's own when it reads in next()) times
  // Dataset::worker_scratch_bytes(): host memory the dataset holds per reading thread, not
  // counted through sat::Buffer.
  static size_t worker_host_bytes(const Dataset& ds, const LoaderOptions& opt);
  // The workers that read ahead: opt.workers, 0 when prefetch = 0.
  static int reading_workers(const LoaderOptions& opt);

  // Begins epoch `epoch` (its order and its first batches start being read). Any batch
  // handed out before is invalid afterwards. next() without start_epoch() starts epoch 0.
  // first: the batch to begin at (resuming mid-epoch; batches before it are not read).
  void start_epoch(int64_t epoch, int64_t first = 0);
  // The next batch of the current epoch; false when the epoch is over.
  bool next(Batch& out);

  // Batches next() hands out per epoch on this rank: training steps_per_epoch()*K
  // micro-batches, evaluation eval_batches(N, b, w).
  int64_t batches_per_epoch() const { return batches_; }
  // Optimizer steps (global batches) per epoch; evaluation: batches_per_epoch().
  int64_t steps_per_epoch() const { return train_ ? batches_ / shard_.accum : batches_; }
  int64_t batch_size() const { return batch_; }
  int64_t global_batch() const { return batch_ * shard_.accum * shard_.world; }  // G (training)
  const Sharding& sharding() const { return shard_; }
  int64_t epoch() const { return epoch_; }
  int workers() const { return int(threads_.size()); }
  LoaderStats stats() const;
  // The sample order of the current epoch (valid after start_epoch).
  const std::vector<int64_t>& order() const { return order_; }
  // The order of any epoch, computed without touching the loader's state.
  static std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);
  // Global batches (optimizer steps) per training epoch of n samples; 0 under drop when
  // n < G (the constructor refuses that).
  static int64_t train_steps(int64_t n, int64_t batch, int64_t accum, int world, LastBatch last);
  // Evaluation batches every rank runs: ceil(ceil(n / world) / batch).
  static int64_t eval_batches(int64_t n, int64_t batch, int world);

 private:
  struct Slot {
    Buffer x, y;
  };
  // Permutation position of row `row` of this rank's batch b, or -1 for a padded row.
  int64_t position(int64_t b, int64_t row) const;
  int64_t valid_rows(int64_t b) const;
  // Reads rows [r0, r1) of batch b of the current order into slot; `at` follows the row read.
  void fill(int64_t b, Slot& slot, int64_t r0, int64_t r1, int64_t& at) const;
  void worker();
  void stop_workers();
  bool claimable() const;                                          // (mu_ held)
  bool finish_piece(int64_t b, int64_t r0, int64_t r1, int64_t at, std::exception_ptr err);  // (mu_ held)
  Batch make_batch(int64_t b, Slot& slot) const;

  const Dataset& ds_;
  const int64_t batch_;
  const bool shuffle_, train_;
  const uint64_t seed_;
  const LoaderOptions opt_;
  const Sharding shard_;
  int64_t batches_ = 0;
  int64_t shard_begin_ = 0, shard_size_ = 0;  // evaluation: this rank's positions
  int64_t chunk_ = 0;                         // rows per claim
  size_t x_row_bytes_ = 0;
  int64_t y_row_ = 0;
  Shape x_shape_, y_shape_;
  std::vector<Slot> slots_;  // ring_slots(prefetch, keep)

  // State shared with the workers, guarded by mu_. Batch b of the epoch lives in slot
  // b % slots. Workers claim rows [claim_row_, +chunk) of batch claim_b_ once
  // claim_b_ < released_ + slots (the slot's previous occupant has been given back by the
  // consumer); done_[slot] counts the rows of its batch read so far, and filled_ moves past
  // every batch whose rows are all read.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // wakes the workers: new epoch, slot released, stop
  std::condition_variable ready_cv_;  // wakes the consumer: batch filled, workers idle, error
  std::vector<int64_t> order_;        // written only while no worker reads
  int64_t epoch_ = 0;
  bool started_ = false;
  bool pausing_ = false;  // start_epoch is waiting for the pieces being read: no new claims
  int64_t filled_ = 0;    // batches [0, filled_) are in the ring
  int64_t given_ = 0;     // batches handed out by next()
  int64_t released_ = 0;  // batches whose slot may be reused
  int64_t claim_b_ = 0, claim_row_ = 0;  // the next piece to claim
  std::vector<int64_t> done_;            // per slot: rows of its batch read
  int reading_ = 0;                      // workers reading a piece (outside the lock)
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t error_b_ = 0, error_row_ = 0;  // where error_ was thrown (the first in order)
  LoaderStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace sat
