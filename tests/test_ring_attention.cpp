// Context parallelism's ring attention (nn/ring_attention.h) in one process: C ranks run
// as C threads whose ring shifts copy through shared memory. Their outputs and gradients,
// put back in sequence order, equal full causal attention's (a naive double-precision
// reference), with grouped-query attention; backward agrees with finite differences.
// Under mpirun (RingAttentionRanks) each process is one rank of the ring over the world
// communicator and checks its own rows against the reference; so does the layer
// RingSelfAttention (fused qkv and grouped q, k, v), alone and under mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "mpi_world.h"
#include "nn/layers/embedding.h"
#include "nn/layers/ring_self_attention.h"
#include "nn/layers/rotary.h"
#include "nn/ring_attention.h"

using namespace sat;

namespace {

struct Problem {
  int64_t B, T, nh, nkv, hs;
  std::vector<float> q, k, v, dout;  // q, dout [B, T, nh hs]; k, v [B, T, nkv hs]
};

Problem make_problem(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hs, uint64_t seed) {
  Problem p{B, T, nh, nkv, hs, {}, {}, {}, {}};
  Rng rng(seed);
  auto fill = [&](std::vector<float>& x, int64_t n, float scale) {
    x.resize(size_t(n));
    for (float& e : x) e = scale * rng.normal();
  };
  fill(p.q, B * T * nh * hs, 1.0f);
  fill(p.k, B * T * nkv * hs, 1.0f);
  fill(p.v, B * T * nkv * hs, 1.0f);
  fill(p.dout, B * T * nh * hs, 1.0f);
  return p;
}

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// Full causal attention and its gradients, naively in double.
Grads reference(const Problem& p) {
  const int64_t T = p.T, hs = p.hs, lq = p.nh * hs, lk = p.nkv * hs, G = p.nh / p.nkv;
  const double scale = 1.0 / std::sqrt(double(hs));
  Grads g{std::vector<double>(p.q.size()), std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
          std::vector<double>(p.v.size())};
  std::vector<double> P(static_cast<size_t>(T)), dP(static_cast<size_t>(T));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.nh; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const size_t qi = size_t((b * T + t) * lq + h * hs);
        auto kv = [&](int64_t s) { return size_t((b * T + s) * lk + h / G * hs); };
        double mx = -1e300, sum = 0, delta = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t j = 0; j < hs; ++j) dot += double(p.q[qi + size_t(j)]) * p.k[kv(s) + size_t(j)];
          mx = std::max(mx, P[size_t(s)] = dot * scale);
        }
        for (int64_t s = 0; s <= t; ++s) sum += (P[size_t(s)] = std::exp(P[size_t(s)] - mx));
        for (int64_t s = 0; s <= t; ++s) {
          P[size_t(s)] /= sum;
          double d = 0;
          for (int64_t j = 0; j < hs; ++j) {
            g.out[qi + size_t(j)] += P[size_t(s)] * p.v[kv(s) + size_t(j)];
            d += double(p.dout[qi + size_t(j)]) * p.v[kv(s) + size_t(j)];
          }
          delta += P[size_t(s)] * (dP[size_t(s)] = d);
        }
        for (int64_t s = 0; s <= t; ++s) {
          const double dS = P[size_t(s)] * (dP[size_t(s)] - delta) * scale;
          for (int64_t j = 0; j < hs; ++j) {
            g.dq[qi + size_t(j)] += dS * p.k[kv(s) + size_t(j)];
            g.dk[kv(s) + size_t(j)] += dS * p.q[qi + size_t(j)];
            g.dv[kv(s) + size_t(j)] += P[size_t(s)] * p.dout[qi + size_t(j)];
          }
        }
      }
  return g;
}

// The ring on C threads: each shift publishes this rank's buffer and copies its
// predecessor's (rank - dir) after every rank has published.
class ThreadRing {
 public:
  explicit ThreadRing(int cp) : cp_(cp), bar_(cp), slot_(size_t(cp)) {}
  cp::Shift shift_of(int rank) {
    return [this, rank](const float* send, float* recv, size_t n, int dir) {
      slot_[size_t(rank)] = send;
      bar_.arrive_and_wait();
      const float* from = slot_[size_t(((rank - dir) % cp_ + cp_) % cp_)];
      std::copy(from, from + n, recv);
      ++shifts_[size_t(rank)];
      bar_.arrive_and_wait();
    };
  }
  std::vector<int> shifts_ = std::vector<int>(8, 0);

