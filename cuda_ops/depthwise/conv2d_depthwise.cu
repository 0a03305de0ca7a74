// Launcher for the depthwise conv2d kernels: validate, pick the kernel and its
// tile with a small cost model, launch. Host arithmetic only: no allocation,
// synchronization or device query (CUDA-graph capturable).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/host_arith.h"
#include "depthwise/conv2d_depthwise.h"
#include "depthwise/conv2d_depthwise_kernel.cuh"

namespace jaxcnn {
namespace {

namespace dw = conv2d_depthwise;

// H100/H200 SXM. Only sizes the persistent grid and the cost model's waves;
// a different count costs some balance, never correctness.
constexpr int64_t kNumSms = 132;
// Dynamic shared memory per CTA; staying under 48 KiB needs no opt-in
// attribute call in the launch path.
constexpr int64_t kSmemBudget = 48 * 1024;
constexpr int64_t kSmemPerSm = 227 * 1024;
// Registers per thread for the residency estimate: the vec kernels are capped
// at 80 by __launch_bounds__ (kVecMinBlocks), the plane kernels use ~32.
constexpr int64_t kRegsPerThread = 80;
constexpr int kVec = 4;  // elements per thread of the vectorized layouts

enum class Shape { k3x3s1, k3x3s2, kGeneric };

Shape FastShape(const Conv2dParams& q) {
  if (q.R == 3 && q.S == 3 && q.dil_h == 1 && q.dil_w == 1 &&
      q.stride_h == q.stride_w) {
    if (q.stride_h == 1) return Shape::k3x3s1;
    if (q.stride_h == 2) return Shape::k3x3s2;
  }
  return Shape::kGeneric;
}

// Output rows per thread: 8 where the sliding window reuses rows well
// (stride 1), 4 elsewhere (smaller halo tiles, fewer accumulators).
int StripRows(Shape shape) { return shape == Shape::k3x3s1 ? 8 : 4; }

// NCHW, and CHWN with N == 1 (the same memory order), use the plane kernel.
bool UsesPlaneKernel(const Conv2dParams& q) {
  return q.layout == TensorLayout::kNCHW ||
         (q.layout == TensorLayout::kCHWN && q.N == 1);
}

// Candidate extents: `cap` values limited to `n`, then balanced so the tiles
// split n evenly (56 with cap 32 -> 28, not 32 + 24).
int Balanced(int64_t n, int64_t cap) {
  const int64_t c = std::max<int64_t>(1, std::min(cap, n));
  return static_cast<int>(CeilDiv(n, CeilDiv(n, c)));
}

// Estimated cost of one tile in bytes-equivalents: bytes moved into shared
// memory and out to global, FMAs of every launched lane (partial warps
// included) at ~1/4 byte each, and a fixed per-tile overhead (decode,
// barriers, pipeline bubbles).
int64_t TileCost(int64_t in_bytes, int64_t out_bytes, int64_t threads,
                 int64_t outputs_per_thread, int64_t taps) {
  return in_bytes + out_bytes +
         RoundUp(threads, 32) * outputs_per_thread * taps / 4 + 2048;
}

// Bytes a contiguous run of `bytes` really moves: whole 32-byte sectors, plus
// one when the run is not sector-aligned (narrow channel slices and short
// plane rows waste bandwidth; the cost model must see it).
int64_t SectorBytes(int64_t bytes) {
  return RoundUp(bytes, 32) + (bytes % 32 != 0 ? 32 : 0);
}

// Busiest SM: tiles are spread evenly over the SMs.
int64_t Score(int64_t tiles, int64_t tile_cost) {
  return CeilDiv(tiles, kNumSms) * tile_cost;
}

int64_t Residency(int64_t threads, int64_t smem) {
  const int64_t t = RoundUp(threads, 32);
  int64_t ctas = std::min<int64_t>(32, 2048 / t);
  ctas = std::min(ctas, 65536 / (t * kRegsPerThread));
  ctas = std::min(ctas, kSmemPerSm / (smem + 1024));
  return std::max<int64_t>(1, ctas);
}

// A TP x TQ output tile and the input tile it reads, halo included: IH x IW, and IWs
// columns per stride phase. Both planners' plans start with it.
struct TileGeometry {
  int TQ, TP, IH, IW, IWs;
};

// TileGeometry's input extents in int64: the planners size shared memory from them before
// narrowing (a tile too large for it is skipped, never truncated).
struct Halo {
  int64_t IH, IW, IWs;
};

Halo HaloOf(const Conv2dParams& q, int TP, int TQ) {
  const int64_t IH = int64_t{TP - 1} * q.stride_h + (q.R - 1) * q.dil_h + 1;
  const int64_t IW = int64_t{TQ - 1} * q.stride_w + (q.S - 1) * q.dil_w + 1;
  return {IH, IW, CeilDiv(IW, q.stride_w)};
}

TileGeometry GeometryOf(int TP, int TQ, const Halo& h) {
  return {TQ, TP, static_cast<int>(h.IH), static_cast<int>(h.IW), static_cast<int>(h.IWs)};
}

// The planners' choice among candidate tiles: true, `cost` then the new best, for the first
// candidate and for each strictly cheaper one (ties keep the earlier candidate).
bool Cheapest(int64_t cost, bool* found, int64_t* best) {
  if (*found && cost >= *best) return false;
  *found = true;
  *best = cost;
  return true;
}

struct VecPlan : TileGeometry {
  int V, TH, tcv, slices, lanes, threads;
  int64_t stage_elems, smem, tiles_q, tiles_p, num_tiles, grid;
};

// Channel-last kernel: inner slice (tcv threads x V elements), output tile
// TP x TQ (one thread per strip of TH rows). Returns false if nothing fits.
bool PlanVec(const Conv2dParams& q, int elem_size, int V, VecPlan* out) {
  const bool chan_inner = q.layout == TensorLayout::kNHWC;
  const int64_t inner = chan_inner ? q.K : q.N;
  const int64_t outer = chan_inner ? q.N : q.K;
  const Shape shape = V == 1 ? Shape::kGeneric : FastShape(q);
  const int TH = StripRows(shape);
  const int64_t CV = CeilDiv(inner, V);
  const int64_t s0 = CeilDiv(CV, 32);

  bool found = false;
  int64_t best = 0;
  const int64_t slice_mults[] = {1, 2, 3, 4, 8, 16, 32, 64};
  int last_tcv = -1;
  for (int64_t m : slice_mults) {
    const int tcv = static_cast<int>(CeilDiv(CV, std::min(CV, s0 * m)));
    if (tcv == last_tcv) continue;
    last_tcv = tcv;
    const int64_t slices = CeilDiv(CV, tcv);
    for (int64_t tq_cap : {32, 16, 8, 4, 2, 1}) {
      const int TQ = Balanced(q.Q, tq_cap);
      for (int64_t tps_cap : {8, 4, 2, 1}) {
        const int TPs = Balanced(CeilDiv(q.P, TH), tps_cap);
        const int64_t threads = int64_t{tcv} * TQ * TPs;
        if (threads > dw::kMaxThreads) continue;
        const int TP = TPs * TH;
        const Halo halo = HaloOf(q, TP, TQ);
        const int64_t IH = halo.IH, IW = halo.IW, IWs = halo.IWs;
        const int64_t lanes = int64_t{tcv} * V;
        const int64_t stage_elems =
            RoundUp(IH * IWs * q.stride_w * lanes * elem_size, 16) / elem_size;
        const int64_t w_bytes = q.R * q.S * (chan_inner ? lanes : 1) * 4;
        const int64_t smem = 2 * stage_elems * elem_size + w_bytes;
        if (smem > kSmemBudget) continue;
        const int64_t tiles_q = CeilDiv(q.Q, TQ), tiles_p = CeilDiv(q.P, TP);
        int64_t tiles;
        if (!CheckedProduct({outer, tiles_p, tiles_q, slices}, &tiles) ||
            tiles > kInt32Max)
          continue;
        const int64_t cost = Score(
            tiles, TileCost(IH * IW * SectorBytes(lanes * elem_size),
                            int64_t{TP} * TQ * SectorBytes(lanes * elem_size), threads,
                            int64_t{TH} * V, q.R * q.S));
        if (!Cheapest(cost, &found, &best)) continue;
        VecPlan& v = *out;
        static_cast<TileGeometry&>(v) = GeometryOf(TP, TQ, halo);
        v.V = V;
        v.TH = TH;
        v.tcv = tcv;
        v.slices = static_cast<int>(slices);
        v.lanes = static_cast<int>(lanes);
        v.threads = static_cast<int>(threads);
        v.stage_elems = stage_elems;
        v.smem = smem;
        v.tiles_q = tiles_q;
        v.tiles_p = tiles_p;
        v.num_tiles = tiles;
        // Persistent grid: what fits on the GPU at once, a multiple of the
        // slice count so every CTA keeps one slice (NHWC: one weight set).
        int64_t grid = std::min(tiles, kNumSms * Residency(threads, smem));
        if (grid >= slices) grid -= grid % slices;
        v.grid = grid;
      }
    }
  }
  return found;
}

struct PlanePlan : TileGeometry {
  int TH, PL, threads, strips;
  int64_t smem, tiles_q, tiles_p, num_tiles;
};

bool PlanPlane(const Conv2dParams& q, int elem_size, PlanePlan* out) {
  const Shape shape = FastShape(q);
  const int TH = StripRows(shape);
  const int64_t planes = q.N * q.K;
  bool found = false;
  int64_t best = 0;
  for (int64_t tq_cap : {32, 16, 8, 4, 2, 1}) {
    const int TQ = Balanced(q.Q, tq_cap);
    for (int64_t tps_cap : {8, 4, 2, 1}) {
      const int TPs = Balanced(CeilDiv(q.P, TH), tps_cap);
      const int64_t strips = int64_t{TQ} * TPs;
      if (strips > dw::kMaxThreads) continue;
      const int TP = TPs * TH;
      const Halo halo = HaloOf(q, TP, TQ);
      const int64_t IH = halo.IH, IW = halo.IW, IWs = halo.IWs;
      const int64_t plane_bytes =
          IH * IWs * q.stride_w * 4 + (shape == Shape::kGeneric ? q.R * q.S * 4 : 0);
      int64_t PL = std::min<int64_t>(planes, dw::kMaxThreads / strips);
      PL = std::min(PL, kSmemBudget / plane_bytes);
      if (PL < 1) continue;
      PL = CeilDiv(planes, CeilDiv(planes, PL));  // even plane groups
      const int64_t tiles_q = CeilDiv(q.Q, TQ), tiles_p = CeilDiv(q.P, TP);
      int64_t tiles;
      if (!CheckedProduct({CeilDiv(planes, PL), tiles_p, tiles_q}, &tiles) ||
          tiles > kInt32Max)
        continue;
      const int64_t threads = PL * strips;
      // Scalar loads with index decode and conversion: count input bytes twice.
      const int64_t cost =
          Score(tiles, TileCost(2 * PL * IH * SectorBytes(IW * elem_size),
                                PL * TP * SectorBytes(TQ * elem_size), threads, TH,
                                q.R * q.S));
      if (!Cheapest(cost, &found, &best)) continue;
      PlanePlan& v = *out;
      static_cast<TileGeometry&>(v) = GeometryOf(TP, TQ, halo);
      v.TH = TH;
      v.PL = static_cast<int>(PL);
      v.threads = static_cast<int>(threads);
      v.strips = static_cast<int>(strips);
      v.smem = PL * plane_bytes;
      v.tiles_q = tiles_q;
      v.tiles_p = tiles_p;
      v.num_tiles = tiles;
    }
  }
  return found;
}

// Vector width the channel-last kernel can use, ignoring pointer alignment.
int VecWidth(const Conv2dParams& q) {
  if (q.layout == TensorLayout::kNHWC)
    return (q.K == q.C && q.C % kVec == 0) ? kVec : 1;
  return q.N % kVec == 0 ? kVec : 1;
}

// The fields dw::VecParams and dw::PlaneParams share: the conv's shape and attributes, the tile
// geometry and the divisors that decode tiles.
template <typename KernelParams>
void SetSharedKernelParams(const Conv2dParams& q, const TileGeometry& g, int64_t tiles_q,
                           int64_t tiles_p, KernelParams* kp) {
  kp->H = static_cast<int>(q.H);
  kp->W = static_cast<int>(q.W);
  kp->P = static_cast<int>(q.P);
  kp->Q = static_cast<int>(q.Q);
  kp->K = static_cast<int>(q.K);
  kp->R = static_cast<int>(q.R);
  kp->S = static_cast<int>(q.S);
  kp->stride_h = q.stride_h;
  kp->stride_w = q.stride_w;
  kp->pad_h = q.pad_h;
  kp->pad_w = q.pad_w;
  kp->dil_h = q.dil_h;
  kp->dil_w = q.dil_w;
  kp->TP = g.TP;
  kp->TQ = g.TQ;
  kp->IH = g.IH;
  kp->IW = g.IW;
  kp->IWs = g.IWs;
  kp->div_iw = dw::FastDivmod(g.IW);
  kp->div_tq = dw::FastDivmod(g.TQ);
  kp->div_tiles_q = dw::FastDivmod(static_cast<uint32_t>(tiles_q));
  kp->div_tiles_p = dw::FastDivmod(static_cast<uint32_t>(tiles_p));
  kp->div_stride_w = dw::FastDivmod(q.stride_w);
  kp->div_mult = dw::FastDivmod(static_cast<uint32_t>(q.K / q.C));
  kp->epilogue = q.epilogue;
}

template <typename T, bool kChanInner, int V>
void LaunchVec(Shape shape, const VecPlan& v, const T* x, const T* w,
               const T* bias, const T* residual, T* y, const dw::VecParams& kp,
               cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(v.grid));
  const dim3 block(static_cast<unsigned>(v.threads));
  const size_t smem = static_cast<size_t>(v.smem);
  if constexpr (V > 1) {
    if (shape == Shape::k3x3s1) {
      dw::dw_vec_kernel<T, kChanInner, V, 8, 3, 3, 1>
          <<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
      return;
    }
    if (shape == Shape::k3x3s2) {
      dw::dw_vec_kernel<T, kChanInner, V, 4, 3, 3, 2>
          <<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
      return;
    }
  }
  dw::dw_vec_kernel<T, kChanInner, V, 4, 0, 0, 0>
      <<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
}

template <typename T>
cudaError_t RunVec(const T* x, const T* w, const T* bias, T* y,
                   const Conv2dParams& q, cudaStream_t stream) {
  const bool chan_inner = q.layout == TensorLayout::kNHWC;
  int V = VecWidth(q);
  const T* residual = static_cast<const T*>(q.residual);
  if (V > 1 && !(IsAligned(x, V * sizeof(T)) && IsAligned(y, V * sizeof(T)) &&
                 IsAligned(residual, V * sizeof(T))))
    V = 1;
  VecPlan v{};
  if (!PlanVec(q, sizeof(T), V, &v)) {
    if (V == 1 || !PlanVec(q, sizeof(T), 1, &v)) return cudaErrorInvalidValue;
  }
  const Shape shape = v.V == 1 ? Shape::kGeneric : FastShape(q);

  dw::VecParams kp{};
  SetSharedKernelParams(q, v, v.tiles_q, v.tiles_p, &kp);
  kp.inner = static_cast<int>(chan_inner ? q.K : q.N);
  kp.x_inner = static_cast<int>(chan_inner ? q.C : q.N);
  kp.row_pitch = v.IWs * q.stride_w * v.lanes;
  kp.phase_pitch = v.IWs * v.lanes;
  kp.lanes = v.lanes;
  kp.tcv = v.tcv;
  kp.strips = v.threads / v.tcv;
  kp.stage_elems = static_cast<int>(v.stage_elems);
  kp.num_tiles = static_cast<int>(v.num_tiles);
  kp.div_tcv = dw::FastDivmod(v.tcv);
  kp.div_slices = dw::FastDivmod(v.slices);

  if (chan_inner) {
    if (v.V == kVec)
      LaunchVec<T, true, kVec>(shape, v, x, w, bias, residual, y, kp, stream);
    else
      LaunchVec<T, true, 1>(shape, v, x, w, bias, residual, y, kp, stream);
  } else {
    if (v.V == kVec)
      LaunchVec<T, false, kVec>(shape, v, x, w, bias, residual, y, kp, stream);
    else
      LaunchVec<T, false, 1>(shape, v, x, w, bias, residual, y, kp, stream);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t RunPlane(const T* x, const T* w, const T* bias, T* y,
                     const Conv2dParams& q, cudaStream_t stream) {
  PlanePlan v{};
  if (!PlanPlane(q, sizeof(T), &v)) return cudaErrorInvalidValue;
  const Shape shape = FastShape(q);

  dw::PlaneParams kp{};
  SetSharedKernelParams(q, v, v.tiles_q, v.tiles_p, &kp);
  kp.C = static_cast<int>(q.C);
  kp.planes = static_cast<int>(q.N * q.K);
  kp.PL = v.PL;
  kp.row_pitch = v.IWs * q.stride_w;
  kp.plane_pitch = v.IH * kp.row_pitch;
  kp.strips = v.strips;
  kp.num_tiles = static_cast<int>(v.num_tiles);
  kp.div_ih = dw::FastDivmod(v.IH);
  kp.div_strips = dw::FastDivmod(v.strips);
  kp.div_K = dw::FastDivmod(static_cast<uint32_t>(q.K));
  const T* residual = static_cast<const T*>(q.residual);

  const dim3 grid(static_cast<unsigned>(v.num_tiles));
  const dim3 block(static_cast<unsigned>(v.threads));
  const size_t smem = static_cast<size_t>(v.smem);
  switch (shape) {
    case Shape::k3x3s1:
      dw::dw_plane_kernel<T, 8, 3, 3, 1><<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
      break;
    case Shape::k3x3s2:
      dw::dw_plane_kernel<T, 4, 3, 3, 2><<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
      break;
    case Shape::kGeneric:
      dw::dw_plane_kernel<T, 4, 0, 0, 0><<<grid, block, smem, stream>>>(x, w, bias, residual, y, kp);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

const char* conv2d_depthwise_unsupported_reason(const Conv2dParams& q) {
  if (const char* reason = conv2d_params_unsupported_reason(q)) return reason;
  if (q.C < 1 || q.groups != q.C)
    return "not depthwise: the depthwise kernel needs groups == C >= 1";
  if (q.K < q.C || q.K % q.C != 0)
    return "not depthwise: K must be C * multiplier with multiplier >= 1";
  if (q.R < 1 || q.S < 1) return "empty filter window";
  if (q.stride_h < 1 || q.stride_w < 1) return "strides must be >= 1";
  if (q.dil_h < 1 || q.dil_w < 1) return "dilations must be >= 1";
  if (q.pad_h < 0 || q.pad_w < 0) return "pads must be >= 0";
  // int32 coordinates and FastDivmod dividends (< 2^31) in the kernels;
  // int64 global offsets.
  if (!FitsInt32(q.N) || !FitsInt32(q.H) || !FitsInt32(q.W) ||
      !FitsInt32(q.C) || !FitsInt32(q.K) || !FitsInt32(q.R) ||
      !FitsInt32(q.S) || !FitsInt32(q.P) || !FitsInt32(q.Q))
    return "a dimension exceeds int32";
  if (q.R > 1024 || q.S > 1024) return "filter window larger than 1024";
  if (q.P * q.stride_h + (q.R - 1) * q.dil_h + q.pad_h > kInt32Max ||
      q.Q * q.stride_w + (q.S - 1) * q.dil_w + q.pad_w > kInt32Max)
    return "receptive field coordinates exceed int32";
  int64_t unused;
  if (!CheckedProduct({q.N, q.H, q.W, q.C}, &unused) ||
      !CheckedProduct({q.N, q.P, q.Q, q.K}, &unused) ||
      !CheckedProduct({q.R, q.S, q.K}, &unused))
    return "element count overflows int64";
  if (q.N * q.K > kInt32Max) return "N * K exceeds int32";
  if (q.N * q.P * q.Q * q.K == 0) return nullptr;  // nothing to launch
  // fp32 is the largest element: a plan that fits for it fits for all types.
  if (UsesPlaneKernel(q)) {
    PlanePlan plan;
    if (!PlanPlane(q, 4, &plan))
      return "receptive field too large for the shared-memory tile";
  } else {
    VecPlan plan;
    if (!PlanVec(q, 4, VecWidth(q), &plan) && !PlanVec(q, 4, 1, &plan))
      return "receptive field too large for the shared-memory tile";
  }
  return nullptr;
}

template <typename T>
cudaError_t launch_conv2d_depthwise(const T* x, const T* w, const T* bias,
                                    T* y, const Conv2dParams& params,
                                    cudaStream_t stream) {
  if (conv2d_depthwise_unsupported_reason(params) != nullptr)
    return cudaErrorInvalidValue;
  if (params.N * params.P * params.Q * params.K == 0) return cudaSuccess;
  if (y == nullptr || w == nullptr) return cudaErrorInvalidValue;
  // An empty input is legal (the output is then the epilogue of zero), but a
  // non-empty one needs a pointer.
  if (x == nullptr && params.H * params.W > 0) return cudaErrorInvalidValue;
  return UsesPlaneKernel(params) ? RunPlane(x, w, bias, y, params, stream)
                                 : RunVec(x, w, bias, y, params, stream);
}

JAXCNN_CONV2D_LAUNCHER_INSTANTIATE(launch_conv2d_depthwise)

}  // namespace jaxcnn
