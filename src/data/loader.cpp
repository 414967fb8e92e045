#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/rng.h"

namespace sat {

namespace {
size_t slot_count(int slots) { return size_t(std::max(slots, 1)); }
}  // namespace

size_t BatchLoader::buffer_bytes(const Dataset& ds, int64_t batch, int slots) {
  const size_t per_slot = size_t(batch) * (ds.sample_bytes() + size_t(ds.label_numel()) * sizeof(int32_t));
  return slot_count(slots) * per_slot;
}

int auto_loader_workers(int cores, int ranks_on_host, int compute_threads) {
  const int free = std::max(cores, 1) / std::max(ranks_on_host, 1) - std::max(compute_threads, 0);
  return std::clamp(free, 1, 8);
}

int BatchLoader::ring_slots(int prefetch, int keep) { return std::max(prefetch, 1) + std::max(keep, 1) - 1; }

int BatchLoader::reading_workers(const LoaderOptions& opt) { return opt.prefetch > 0 ? std::max(opt.workers, 0) : 0; }

size_t BatchLoader::worker_host_bytes(const Dataset& ds, const LoaderOptions& opt) {
  return size_t(std::max(reading_workers(opt), 1)) * ds.worker_scratch_bytes();
}

std::vector<int64_t> BatchLoader::epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), int64_t(0));
  if (shuffle && n > 1) {
    Rng rng(mix_seed(seed, uint64_t(epoch)));
    for (int64_t i = n - 1; i >= 1; --i) {
      int64_t j = int64_t(rng.below(uint64_t(i + 1)));
      std::swap(p[size_t(i)], p[size_t(j)]);
    }
  }
  return p;
}

int64_t BatchLoader::train_steps(int64_t n, int64_t batch, int64_t accum, int world, LastBatch last) {
  SAT_CHECK(batch >= 1 && accum >= 1 && world >= 1, "train_steps: batch ", batch, ", accum ", accum, ", world ",
            world, ": expected positive values");
  const int64_t g = batch * accum * int64_t(world);
  return last == LastBatch::pad ? (n + g - 1) / g : n / g;
}

int64_t BatchLoader::eval_batches(int64_t n, int64_t batch, int world) {
  SAT_CHECK(batch >= 1 && world >= 1, "eval_batches: batch ", batch, ", world ", world,
            ": expected positive values");
  const int64_t largest_shard = (n + world - 1) / world;
  return std::max<int64_t>((largest_shard + batch - 1) / batch, 1);
}