 private:
  int cp_;
  std::barrier<> bar_;
  std::vector<const float*> slot_;
};

struct RingResult {
  std::vector<float> out, dq, dk, dv;
  std::vector<int> shifts;
};

// Split the problem over cp ranks (load-balanced chunks), run forward and backward on cp
// threads, and put the results back in sequence order.
RingResult run_ring(const Problem& p, int cp) {
  const int64_t lq = p.nh * p.hs, lk = p.nkv * p.hs;
  RingResult r{std::vector<float>(p.q.size()), std::vector<float>(p.q.size()), std::vector<float>(p.k.size()),
               std::vector<float>(p.v.size()), {}};
  ThreadRing ring(cp);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < cp; ++rank)
    threads.emplace_back([&, rank] {
      const cp::Chunks c = cp::chunks_of(p.T, cp, rank);
      const cp::Dims d{p.B, 2 * c.len, p.nh, p.nkv, p.hs};
      std::vector<float> q(size_t(d.q_size())), k(size_t(d.kv_size())), v(k.size()), dout(q.size());
      cp::gather_rows(p.q.data(), q.data(), p.B, p.T, lq, c);
      cp::gather_rows(p.k.data(), k.data(), p.B, p.T, lk, c);
      cp::gather_rows(p.v.data(), v.data(), p.B, p.T, lk, c);
      cp::gather_rows(p.dout.data(), dout.data(), p.B, p.T, lq, c);
      std::vector<float> out(q.size()), lse(size_t(d.lse_size())), dq(q.size()), dk(k.size()), dv(k.size());
      const cp::Shift shift = ring.shift_of(rank);
      cp::ring_forward(d, cp, rank, c, q.data(), k.data(), v.data(), out.data(), lse.data(), shift);
      cp::ring_backward(d, cp, rank, c, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
                        dk.data(), dv.data(), shift);
      cp::scatter_rows(out.data(), r.out.data(), p.B, p.T, lq, c);
      cp::scatter_rows(dq.data(), r.dq.data(), p.B, p.T, lq, c);
      cp::scatter_rows(dk.data(), r.dk.data(), p.B, p.T, lk, c);
      cp::scatter_rows(dv.data(), r.dv.data(), p.B, p.T, lk, c);
    });
  for (std::thread& t : threads) t.join();
  r.shifts.assign(ring.shifts_.begin(), ring.shifts_.begin() + cp);
  return r;
}

// Largest |a - b| / max(1, |b|) over the tensor.
double worst(const std::vector<float>& a, const std::vector<double>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return w;
}

struct Case {
  int cp;
  int64_t nh, nkv;
};

class RingAttention : public ::testing::TestWithParam<Case> {};

TEST_P(RingAttention, EqualsFullCausalAttention) {
  const Case c = GetParam();
  const Problem p = make_problem(2, 48, c.nh, c.nkv, 8, 7 + uint64_t(c.cp));
  const Grads ref = reference(p);
  const RingResult r = run_ring(p, c.cp);
  EXPECT_LT(worst(r.out, ref.out), 1e-5) << "out";
  EXPECT_LT(worst(r.dq, ref.dq), 1e-5) << "dq";
  EXPECT_LT(worst(r.dk, ref.dk), 1e-5) << "dk";
  EXPECT_LT(worst(r.dv, ref.dv), 1e-5) << "dv";
  // cp - 1 shifts forward, cp - 1 backward and one that brings dk, dv home.
  for (int n : r.shifts) EXPECT_EQ(n, c.cp == 1 ? 0 : 2 * c.cp - 1);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttention,
                         ::testing::Values(Case{1, 4, 4}, Case{2, 4, 4}, Case{4, 4, 4}, Case{3, 4, 4}, Case{2, 4, 2},
                                           Case{4, 6, 2}, Case{4, 4, 1}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "cp" + std::to_string(i.param.cp) + "_nh" + std::to_string(i.param.nh) + "_nkv" +
                                  std::to_string(i.param.nkv);
                         });

