// Conv2d through Winograd's minimal filtering F(m x m, 3x3) (Lavin & Gray, 2016), m = 2 or
// 4, for the 3x3, stride 1, padding 1 convolutions that dominate ResNet. With a = m + 2,
// an m x m output tile takes a*a multiplications per channel pair instead of 9*m*m: the
// products shrink by 2.25x (m = 2) or 4x (m = 4).
//
// Forward, per a x a input tile d (rows m*i-1 .. m*i+m, the same for columns, zeros outside):
//   U = G g G^T (a x a, per output/input channel pair), V = B^T d B,
//   M[xi] = U[xi] V[xi] (a GEMM over channels for each of the a*a positions xi),
//   y tile = A^T M A (m x m, cropped at the image's edge).
// Both backward passes are the exact adjoints of these linear maps, so the gradients are
// those of the forward computed here: dM = A dY A^T, dV[xi] = U[xi]^T dM[xi] then
// dX += B dV B^T (overlapping tiles add), and dU[xi] = sum over tiles dM[xi] V[xi]^T then
// dW = G^T dU G.
//
// Accuracy: F(2x2)'s transforms only add, subtract and halve; F(4x4)'s coefficients (up
// to 8, and 1/24) lose a few more bits. Against a float64 reference the relative errors
// are 3e-8 to 5e-7 (F(2x2)) and 1e-7 to 4e-6 (F(4x4)), growing with the channels summed
// (tests/test_layers_conv.cpp, Conv2d.WinogradMatchesReference).
//
// Layouts: U [a*a][K][C], V [a*a][P][C], M [a*a][P][K] for the P tiles of a chunk (tile
// p = image*T + i*tw + j), so each position's GEMM is M[xi] = V[xi] U[xi]^T. Tiles are
// processed in chunks of whole images sized so that V and M stay near kChunkBytes
// (cache-resident between the transforms and the GEMMs); all buffers are scratch of the
// plan. The a*a GEMMs of a chunk run in parallel (one thread each, cpu::gemm_batched).
// The tile transforms run on kLanes channels at once (one per vector lane), from and to
// channel-interleaved copies of the planes; each (image, block of channels) is one
// iteration's own, so the adjoint's overlapping tiles add without races.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include <omp.h>

#include "backend/cpu/blas.h"
#include "nn/layers/conv2d.h"

// The transforms pass 16-float vectors between inline functions of this file only; GCC
// warns that their ABI would differ under AVX-512, which no caller outside sees.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sat {

