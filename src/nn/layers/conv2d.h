// 2-D convolution, NCHW (PyTorch's nn.Conv2d with square kernel, stride, padding and
// groups; no dilation). CPU paths: im2col + OpenBLAS GEMMs per group of images (one GEMM
// per channel group), oneDNN's convolution primitives (conv2d_dnnl.cpp) or Winograd's
// F(m x m, 3x3) (conv2d_winograd.cpp), chosen per shape by timing them on the machine
// (choose_path, nn/kernel_choice.h). GPU path (conv2d.cu): cuDNN's convolution API.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "nn/layer.h"

namespace sat {

class Conv2d : public Layer {
 public:
  // w_init: nullopt = PyTorch's default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
  // fan_in = (in_ch/groups)*kernel*kernel (the bias always uses that default).
  // groups: channel groups (PyTorch's groups; in_ch and out_ch must be multiples of it,
  // groups == in_ch is a depthwise convolution). The weight is [out_ch, in_ch/groups, k, k].
  Conv2d(int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true, std::optional<ParamInit> w_init = std::nullopt, int64_t groups = 1);

  const char* kind() const override { return "Conv2d"; }
  bool backward_reads_output() const override { return false; }
  bool product_param(int k) const override { return k == 0; }  // the weight; the bias is added in f32
  bool bf16_native_cpu() const override;  // one channel group, oneDNN and AVX512-BF16 (conv2d_dnnl.cpp)
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

  int64_t in_channels() const { return C_; }
  int64_t out_channels() const { return O_; }
  int64_t groups() const { return groups_; }
  int64_t images_per_gemm() const { return G_; }  // after setup
  int64_t live_taps() const { return int64_t(taps_.size()); }  // after setup; k*k unless pruned

  // One kernel tap (kh, kw) and where it reads: output rows [oh_lo, oh_hi) and columns
  // [ow_lo, ow_hi) see real input; the rest of its im2col row is padding (zeros). base is
  // the input offset of output (oh_lo, 0): input(oh, ow) = base + (oh-oh_lo)*s*W + ow*s.
  struct Tap {
    int64_t kh, kw, oh_lo, oh_hi, ow_lo, ow_hi, base;
  };
 private:
  int64_t C_, O_, k_, s_, p_, groups_;
  bool bias_;
  ParamInit w_init_;
  // Geometry, fixed by setup().
  int64_t B_ = 0, H_ = 0, W_ = 0, Ho_ = 0, Wo_ = 0;
  int64_t G_ = 1;        // images per GEMM (columns of one GEMM = G_*Ho_*Wo_)
  bool direct_ = false;  // 1x1, stride 1, no padding and G_ == 1: the input already is the column matrix
  // Kernel taps that ever see real input (not only padding). ResNet's 3x3/pad-1 convs on a
  // 1x1 feature map use only the centre tap: the GEMM runs over live taps only
  // (K = C*live_taps() instead of C*k*k), with the weight gathered into a compact copy.
  std::vector<Tap> taps_;  // live taps, kh-major; the order of im2col rows within a channel
  bool pruned_ = false;    // some tap is dead
  // Scratch slots (-1: not declared).
  int fwd_col_ = -1, fwd_out_ = -1, fwd_w_ = -1;  // forward: columns, group GEMM output, compact weight
  int bwd_col_ = -1, bwd_dout_ = -1;  // backward: columns (then their gradient), gathered dout
  int bwd_w_ = -1, bwd_dw_ = -1;      // backward (pruned only): compact weight and its gradient
  // GPU (conv2d.cu). Activation dtype, and the backward scratch slot of the filter
  // gradient in that dtype (bf16/f16 only: cuDNN writes the filter gradient in the
  // filter's dtype; it is then added into the f32 gradient).
  DType act_ = DType::f32;
  int bwd_dw_lp_ = -1;
  // cuDNN descriptors and the chosen algorithms, made on the first GPU call (defined in
  // conv2d.cu; a shared_ptr so this header needs no cuDNN types).
  struct CudnnState;
  std::shared_ptr<CudnnState> dnn_;
  std::mutex dnn_mu_;
  // CPU through oneDNN (conv2d_dnnl.cpp) for the shapes where it is faster than im2col +
  // OpenBLAS; null: im2col.
  struct Dnnl;
  std::shared_ptr<Dnnl> onednn_;
  // SAT_CONV's path: "" for auto (measured), "rule", or a path; sat::Error for an unknown one.
  static std::string forced_path();
  // After the geometry is set: the CPU path this shape takes (im2col, onednn, winograd2,
  // winograd4), and the fixed rule that chose it before measuring (SAT_CONV=rule).
  std::string choose_path(const LayerSetup& s) const;
  std::string rule_path() const;
  std::vector<std::string> auto_paths() const;  // the candidates measuring times
  std::string path_;        // the chosen CPU path, after setup
  std::string probe_path_;  // set on the copies measuring times: this path, no choosing
  void setup_onednn(LayerSetup& s);
  void forward_onednn(LayerCtx& c);
  void backward_onednn(LayerCtx& c);
  // CPU through Winograd F(m x m, 3x3) (conv2d_winograd.cpp) for 3x3, stride 1, padding 1
  // convolutions where it is faster: the output tile m (0: not Winograd), images per chunk
  // of tiles, and the scratch slots of the transformed weight U, input V and product M
  // (forward), and of U, dU, V (then dV) and dM (backward).
  int64_t wg_m_ = 0;
  int64_t wg_images_ = 0;
  int wf_u_ = -1, wf_v_ = -1, wf_m_ = -1, wb_u_ = -1, wb_du_ = -1, wb_v_ = -1, wb_dm_ = -1;
  int wf_t_ = -1, wb_t_ = -1;  // the transforms' per-thread buffers [threads, floats]
  // The bias gradient (db [O], overwritten or accumulated) from dy [B, O, HW]: shared by the
  // im2col and Winograd paths.
  void bias_grad(const float* dy, int64_t HW, float* db, bool acc) const;
  bool winograd_fits() const;      // the shape Winograd F(m x m, 3x3) computes
  void setup_winograd(LayerSetup& s, int64_t m);
  void forward_winograd(LayerCtx& c);
  void backward_winograd(LayerCtx& c);

 public:
  static bool onednn_available();  // this build has oneDNN
  bool uses_onednn() const { return onednn_ != nullptr; }  // after setup
  int64_t winograd_tile() const { return wg_m_; }          // after setup: m of F(m x m, 3x3), 0: not Winograd
  const std::string& cpu_path() const { return path_; }    // after a CPU setup: im2col, onednn, winograd2 or winograd4
};

}  // namespace sat
