// Context parallelism's attention (--cp C): causal self-attention over a sequence split
// across the C ranks of a cp group, computed as a ring of key/value blocks.
//
// Load balance: the sequence of T tokens is cut into 2C chunks of T / (2C); rank r holds
// chunk r and chunk 2C-1-r, in that order (its local rows 0..len-1 and len..2 len-1). Under
// the causal mask the early chunks see few keys and the late ones many; pairing chunk r with
// its mirror gives every rank the same work.
//
// Forward: each rank starts with its own key/value block; in C steps it attends its queries
// to the block it holds (its own chunks' positions against the block's: a chunk pair is
// fully visible, causal on the diagonal, or skipped when the keys lie after the queries),
// merges the block's partial result into its output with the online softmax (running
// log-sum-exp per query row), and passes the block on to rank r+1 (receiving r-1's).
// Backward runs the ring the other way: the key/value block travels to rank r-1 together
// with the gradients dK, dV accumulated for it so far; every rank adds its queries'
// contribution, and after C steps one more shift brings each block's dK, dV home.
// Softmax probabilities are recomputed from q, k and the saved log-sum-exp (nothing T x T
// is kept), as flash attention does.
//
// Grouped-query attention: nh query heads over nkv key/value heads (query head h reads
// key/value head h / (nh / nkv)); nkv == nh is multi-head attention.
//
// Tensors of one rank (row-major, f32, contiguous):
//   q, out, dout, dq   [B, rows, nh * hs]      rows = 2 * len: the rank's two chunks
//   k, v, dk, dv       [B, rows, nkv * hs]
//   lse, delta         [B, nh, rows]
// CPU only: per head, BLAS GEMMs on chunk pairs, one OpenMP loop over heads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "dist/comm.h"

namespace sat::cp {

// The two chunks a rank holds and the global position of each local row.
struct Chunks {
  int64_t len = 0;        // tokens per chunk: T / (2 cp)
  int64_t first[2] = {};  // global position of the first token of chunk 0 and chunk 1
  int64_t pos(int64_t row) const { return first[row / len] + row % len; }
};

// The chunks of `rank` in a cp group of `cp` ranks over a sequence of T tokens; sat::Error
// naming --cp when T is not a multiple of 2 cp.
Chunks chunks_of(int64_t T, int cp, int rank);

// The local rows of `rank` gathered from a full sequence: dst[b, i, :] = src[b, pos(i), :],
// width elements per row (src [B, T, width], dst [B, 2 len, width]); scatter does the reverse.
void gather_rows(const float* src, float* dst, int64_t B, int64_t T, int64_t width, const Chunks& c);
void scatter_rows(const float* src, float* dst, int64_t B, int64_t T, int64_t width, const Chunks& c);

struct Dims {
  int64_t B = 0, rows = 0, nh = 0, nkv = 0, hs = 0;
  int64_t q_size() const { return B * rows * nh * hs; }
  int64_t kv_size() const { return B * rows * nkv * hs; }
  int64_t lse_size() const { return B * nh * rows; }
};

// One step of the ring on this rank: its queries (chunks qc) against one key/value block
// (the chunks kc of the rank it came from).
// Forward: merges the block's attention into out and lse (start from out = 0, lse = -inf:
// forward_begin).
void forward_begin(const Dims& d, float* out, float* lse);
void forward_step(const Dims& d, const float* q, const Chunks& qc, const float* k, const float* v, const Chunks& kc,
                  float* out, float* lse);
// Backward: delta[b, h, i] = sum_j dout[b, i, h, j] out[b, i, h, j] (backward_begin, which
// also zeroes dq); each step adds the block's terms to dq and to the block's dk, dv.
void backward_begin(const Dims& d, const float* out, const float* dout, float* delta, float* dq);
void backward_step(const Dims& d, const float* q, const Chunks& qc, const float* k, const float* v, const Chunks& kc,
                   const float* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv);

// The ring's transport: send n floats to the next rank (dir +1: rank + 1 mod C; dir -1:
// rank - 1 mod C) and receive n floats from the previous one (rank - dir) into recv (send
// and recv do not overlap). Every rank of the group calls it the same number of times.
using Shift = std::function<void(const float* send, float* recv, size_t n, int dir)>;
// The ring over a cp group's communicator (host memory): one send_recv per shift.
Shift comm_shift(dist::Comm& group);

// The whole ring on rank `rank` of `cp`: out and lse (forward), dq, dk, dv (backward; dk,
// dv of this rank's own key/value block). The ring's buffers are `work` (forward_work and
// backward_work floats: the travelling block and the one arriving, and backward's delta),
// allocated by the call when work is null.
int64_t forward_work(const Dims& d);
int64_t backward_work(const Dims& d);
void ring_forward(const Dims& d, int cp, int rank, const Chunks& mine, const float* q, const float* k,
                  const float* v, float* out, float* lse, const Shift& shift, float* work = nullptr);
void ring_backward(const Dims& d, int cp, int rank, const Chunks& mine, const float* q, const float* k,
                   const float* v, const float* out, const float* dout, const float* lse, float* dq, float* dk,
                   float* dv, const Shift& shift, float* work = nullptr);

}  // namespace sat::cp