BatchLoader::BatchLoader(const Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool train,
                         const Sharding& shard, const LoaderOptions& opt)
    : ds_(ds), batch_(batch), shuffle_(shuffle), train_(train), seed_(seed), opt_(opt), shard_(shard) {
  SAT_CHECK(opt.keep >= 1, "internal error: a loader keeps at least the batch it handed out");
  SAT_CHECK(batch > 0, "batch size ", batch, " for ", ds.name(), ": expected a positive batch size");
  SAT_CHECK(opt.prefetch >= 0, "--prefetch ", opt.prefetch, ": expected a number of batches >= 0");
  SAT_CHECK(opt.workers >= 0, "--loader-workers ", opt.workers, ": expected a number of threads >= 0");
  SAT_CHECK(opt.rows_per_claim >= 0, "internal error: rows per claim ", opt.rows_per_claim);
  SAT_CHECK(shard.world >= 1, "data-parallel world size ", shard.world, ": expected at least 1 rank");
  SAT_CHECK(shard.rank >= 0 && shard.rank < shard.world, "data-parallel rank ", shard.rank,
            ": expected 0 <= rank < ", shard.world, " (the number of ranks)");
  SAT_CHECK(shard.accum >= 1, "--accum ", shard.accum, ": expected a positive number of micro-batches per step");
  const int64_t n = ds.size();
  SAT_CHECK(n > 0, ds.name(), " has no samples");
  if (train) {
    SAT_CHECK(shard.accum <= std::numeric_limits<int64_t>::max() / batch / shard.world,
              "global batch --batch x --accum x ranks = ", batch, " x ", shard.accum, " x ", shard.world,
              " is too large");
    const int64_t g = global_batch();
    batches_ = train_steps(n, batch, shard.accum, shard.world, shard.last) * shard.accum;
    SAT_CHECK(batches_ > 0, "--batch x --accum x ranks = ", batch, " x ", shard.accum, " x ", shard.world, " = ", g,
              " (global batch; batch size ", batch, ") exceeds the ", n, " samples of the training set ", ds.name(),
              ": dropping the partial global batch would leave no batch; expected a global batch <= ", n,
              " (or pad the last batch)");
  } else {
    const int64_t q = n / shard.world, rem = n % shard.world, r = shard.rank;
    shard_begin_ = r * q + std::min<int64_t>(r, rem);
    shard_size_ = q + (r < rem ? 1 : 0);
    batches_ = eval_batches(n, batch, shard.world);
  }
  x_row_bytes_ = ds.sample_bytes();
  y_row_ = ds.label_numel();
  std::vector<int64_t> xs{batch}, ys{batch};
  for (int64_t d : ds.sample_shape().vec()) xs.push_back(d);
  for (int64_t d : ds.label_shape().vec()) ys.push_back(d);
  x_shape_ = Shape(xs);
  y_shape_ = Shape(ys);
  for (int i = 0; i < ring_slots(opt.prefetch, opt.keep); ++i)
    slots_.push_back({Buffer(size_t(batch) * x_row_bytes_, "data loader batch (x)"),
                      Buffer(size_t(batch * y_row_) * sizeof(int32_t), "data loader batch (y)")});
  done_.assign(slots_.size(), 0);
  const int w = reading_workers(opt);
  // One worker reads whole batches; several split each batch into about 2 pieces each.
  chunk_ = opt.rows_per_claim > 0 ? std::min(opt.rows_per_claim, batch)
           : w <= 1               ? batch
                                  : std::max<int64_t>(1, (batch + 2 * w - 1) / (2 * w));
  try {
    for (int i = 0; i < w; ++i) threads_.emplace_back(&BatchLoader::worker, this);
  } catch (...) {
    stop_workers();
    throw;
  }
}

void BatchLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

BatchLoader::~BatchLoader() { stop_workers(); }

LoaderStats BatchLoader::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first) {
  std::vector<int64_t> order = epoch_order(ds_.size(), shuffle_, seed_, epoch);
  {
    std::unique_lock<std::mutex> lk(mu_);
    // The workers read order_ and write slots outside the lock: no new claims, and the
    // pieces being read finished first.
    pausing_ = true;
    ready_cv_.wait(lk, [&] { return reading_ == 0; });
    pausing_ = false;
    order_.swap(order);
    epoch_ = epoch;
    started_ = true;
    filled_ = given_ = released_ = claim_b_ = std::clamp<int64_t>(first, 0, batches_);
    claim_row_ = 0;
  }
  work_cv_.notify_all();
}

int64_t BatchLoader::position(int64_t b, int64_t row) const {
  if (train_) {
    // Micro-batch m of global batch k: positions k*G + (rank*K + m)*b + [0, b).
    const int64_t K = shard_.accum, k = b / K, m = b % K;
    const int64_t q = k * global_batch() + (int64_t(shard_.rank) * K + m) * batch_ + row;
    return q % ds_.size();  // q >= N only under pad: the epoch's first samples again
  }
  const int64_t i = b * batch_ + row;  // evaluation: within this rank's contiguous shard
  return i < shard_size_ ? shard_begin_ + i : -1;
}

int64_t BatchLoader::valid_rows(int64_t b) const {
  if (train_) return batch_;
  return std::clamp<int64_t>(shard_size_ - b * batch_, 0, batch_);
}

void BatchLoader::fill(int64_t b, Slot& slot, int64_t r0, int64_t r1, int64_t& at) const {
  uint8_t* x = slot.x.as<uint8_t>();
  int32_t* y = slot.y.as<int32_t>();
  for (int64_t r = r0; r < r1; ++r) {
    at = r;
    const int64_t k = position(b, r);
    uint8_t* xr = x + size_t(r) * x_row_bytes_;
    int32_t* yr = y + r * y_row_;
    if (k >= 0) {
      if (train_)
        ds_.get_train(order_[size_t(k)], epoch_, xr, yr);
      else
        ds_.get(order_[size_t(k)], xr, yr);
    } else {  // padding of an evaluation batch
      std::memset(xr, 0, x_row_bytes_);
      std::fill(yr, yr + y_row_, -1);
    }
  }
}