// Central differences of L = sum(out * dout) through the ring (cp 2, grouped query)
// against the ring's own backward, on a sample of q, k and v entries.
TEST(RingAttentionGrad, FiniteDifferences) {
  Problem p = make_problem(1, 16, 4, 2, 4, 3);
  const RingResult r = run_ring(p, 2);
  auto loss = [&] {
    const RingResult f = run_ring(p, 2);
    double l = 0;
    for (size_t i = 0; i < f.out.size(); ++i) l += double(f.out[i]) * p.dout[i];
    return l;
  };
  const double eps = 1e-2;
  double num2 = 0, diff2 = 0;
  for (int which = 0; which < 3; ++which) {
    std::vector<float>& x = which == 0 ? p.q : which == 1 ? p.k : p.v;
    const std::vector<float>& g = which == 0 ? r.dq : which == 1 ? r.dk : r.dv;
    for (size_t i = 0; i < x.size(); i += 5) {
      const float x0 = x[i];
      x[i] = float(x0 + eps);
      const double up = loss();
      x[i] = float(x0 - eps);
      const double down = loss();
      x[i] = x0;
      const double numeric = (up - down) / (2 * eps);
      num2 += numeric * numeric;
      diff2 += (numeric - g[i]) * (numeric - g[i]);
    }
  }
  EXPECT_GT(num2, 1.0);
  EXPECT_LT(std::sqrt(diff2 / num2), 1e-3);
}

// This rank's rows of a full-sequence tensor [B, T, width], in its local order.
std::vector<double> rows_of(const std::vector<double>& full, int64_t B, int64_t T, int64_t width, const cp::Chunks& c) {
  std::vector<double> r(size_t(B * 2 * c.len * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 2 * c.len; ++i)
      std::copy_n(full.begin() + (b * T + c.pos(i)) * width, width, r.begin() + (b * 2 * c.len + i) * width);
  return r;
}

// The layer RingSelfAttention on this rank's rows of the problem, forward and backward, with
// the fused input (GPT's qkv) or three inputs; its out, dq, dk, dv against the reference.
void check_layer(const Problem& p, int cp, int rank, dist::Comm* group, bool fused) {
  const cp::Chunks c = cp::chunks_of(p.T, cp, rank);
  const int64_t rows = 2 * c.len, lq = p.nh * p.hs, lk = p.nkv * p.hs, n = p.B * rows;
  std::vector<float> q(size_t(n * lq)), k(size_t(n * lk)), v(k.size()), dout(q.size());
  cp::gather_rows(p.q.data(), q.data(), p.B, p.T, lq, c);
  cp::gather_rows(p.k.data(), k.data(), p.B, p.T, lk, c);
  cp::gather_rows(p.v.data(), v.data(), p.B, p.T, lk, c);
  cp::gather_rows(p.dout.data(), dout.data(), p.B, p.T, lq, c);
  std::vector<std::vector<float>> in;
  const int64_t W = lq + 2 * lk;
  if (fused) {
    in.emplace_back(size_t(n * W));
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(q.begin() + r * lq, lq, in[0].begin() + r * W);
      std::copy_n(k.begin() + r * lk, lk, in[0].begin() + r * W + lq);
      std::copy_n(v.begin() + r * lk, lk, in[0].begin() + r * W + lq + lk);
    }
  } else {
    in = {q, k, v};
  }
  RingSelfAttention layer(p.nh, p.nkv, cp, rank);
  LayerSetup s;
  s.name = "attn";
  for (const auto& x : in) s.inputs.push_back({Shape{p.B, rows, int64_t(x.size()) / n}, DType::f32});
  layer.setup(s);
  std::vector<std::vector<float>> store;
  auto tensors = [&](const std::vector<TensorSpec>& specs) {
    std::vector<Tensor> t;
    for (const TensorSpec& sp : specs) {
      store.emplace_back(size_t(sp.shape.numel()), -7.0f);
      t.emplace_back(store.back().data(), sp.shape);
    }
    return t;
  };
  store.reserve(32);
  LayerCtx ctx;
  for (size_t i = 0; i < in.size(); ++i) ctx.in.emplace_back(in[i].data(), s.inputs[i].shape);
  std::vector<float> out(size_t(n * lq));
  ctx.out = Tensor(out.data(), s.output.shape);
  ctx.saved = tensors(s.saved);
  ctx.scratch = tensors(s.scratch_fwd);
  ctx.cp_group = group;
  layer.forward(ctx);
  ctx.scratch = tensors(s.scratch_bwd);
  ctx.dout = Tensor(dout.data(), s.output.shape);
  std::vector<std::vector<float>> din;
  for (const auto& x : in) din.emplace_back(x.size(), -7.0f);
  for (size_t i = 0; i < in.size(); ++i) ctx.din.emplace_back(din[i].data(), s.inputs[i].shape);
  layer.backward(ctx);
  std::vector<float> dq(q.size()), dk(k.size()), dv(k.size());
  if (fused) {
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(din[0].begin() + r * W, lq, dq.begin() + r * lq);
      std::copy_n(din[0].begin() + r * W + lq, lk, dk.begin() + r * lk);
      std::copy_n(din[0].begin() + r * W + lq + lk, lk, dv.begin() + r * lk);
    }
  } else {
    dq = din[0], dk = din[1], dv = din[2];
  }
  const Grads ref = reference(p);
  EXPECT_LT(worst(out, rows_of(ref.out, p.B, p.T, lq, c)), 1e-5) << "out, rank " << rank;
  EXPECT_LT(worst(dq, rows_of(ref.dq, p.B, p.T, lq, c)), 1e-5) << "dq, rank " << rank;
  EXPECT_LT(worst(dk, rows_of(ref.dk, p.B, p.T, lk, c)), 1e-5) << "dk, rank " << rank;
  EXPECT_LT(worst(dv, rows_of(ref.dv, p.B, p.T, lk, c)), 1e-5) << "dv, rank " << rank;
}