namespace {

constexpr int64_t kChunkBytes = 8ll << 20;  // V + M of one chunk of images
// The tile rows of each GEMM are padded (with zeros) to a multiple of kRowBlock. OpenBLAS
// rounds a row of a product differently when it falls in the kernel's last, partial block
// of rows (measured with 0.3.21 on Zen 3: rows in full blocks of 12 agree bit for bit
// whatever the row count, rows in a partial block do not): without padding an image's
// output would depend on how many images share its GEMM, and data-parallel ranks (fewer
// images each) would leave the one-process trajectory (test_dp_train: 2.5e-5 in three
// ResNet-18 steps, against 5e-8 for oneDNN). 48 is a multiple of the 4- to 16-row blocks
// of OpenBLAS's x86 sgemm kernels.
constexpr int64_t kRowBlock = 48;

int64_t padded_rows(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock * kRowBlock; }

// Rows [rows, padded) of each of the n blocks [padded, width] of X: zeros.
void zero_pad_rows(float* X, int64_t n, int64_t rows, int64_t padded, int64_t width) {
  for (int64_t i = 0; i < n; ++i) std::fill(X + (i * padded + rows) * width, X + (i + 1) * padded * width, 0.0f);
}
constexpr int64_t kParallelMin = 1 << 15;   // floats below which transforms stay serial

// f(integral_constant<int, 0>) ... f(integral_constant<int, N-1>): the transforms' small
// loops unrolled at compile time, so their coefficients are constants.
template <int N, class Fn>
inline void unroll(Fn&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

// The sum over q < N of coef(q) * x(q), where Coef is a captureless constexpr lambda: zero
// terms vanish and +-1 take no multiply, as in a hand-written transform. (-0.0f + v == v
// for every v, so the start adds nothing.)
template <int N, class Coef, class X>
inline auto csum(Coef, X&& x) {
  decltype(x(0)) s = -decltype(x(0)){};  // -0 in every lane
  unroll<N>([&](auto q) {
    constexpr float k = Coef{}(decltype(q)::value);
    if constexpr (k == 1.0f)
      s += x(int(q));
    else if constexpr (k == -1.0f)
      s -= x(int(q));
    else if constexpr (k != 0.0f)
      s += k * x(int(q));
  });
  return s;
}

// The transform matrices of F(m x m, 3x3): BT [a][a], G [a][3], AT [m][a].
template <int m>
struct Wino;

template <>
struct Wino<2> {
  static constexpr int a = 4;
  static constexpr float BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr float G[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
  static constexpr float AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};

template <>
struct Wino<4> {
  static constexpr int a = 6;
  static constexpr float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                     {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr float G[6][3] = {{1.0f / 4, 0, 0},
                                    {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                    {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                    {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                    {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                    {0, 0, 1}};
  static constexpr float AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

// Sixteen channels side by side: the transforms run on sixteen channels at once, one per
// lane, so every tile's arithmetic is whole-vector (GCC's vector extension: two AVX halves
// with x86-64-v3) and every tile writes whole 64-byte lines of V and M. (Eight lanes, half
// lines, ran ResNet-18's 32x32 layers at 0.55x this speed: the lines' other halves came
// back from memory later.)
constexpr int64_t kLanes = 16;
typedef float v16 __attribute__((vector_size(64), aligned(4)));

inline v16 loadv(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// The tile geometry of one layer: T tiles per image, th x tw; and the padded plane (one
// row/column of zeros before, enough after) that every tile reads inside.
struct Tiles {
  int64_t m, H, W, th, tw, Hp, Wp;
  int64_t per_image() const { return th * tw; }
};

Tiles tiles_of(int64_t m, int64_t H, int64_t W) {
  Tiles t{m, H, W, (H + m - 1) / m, (W + m - 1) / m, 0, 0};
  t.Hp = m * t.th + 2;
  t.Wp = m * t.tw + 2;
  return t;
}

// Per-thread working buffers of the transforms, a [threads, per] scratch buffer of the
// plan: a transform's parallel region runs on at most `threads` threads, each on its row.
struct ThreadBufs {
  float* base;
  int64_t per;
  int threads;
  float* mine() const { return base + int64_t(omp_get_thread_num()) * per; }
};

// Floats per thread that any transform of a layer with C input channels and tiles t uses.
int64_t thread_buf_floats(const Tiles& t, int64_t C) {
  const int64_t a = t.m + 2;
  return std::max({t.Hp * t.Wp * kLanes, t.m * t.th * t.m * t.tw * kLanes, (9 + 3 * a) * C});
}

// The [threads, per] scratch buffer as ThreadBufs (never more threads than it has rows).
ThreadBufs thread_bufs(const Tensor& scratch) {
  return {scratch.f32(), scratch.shape[1], int(std::min<int64_t>(scratch.shape[0], omp_get_max_threads()))};
}

// kLanes planes [H, W] (plane stride `plane`) into lanes: buf[((h + off)*ld + w + off)*kLanes + l],
// zeros elsewhere in buf [rows, ld, kLanes].
void interleave(const float* src, int64_t plane, int64_t H, int64_t W, float* buf, int64_t rows, int64_t ld,
                int64_t off) {
  std::fill(buf, buf + rows * ld * kLanes, 0.0f);
  for (int64_t l = 0; l < kLanes; ++l) {
    const float* s = src + l * plane;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) buf[((h + off) * ld + w + off) * kLanes + l] = s[h * W + w];
  }
}

// The inverse: the [H, W] window at (off, off) of buf's lanes into kLanes planes.
void deinterleave(const float* buf, int64_t ld, int64_t off, int64_t H, int64_t W, float* dst, int64_t plane) {
  for (int64_t l = 0; l < kLanes; ++l) {
    float* d = dst + l * plane;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) d[h * W + w] = buf[((h + off) * ld + w + off) * kLanes + l];
  }
}

// V[xi][p][c] = (B^T d B)[xi] for every tile p of images [0, gn) of x [gn, C, H, W]
// (p = image*T + i*tw + j within the chunk).
template <int m>
void input_transform(const float* x, int64_t gn, int64_t C, const Tiles& t, float* V, int64_t P, const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t T = t.per_image(), plane = t.H * t.W, CB = C / kLanes, step = P * C;
#pragma omp parallel num_threads(tb.threads) if (gn * C * plane > kParallelMin)
  {
    float* const buf = tb.mine();  // [Hp, Wp, kLanes]
#pragma omp for collapse(2) schedule(static)
    for (int64_t im = 0; im < gn; ++im)
      for (int64_t cb = 0; cb < CB; ++cb) {
        interleave(x + (im * C + cb * kLanes) * plane, plane, t.H, t.W, buf, t.Hp, t.Wp, 1);
        for (int64_t i = 0; i < t.th; ++i)
          for (int64_t j = 0; j < t.tw; ++j) {
            const float* d = buf + (m * i * t.Wp + m * j) * kLanes;  // d[r][q] at (r*Wp + q)*kLanes
            v16 r[a][a];  // B^T d
            unroll<a>([&](auto u_) {
              constexpr int u = u_;
              for (int q = 0; q < a; ++q)
                r[u][q] = csum<a>([](int z) { return F::BT[u][z]; }, [&](int z) { return loadv(d + (z * t.Wp + q) * kLanes); });
            });
            float* o = V + (im * T + i * t.tw + j) * C + cb * kLanes;
            for (int u = 0; u < a; ++u)  // (B^T d) B
              unroll<a>([&](auto v_) {
                constexpr int v = v_;
                storev(o + (u * a + v) * step, csum<a>([](int q) { return F::BT[v][q]; }, [&](int q) { return r[u][q]; }));
              });
          }
      }
  }
}

// The adjoint of input_transform: dx [gn, C, H, W] = the sum over tiles of B dV B^T,
// overwritten (neighbouring tiles overlap by two rows and columns: their terms add).
template <int m>
void input_transform_adjoint(const float* dV, int64_t P, int64_t gn, int64_t C, const Tiles& t, float* dx,
                             const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t T = t.per_image(), plane = t.H * t.W, CB = C / kLanes, step = P * C;
#pragma omp parallel num_threads(tb.threads) if (gn * C * plane > kParallelMin)
  {
    float* const buf = tb.mine();  // [Hp, Wp, kLanes]
#pragma omp for collapse(2) schedule(static)
    for (int64_t im = 0; im < gn; ++im)
      for (int64_t cb = 0; cb < CB; ++cb) {
        std::fill(buf, buf + t.Hp * t.Wp * kLanes, 0.0f);
        for (int64_t i = 0; i < t.th; ++i)
          for (int64_t j = 0; j < t.tw; ++j) {
            const float* e = dV + (im * T + i * t.tw + j) * C + cb * kLanes;
            v16 r[a][a];  // dV B^T
            for (int u = 0; u < a; ++u)
              unroll<a>([&](auto q_) {
                constexpr int q = q_;
                r[u][q] = csum<a>([](int v) { return F::BT[v][q]; }, [&](int v) { return loadv(e + (u * a + v) * step); });
              });
            float* d = buf + (m * i * t.Wp + m * j) * kLanes;
            unroll<a>([&](auto z_) {  // B (dV B^T), added into the tile's window
              constexpr int z = z_;
              for (int q = 0; q < a; ++q) {
                float* dz = d + (z * t.Wp + q) * kLanes;
                storev(dz, loadv(dz) + csum<a>([](int u) { return F::BT[u][z]; }, [&](int u) { return r[u][q]; }));
              }
            });
          }
        deinterleave(buf, t.Wp, 1, t.H, t.W, dx + (im * C + cb * kLanes) * plane, plane);
      }
  }
}

// y [gn, K, H, W] = A^T M A per tile, cropped, plus the bias (may be null).
template <int m>
void output_transform(const float* M, int64_t P, int64_t gn, int64_t K, const Tiles& t, const float* bias, float* y,
                      const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t T = t.per_image(), plane = t.H * t.W, KB = K / kLanes, step = P * K, ld = m * t.tw;
#pragma omp parallel num_threads(tb.threads) if (gn * K * plane > kParallelMin)
  {
    float* const buf = tb.mine();  // [m th, ld, kLanes]
#pragma omp for collapse(2) schedule(static)
    for (int64_t im = 0; im < gn; ++im)
      for (int64_t kb = 0; kb < KB; ++kb) {
        const v16 b = bias ? loadv(bias + kb * kLanes) : v16{};
        for (int64_t i = 0; i < t.th; ++i)
          for (int64_t j = 0; j < t.tw; ++j) {
            const float* e = M + (im * T + i * t.tw + j) * K + kb * kLanes;
            v16 s[a][m];  // M A
            for (int u = 0; u < a; ++u)
              unroll<m>([&](auto q_) {
                constexpr int q = q_;
                s[u][q] = csum<a>([](int v) { return F::AT[q][v]; }, [&](int v) { return loadv(e + (u * a + v) * step); });
              });
            float* o = buf + (m * i * ld + m * j) * kLanes;
            unroll<m>([&](auto r_) {  // A^T (M A)
              constexpr int r = r_;
              for (int q = 0; q < m; ++q)
                storev(o + (r * ld + q) * kLanes, b + csum<a>([](int u) { return F::AT[r][u]; }, [&](int u) { return s[u][q]; }));
            });
          }
        deinterleave(buf, ld, 0, t.H, t.W, y + (im * K + kb * kLanes) * plane, plane);
      }
  }
}

// The adjoint of output_transform: dM[xi][p][k] = (A dY A^T)[xi] per tile, where dY is the
// tile's m x m output gradient (zeros past the image's edge).
template <int m>
void output_transform_adjoint(const float* dy, int64_t gn, int64_t K, const Tiles& t, float* dM, int64_t P,
                              const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t T = t.per_image(), plane = t.H * t.W, KB = K / kLanes, step = P * K, ld = m * t.tw;
#pragma omp parallel num_threads(tb.threads) if (gn * K * plane > kParallelMin)
  {
    float* const buf = tb.mine();  // [m th, ld, kLanes]
#pragma omp for collapse(2) schedule(static)
    for (int64_t im = 0; im < gn; ++im)
      for (int64_t kb = 0; kb < KB; ++kb) {
        interleave(dy + (im * K + kb * kLanes) * plane, plane, t.H, t.W, buf, m * t.th, ld, 0);
        for (int64_t i = 0; i < t.th; ++i)
          for (int64_t j = 0; j < t.tw; ++j) {
            const float* g = buf + (m * i * ld + m * j) * kLanes;  // dY[r][q] at (r*ld + q)*kLanes
            v16 s[a][m];  // A dY
            unroll<a>([&](auto u_) {
              constexpr int u = u_;
              for (int q = 0; q < m; ++q)
                s[u][q] = csum<m>([](int r) { return F::AT[r][u]; }, [&](int r) { return loadv(g + (r * ld + q) * kLanes); });
            });
            float* o = dM + (im * T + i * t.tw + j) * K + kb * kLanes;
            for (int u = 0; u < a; ++u)  // (A dY) A^T
              unroll<a>([&](auto v_) {
                constexpr int v = v_;
                storev(o + (u * a + v) * step, csum<m>([](int q) { return F::AT[q][v]; }, [&](int q) { return s[u][q]; }));
              });
          }
      }
  }
}

// U[xi][k][c] = (G g G^T)[xi] for the weight w [K, C, 3, 3]: per output channel k, its
// filters are first laid out tap-major (g[z][c]) so that every step runs along c.
template <int m>
void weight_transform(const float* w, int64_t K, int64_t C, float* U, const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t step = K * C;
#pragma omp parallel num_threads(tb.threads) if (K * C * a * a > kParallelMin)
  {
    float* g = tb.mine();   // g[z*C + c]: tap z (row-major 3x3) of filter (k, c)
    float* r = g + 9 * C;    // G g: r[(u*3 + q)*C + c]
#pragma omp for schedule(static)
    for (int64_t k = 0; k < K; ++k) {
      const float* wk = w + k * C * 9;
      for (int64_t c = 0; c < C; ++c)
        for (int z = 0; z < 9; ++z) g[z * C + c] = wk[c * 9 + z];
      unroll<a>([&](auto u_) {
        constexpr int u = u_;
        for (int q = 0; q < 3; ++q) {
          float* ruq = r + (u * 3 + q) * C;
          for (int64_t c = 0; c < C; ++c)
            ruq[c] = csum<3>([](int z) { return F::G[u][z]; }, [&](int z) { return g[(z * 3 + q) * C + c]; });
        }
      });
      unroll<a>([&](auto v_) {  // (G g) G^T
        constexpr int v = v_;
        for (int u = 0; u < a; ++u) {
          float* o = U + (u * a + v) * step + k * C;
          const float* ru = r + u * 3 * C;
          for (int64_t c = 0; c < C; ++c)
            o[c] = csum<3>([](int q) { return F::G[v][q]; }, [&](int q) { return ru[q * C + c]; });
        }
      });
    }
  }
}

// The adjoint of weight_transform: dw [K, C, 3, 3] (+)= G^T dU G, along c as above.
template <int m>
void weight_transform_adjoint(const float* dU, int64_t K, int64_t C, bool acc, float* dw, const ThreadBufs& tb) {
  using F = Wino<m>;
  constexpr int a = F::a;
  const int64_t step = K * C;
#pragma omp parallel num_threads(tb.threads) if (K * C * a * a > kParallelMin)
  {
    float* g = tb.mine();   // g[z*C + c]
    float* r = g + 9 * C;    // dU G: r[(u*3 + q)*C + c]
#pragma omp for schedule(static)
    for (int64_t k = 0; k < K; ++k) {
      for (int u = 0; u < a; ++u) {
        const float* du = dU + u * a * step + k * C;
        unroll<3>([&](auto q_) {
          constexpr int q = q_;
          float* ruq = r + (u * 3 + q) * C;
          for (int64_t c = 0; c < C; ++c)
            ruq[c] = csum<a>([](int v) { return F::G[v][q]; }, [&](int v) { return du[v * step + c]; });
        });
      }
      unroll<3>([&](auto z_) {  // G^T (dU G)
        constexpr int z = z_;
        for (int q = 0; q < 3; ++q) {
          float* gz = g + (z * 3 + q) * C;
          for (int64_t c = 0; c < C; ++c)
            gz[c] = csum<a>([](int u) { return F::G[u][z]; }, [&](int u) { return r[(u * 3 + q) * C + c]; });
        }
      });
      float* wk = dw + k * C * 9;
      for (int64_t c = 0; c < C; ++c)
        for (int z = 0; z < 9; ++z) wk[c * 9 + z] = acc ? wk[c * 9 + z] + g[z * C + c] : g[z * C + c];
    }
  }
}

// One layer's pass, for its tile size m.
struct Pass {
  int64_t B, C, K, H, W, images;  // images per chunk
  ThreadBufs tb;                  // the transforms' per-thread buffers
};

template <int m>
void forward_pass(const Pass& L, const float* x, const float* w, const float* bias, float* y, float* U, float* V,
                  float* M) {
  constexpr int64_t aa = Wino<m>::a * Wino<m>::a;
  const Tiles t = tiles_of(m, L.H, L.W);
  const int64_t T = t.per_image(), plane = L.H * L.W;
  weight_transform<m>(w, L.K, L.C, U, L.tb);
  for (int64_t b0 = 0; b0 < L.B; b0 += L.images) {
    const int64_t gn = std::min(L.images, L.B - b0), P = padded_rows(gn * T);
    input_transform<m>(x + b0 * L.C * plane, gn, L.C, t, V, P, L.tb);
    zero_pad_rows(V, aa, gn * T, P, L.C);
    // M[xi] [P, K] = V[xi] [P, C] U[xi]^T
    cpu::gemm_batched(false, true, P, L.K, L.C, 1.0f, V, L.C, P * L.C, U, L.C, L.K * L.C, 0.0f, M, L.K, P * L.K, aa);
    output_transform<m>(M, P, gn, L.K, t, bias, y + b0 * L.K * plane, L.tb);
  }
}

// dx may be null (no input gradient wanted); dw is overwritten or accumulated (acc).
template <int m>
void backward_pass(const Pass& L, const float* x, const float* w, const float* dy, float* dx, float* dw, bool acc,
                   float* U, float* dU, float* V, float* dM) {
  constexpr int64_t aa = Wino<m>::a * Wino<m>::a;
  const Tiles t = tiles_of(m, L.H, L.W);
  const int64_t T = t.per_image(), plane = L.H * L.W, C = L.C, K = L.K;
  if (dx) weight_transform<m>(w, K, C, U, L.tb);
  for (int64_t b0 = 0; b0 < L.B; b0 += L.images) {
    const int64_t gn = std::min(L.images, L.B - b0), P = padded_rows(gn * T);
    input_transform<m>(x + b0 * C * plane, gn, C, t, V, P, L.tb);
    output_transform_adjoint<m>(dy + b0 * K * plane, gn, K, t, dM, P, L.tb);
    zero_pad_rows(V, aa, gn * T, P, C);
    zero_pad_rows(dM, aa, gn * T, P, K);
    const float beta = b0 == 0 ? 0.0f : 1.0f;  // dU[xi] [K, C] (+)= dM[xi]^T V[xi]
    cpu::gemm_batched(true, false, K, C, P, 1.0f, dM, K, P * K, V, C, P * C, beta, dU, C, K * C, aa);
    if (dx) {  // dV[xi] [P, C] = dM[xi] U[xi], into V's buffer
      cpu::gemm_batched(false, false, P, C, K, 1.0f, dM, K, P * K, U, C, K * C, 0.0f, V, C, P * C, aa);
      input_transform_adjoint<m>(V, P, gn, C, t, dx + b0 * C * plane, L.tb);
    }
  }
  weight_transform_adjoint<m>(dU, K, C, acc, dw, L.tb);
}

}  // namespace

bool Conv2d::winograd_fits() const {
  return k_ == 3 && s_ == 1 && p_ == 1 && groups_ == 1 && B_ > 0 && C_ % kLanes == 0 && O_ % kLanes == 0;
}

void Conv2d::setup_winograd(LayerSetup& s, int64_t m) {
  const Tiles t = tiles_of(m, H_, W_);
  const int64_t aa = (m + 2) * (m + 2);
  const int64_t per_image = aa * (C_ + O_) * t.per_image() * int64_t(sizeof(float));
  int64_t G = std::clamp(kChunkBytes / per_image, int64_t(1), B_);
  const int64_t whole = kRowBlock / std::gcd(t.per_image(), kRowBlock);  // images filling whole row blocks
  if (G > whole) G -= G % whole;
  wg_images_ = G;
  const int64_t P = padded_rows(G * t.per_image());
  wf_u_ = s.scratch_forward(Shape{aa, O_, C_});
  wf_v_ = s.scratch_forward(Shape{aa, P, C_});
  wf_m_ = s.scratch_forward(Shape{aa, P, O_});
  // The transforms' per-thread buffers: one row per OpenMP thread available now (the
  // parallel regions never use more).
  const Shape per_thread{std::max(1, cpu::num_threads()), thread_buf_floats(t, C_)};
  wf_t_ = s.scratch_forward(per_thread);
  if (s.training) {
    wb_t_ = s.scratch_backward(per_thread);
    wb_u_ = s.scratch_backward(Shape{aa, O_, C_});
    wb_du_ = s.scratch_backward(Shape{aa, O_, C_});
    wb_v_ = s.scratch_backward(Shape{aa, P, C_});  // V, then dV
    wb_dm_ = s.scratch_backward(Shape{aa, P, O_});
  }
  wg_m_ = m;
}

void Conv2d::forward_winograd(LayerCtx& c) {
  const Pass L{B_, C_, O_, H_, W_, wg_images_, thread_bufs(c.scratch[size_t(wf_t_)])};
  const float* b = bias_ ? c.params[1].f32() : nullptr;
  float* U = c.scratch[size_t(wf_u_)].f32();
  float* V = c.scratch[size_t(wf_v_)].f32();
  float* M = c.scratch[size_t(wf_m_)].f32();
  if (wg_m_ == 4)
    forward_pass<4>(L, c.in[0].f32(), c.params[0].f32(), b, c.out.f32(), U, V, M);
  else
    forward_pass<2>(L, c.in[0].f32(), c.params[0].f32(), b, c.out.f32(), U, V, M);
}

void Conv2d::backward_winograd(LayerCtx& c) {
  const float* dy = c.dout.f32();
  if (bias_) bias_grad(dy, H_ * W_, c.grads[1].f32(), c.accumulate[1]);
  const Pass L{B_, C_, O_, H_, W_, wg_images_, thread_bufs(c.scratch[size_t(wb_t_)])};
  float* dx = c.din[0].ptr ? c.din[0].f32() : nullptr;
  float* U = c.scratch[size_t(wb_u_)].f32();
  float* dU = c.scratch[size_t(wb_du_)].f32();
  float* V = c.scratch[size_t(wb_v_)].f32();
  float* dM = c.scratch[size_t(wb_dm_)].f32();
  const float* x = c.in[0].f32();
  const float* w = c.params[0].f32();
  float* dw = c.grads[0].f32();
  if (wg_m_ == 4)
    backward_pass<4>(L, x, w, dy, dx, dw, c.accumulate[0], U, dU, V, dM);
  else
    backward_pass<2>(L, x, w, dy, dx, dw, c.accumulate[0], U, dU, V, dM);
}

}  // namespace sat