Batch BatchLoader::make_batch(int64_t b, Slot& slot) const {
  Batch out;
  out.x = Tensor(slot.x.data(), x_shape_, ds_.sample_dtype());
  out.y = Tensor(slot.y.data(), y_shape_, DType::i32);
  out.valid = valid_rows(b);
  out.epoch = epoch_;
  out.index = b;
  return out;
}

bool BatchLoader::claimable() const {
  return started_ && !pausing_ && !error_ && claim_b_ < batches_ && claim_b_ < released_ + int64_t(slots_.size());
}

// A piece read (or failed at row `at`): its rows counted, filled_ moved past every batch
// read whole; an error kept when it is the first in order so far. True when the consumer
// may be waiting for what changed.
bool BatchLoader::finish_piece(int64_t b, int64_t r0, int64_t r1, int64_t at, std::exception_ptr err) {
  --reading_;
  const int64_t nslots = int64_t(slots_.size());
  if (err) {
    if (!error_ || b < error_b_ || (b == error_b_ && at < error_row_)) error_ = err, error_b_ = b, error_row_ = at;
  } else {
    done_[size_t(b % nslots)] += r1 - r0;
  }
  // Batches before claim_b_ have had every piece claimed, and their slots are not reused
  // before the consumer has them (claim_b_ < released_ + slots <= filled_ + slots).
  const int64_t was = filled_;
  while (filled_ < claim_b_ && done_[size_t(filled_ % nslots)] == batch_) ++filled_;
  return filled_ > was || err || reading_ == 0;
}

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t nslots = int64_t(slots_.size());
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || claimable(); });
    if (stop_) return;
    const int64_t b = claim_b_, r0 = claim_row_, r1 = std::min(batch_, r0 + chunk_);
    if (r0 == 0) done_[size_t(b % nslots)] = 0;
    claim_row_ = r1;
    if (r1 == batch_) ++claim_b_, claim_row_ = 0;
    stats_.max_reading = std::max(stats_.max_reading, ++reading_);
    lk.unlock();
    std::exception_ptr err;
    int64_t at = r0;
    try {
      fill(b, slots_[size_t(b % nslots)], r0, r1, at);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (finish_piece(b, r0, r1, at, err)) {  // start_epoch waits for reading_ == 0: b is still this epoch's
      lk.unlock();
      ready_cv_.notify_all();
      lk.lock();
    }
  }
}

bool BatchLoader::next(Batch& out) {
  if (!started_) start_epoch(0);
  const int64_t nslots = int64_t(slots_.size());
  if (threads_.empty()) {  // synchronous: read the batch here
    if (given_ >= batches_) return false;
    Slot& s = slots_[size_t(given_ % nslots)];
    int64_t at = 0;
    fill(given_, s, 0, batch_, at);
    out = make_batch(given_, s);
    ++given_;
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  // Of the batches handed out so far, the last keep - 1 stay in use; the others' slots
  // may be refilled. The workers are woken after the lock is let go, unless this call has
  // to wait for them: a woken worker does not then block on the lock the consumer holds.
  const int64_t release = std::max<int64_t>(0, given_ - (opt_.keep - 1));
  bool wake = released_ < release;
  released_ = std::max(released_, release);
  const bool more = given_ < batches_;
  if (more && filled_ > given_) {
    ++stats_.ready;
  } else if (more) {
    ++stats_.waited;
    if (wake) work_cv_.notify_all(), wake = false;
    // After an error no piece is claimed: once none is being read, the first error in
    // order is known and every batch before it is in.
    ready_cv_.wait(lk, [&] { return filled_ > given_ || (error_ && reading_ == 0); });
    if (filled_ <= given_) std::rethrow_exception(error_);
  }
  if (more) {
    const int64_t b = given_++;
    out = make_batch(b, slots_[size_t(b % nslots)]);
  }
  lk.unlock();
  if (wake) work_cv_.notify_all();
  return more;
}

}  // namespace sat