TEST(RingSelfAttention, OneRankIsCausalAttention) {
  check_layer(make_problem(2, 12, 4, 4, 8, 5), 1, 0, nullptr, true);
  check_layer(make_problem(2, 12, 4, 2, 8, 6), 1, 0, nullptr, false);
}

TEST(RingSelfAttentionRanks, EqualsCausalAttentionOverTheWorld) {
  if (!test::distributed()) GTEST_SKIP() << "runs under mpirun";
  dist::Comm& w = test::world();
  check_layer(make_problem(2, 4 * w.size(), 4, 4, 8, 21), w.size(), w.rank(), &w, true);
  check_layer(make_problem(2, 4 * w.size(), 6, 2, 8, 22), w.size(), w.rank(), &w, false);
}

// Each process of the job is one cp rank: its rows of out, dq, dk, dv against the reference.
TEST(RingAttentionRanks, EqualsFullCausalAttentionOverTheWorld) {
  if (!test::distributed()) GTEST_SKIP() << "runs under mpirun";
  dist::Comm& w = test::world();
  const int cp = w.size(), rank = w.rank();
  for (const auto& [nh, nkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}}) {
    const Problem p = make_problem(2, 8 * cp, nh, nkv, 8, 11);
    const Grads ref = reference(p);
    const cp::Chunks c = cp::chunks_of(p.T, cp, rank);
    const cp::Dims d{p.B, 2 * c.len, p.nh, p.nkv, p.hs};
    const int64_t lq = p.nh * p.hs, lk = p.nkv * p.hs;
    std::vector<float> q(size_t(d.q_size())), k(size_t(d.kv_size())), v(k.size()), dout(q.size());
    cp::gather_rows(p.q.data(), q.data(), p.B, p.T, lq, c);
    cp::gather_rows(p.k.data(), k.data(), p.B, p.T, lk, c);
    cp::gather_rows(p.v.data(), v.data(), p.B, p.T, lk, c);
    cp::gather_rows(p.dout.data(), dout.data(), p.B, p.T, lq, c);
    std::vector<float> out(q.size()), lse(size_t(d.lse_size())), dq(q.size()), dk(k.size()), dv(k.size());
    const cp::Shift shift = cp::comm_shift(w);
    cp::ring_forward(d, cp, rank, c, q.data(), k.data(), v.data(), out.data(), lse.data(), shift);
    cp::ring_backward(d, cp, rank, c, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
                      dk.data(), dv.data(), shift);
    auto mine = [&](const std::vector<double>& full, int64_t width) { return rows_of(full, p.B, p.T, width, c); };
    EXPECT_LT(worst(out, mine(ref.out, lq)), 1e-5) << "out, rank " << rank;
    EXPECT_LT(worst(dq, mine(ref.dq, lq)), 1e-5) << "dq, rank " << rank;
    EXPECT_LT(worst(dk, mine(ref.dk, lk)), 1e-5) << "dk, rank " << rank;
    EXPECT_LT(worst(dv, mine(ref.dv, lk)), 1e-5) << "dv, rank " << rank;
  }
}

