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

BatchLoader::BatchLoader(const Dataset& ds, int64_t batch, bool shuffle, uint64_t seed, bool train, int prefetch,
                         const Sharding& shard, int keep)
    : ds_(ds), batch_(batch), shuffle_(shuffle), train_(train), seed_(seed), prefetch_(prefetch), shard_(shard),
      keep_(keep) {
  SAT_CHECK(keep >= 1, "internal error: a loader keeps at least the batch it handed out");
  SAT_CHECK(batch > 0, "batch size ", batch, " for ", ds.name(), ": expected a positive batch size");
  SAT_CHECK(prefetch >= 0, "prefetch depth ", prefetch, ": expected >= 0");
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
  for (size_t i = 0; i < slot_count(std::max(prefetch, 1) + keep - 1); ++i)
    slots_.push_back({Buffer(size_t(batch) * x_row_bytes_, "data loader batch (x)"),
                      Buffer(size_t(batch * y_row_) * sizeof(int32_t), "data loader batch (y)")});
  if (prefetch_ > 0) thread_ = std::thread(&BatchLoader::worker, this);
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first) {
  std::vector<int64_t> order = epoch_order(ds_.size(), shuffle_, seed_, epoch);
  {
    std::unique_lock<std::mutex> lk(mu_);
    // The worker reads order_ and writes a slot outside the lock: let it finish first.
    ready_cv_.wait(lk, [&] { return !busy_; });
    order_.swap(order);
    epoch_ = epoch;
    started_ = true;
    filled_ = given_ = released_ = std::clamp<int64_t>(first, 0, batches_);
  }
  work_cv_.notify_one();
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

void BatchLoader::fill(int64_t b, Slot& slot) const {
  uint8_t* x = slot.x.as<uint8_t>();
  int32_t* y = slot.y.as<int32_t>();
  for (int64_t r = 0; r < batch_; ++r) {
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

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t nslots = int64_t(slots_.size());
  for (;;) {
    work_cv_.wait(lk, [&] {
      return stop_ || (started_ && !error_ && filled_ < batches_ && filled_ < released_ + nslots);
    });
    if (stop_) return;
    const int64_t b = filled_;
    busy_ = true;
    lk.unlock();
    std::exception_ptr err;
    try {
      fill(b, slots_[size_t(b % nslots)]);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    busy_ = false;
    if (err)
      error_ = err;
    else
      filled_ = b + 1;  // start_epoch waits for !busy_, so b still belongs to this epoch
    ready_cv_.notify_all();
  }
}

bool BatchLoader::next(Batch& out) {
  if (!started_) start_epoch(0);
  const int64_t nslots = int64_t(slots_.size());
  if (prefetch_ == 0) {  // synchronous: read the batch here
    if (given_ >= batches_) return false;
    Slot& s = slots_[size_t(given_ % nslots)];
    fill(given_, s);
    out = make_batch(given_, s);
    ++given_;
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  // Of the batches handed out so far, the last keep - 1 stay in use; the others' slots
  // may be refilled.
  const int64_t release = std::max<int64_t>(0, given_ - (keep_ - 1));
  if (released_ < release) {
    released_ = release;
    work_cv_.notify_one();
  }
  if (given_ >= batches_) return false;
  ready_cv_.wait(lk, [&] { return filled_ > given_ || error_; });
  if (filled_ <= given_) std::rethrow_exception(error_);
  const int64_t b = given_++;
  out = make_batch(b, slots_[size_t(b % nslots)]);
  return true;
}

}  // namespace sat