// One input, one output: forward, then backward of dout; returns out and din.
std::pair<std::vector<float>, std::vector<float>> run_one(Layer& layer, std::vector<float> x, const Shape& shape,
                                                          std::vector<float> dout) {
  LayerSetup s;
  s.name = "layer";
  s.inputs.push_back({shape, DType::f32});
  layer.setup(s);
  std::vector<std::vector<float>> store;
  auto tensors = [&](const std::vector<TensorSpec>& specs) {
    std::vector<Tensor> t;
    for (const TensorSpec& sp : specs) {
      store.emplace_back(size_t(sp.shape.numel()));
      t.emplace_back(store.back().data(), sp.shape);
    }
    return t;
  };
  std::vector<float> out(size_t(s.output.shape.numel())), din(x.size());
  LayerCtx c;
  c.in = {Tensor(x.data(), shape)};
  c.out = Tensor(out.data(), s.output.shape);
  c.saved = tensors(s.saved);
  c.scratch = tensors(s.scratch_fwd);
  layer.forward(c);
  c.scratch = tensors(s.scratch_bwd);
  c.dout = Tensor(dout.data(), s.output.shape);
  c.din = {Tensor(din.data(), shape)};
  layer.backward(c);
  return {out, din};
}

// Under context parallelism each rank rotates its two chunks by their true positions:
// bitwise the rows of the whole sequence's rotation, forward and backward.
TEST(RingAttentionChunks, RotaryTakesTheChunksPositions) {
  const int64_t B = 2, T = 32, W = 3 * 8, hs = 8;
  const Problem p = make_problem(B, T, 3, 3, hs, 9);  // q and dout as x and dy [B, T, W]
  Rotary whole(hs, 500.0f);
  const auto [y, dx] = run_one(whole, p.q, Shape{B, T, W}, p.dout);
  for (int cp : {2, 4})
    for (int rank = 0; rank < cp; ++rank) {
      const cp::Chunks c = cp::chunks_of(T, cp, rank);
      const int64_t rows = 2 * c.len;
      std::vector<float> x(size_t(B * rows * W)), dy(x.size()), want_y(x.size()), want_dx(x.size());
      cp::gather_rows(p.q.data(), x.data(), B, T, W, c);
      cp::gather_rows(p.dout.data(), dy.data(), B, T, W, c);
      cp::gather_rows(y.data(), want_y.data(), B, T, W, c);
      cp::gather_rows(dx.data(), want_dx.data(), B, T, W, c);
      Rotary part(hs, 500.0f, cp, rank);
      const auto [py, pdx] = run_one(part, x, Shape{B, rows, W}, dy);
      EXPECT_EQ(py, want_y) << "cp " << cp << " rank " << rank;
      EXPECT_EQ(pdx, want_dx) << "cp " << cp << " rank " << rank;
    }
}

// GPTEmbedding on tokens [B, T] with parameters wte, wpe: out, dwte, dwpe for dy.
struct EmbeddingRun {
  std::vector<float> out, dwte, dwpe;
};
EmbeddingRun run_embedding(GPTEmbedding& layer, std::vector<int32_t> tok, int64_t B, int64_t T,
                           std::vector<float> wte, std::vector<float> wpe, std::vector<float> dy) {
  LayerSetup s;
  s.name = "transformer";
  s.inputs.push_back({Shape{B, T}, DType::i32});
  layer.setup(s);
  EmbeddingRun r{std::vector<float>(size_t(s.output.shape.numel())), std::vector<float>(wte.size()),
                 std::vector<float>(wpe.size())};
  LayerCtx c;
  c.in = {Tensor(tok.data(), Shape{B, T}, DType::i32)};
  c.out = Tensor(r.out.data(), s.output.shape);
  c.params = {Tensor(wte.data(), s.params[0].spec.shape), Tensor(wpe.data(), s.params[1].spec.shape)};
  c.grads = {Tensor(r.dwte.data(), s.params[0].spec.shape), Tensor(r.dwpe.data(), s.params[1].spec.shape)};
  c.accumulate = {false, false};
  layer.forward(c);
  c.dout = Tensor(dy.data(), s.output.shape);
  layer.backward(c);
  return r;
}

// Under context parallelism each rank adds the position embeddings of its chunks' true
// positions (bitwise the whole sequence's rows), and the ranks' gradients sum to the whole's.
TEST(RingAttentionChunks, GPTEmbeddingTakesTheChunksPositions) {
  const int64_t B = 2, T = 16, V = 11, D = 8, max_t = 20;
  Rng rng(4);
  std::vector<float> wte(size_t(V * D)), wpe(size_t(max_t * D)), dy(size_t(B * T * D));
  for (auto* v : {&wte, &wpe, &dy})
    for (float& e : *v) e = rng.normal();
  std::vector<int32_t> tok(size_t(B * T));
  for (int32_t& t : tok) t = int32_t(rng.next_u64() % uint64_t(V));
  GPTEmbedding whole(V, max_t, D);
  const EmbeddingRun ref = run_embedding(whole, tok, B, T, wte, wpe, dy);
  for (int cp : {2, 4}) {
    std::vector<float> dwte(wte.size()), dwpe(wpe.size());
    for (int rank = 0; rank < cp; ++rank) {
      const cp::Chunks c = cp::chunks_of(T, cp, rank);
      const int64_t rows = 2 * c.len;
      std::vector<int32_t> t(size_t(B * rows));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < rows; ++i) t[size_t(b * rows + i)] = tok[size_t(b * T + c.pos(i))];
      std::vector<float> d(size_t(B * rows * D)), want(d.size());
      cp::gather_rows(dy.data(), d.data(), B, T, D, c);
      cp::gather_rows(ref.out.data(), want.data(), B, T, D, c);
      GPTEmbedding part(V, max_t, D, 0.02f, {}, cp, rank);
      const EmbeddingRun r = run_embedding(part, t, B, rows, wte, wpe, d);
      EXPECT_EQ(r.out, want) << "cp " << cp << " rank " << rank;
      for (size_t i = 0; i < dwte.size(); ++i) dwte[i] += r.dwte[i];
      for (size_t i = 0; i < dwpe.size(); ++i) dwpe[i] += r.dwpe[i];
    }
    EXPECT_EQ(dwpe, ref.dwpe) << "cp " << cp;  // each position's rows lie on one rank
    for (size_t i = 0; i < dwte.size(); ++i) EXPECT_NEAR(dwte[i], ref.dwte[i], 1e-5) << i;
  }
}

TEST(RingAttentionChunks, LoadBalancedOffsets) {
  const cp::Chunks c0 = cp::chunks_of(16, 4, 0), c3 = cp::chunks_of(16, 4, 3);
  EXPECT_EQ(c0.len, 2);
  EXPECT_EQ(c0.first[0], 0);
  EXPECT_EQ(c0.first[1], 14);
  EXPECT_EQ(c3.first[0], 6);
  EXPECT_EQ(c3.first[1], 8);
  EXPECT_EQ(c0.pos(3), 15);
  try {
    (void)cp::chunks_of(20, 4, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--cp 4: the context of 20 tokens must be a multiple of 2 x cp = 8 (each rank holds two equal chunks)");
  }
}

}  // namespace
