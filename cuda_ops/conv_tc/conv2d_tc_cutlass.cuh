// Assembly of the tensor-core conv kernels from CUTLASS 3.x parts:
//   mainloop  CUTLASS's sm90 implicit-GEMM fprop collective (im2col TMA for x,
//             tiled TMA for KRSC weights, wgmma, multi-stage mbarrier pipeline);
//   kernel    CUTLASS's persistent warp-specialized sm90 GEMM kernels
//             (cooperative / ping-pong). CUTLASS only pairs the conv
//             collective with its non-persistent kernel, so PersistentConvMainloop
//             below re-exposes it with the linearized GEMM problem
//             (M = N*P*Q, N = K, K = (C,S,R), L = 1) those kernels expect;
//   epilogue  ours: an EVT node y = act(acc + bias [+ residual]) (fp32), one
//             rounding to the output type, TMA store; the residual variant reads
//             the residual as the epilogue's source tensor C.
// Included only by the per-dtype instantiation files.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"  // before the conv headers, which use it
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/detail.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

#include "common/epilogue.cuh"
#include "conv_tc/conv2d_tc_configs.h"

namespace jaxcnn {
namespace conv_tc {

// ---------------------------------------------------------------------------
// Epilogue (common/epilogue.cuh): y = act(acc + bias + residual) in fp32, the activation a
// run-time code of the EVT node's arguments, so one instantiation serves every activation.

struct EpilogueArgs {
  int act = 0;  // Activation code
  float alpha = 0.0f;
};

// Sm90Compute instantiates the functor on ElementCompute (for its Arguments)
// and on Array<ElementCompute, N> (to compute); its inputs are the EVT node's
// children: (acc, bias) or (acc, bias, residual).
template <class T>
struct BiasResidualActivation {
  using Arguments = EpilogueArgs;
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& bias, Arguments const& args) const {
    return ApplyActivation(static_cast<Activation>(args.act), acc + bias, args.alpha);
  }
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& bias, T const& residual,
                                   Arguments const& args) const {
    return ApplyActivation(static_cast<Activation>(args.act), acc + bias + residual, args.alpha);
  }
};

template <class T, int N>
struct BiasResidualActivation<cutlass::Array<T, N>> {
  using Arguments = EpilogueArgs;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(
      cutlass::Array<T, N> const& acc, cutlass::Array<T, N> const& bias,
      Arguments const& args) const {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i)
      out[i] = ApplyActivation(static_cast<Activation>(args.act), acc[i] + bias[i], args.alpha);
    return out;
  }
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(
      cutlass::Array<T, N> const& acc, cutlass::Array<T, N> const& bias,
      cutlass::Array<T, N> const& residual, Arguments const& args) const {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i)
      out[i] = ApplyActivation(static_cast<Activation>(args.act), acc[i] + bias[i] + residual[i],
                               args.alpha);
    return out;
  }
};

template <class ElementBias, class TileShape>
using BiasBroadcast = cutlass::epilogue::fusion::Sm90RowBroadcast<
    0, TileShape, ElementBias, float, cute::Stride<cute::_0, cute::_1, cute::_0>>;

// y = act(acc + bias[n]) -> ElementD. A null bias pointer reads as 0.
template <class ElementD, class ElementBias, class TileShape>
using BiasActEpilogueOp = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<
        BiasResidualActivation, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast<ElementBias, TileShape>>;

// y = act(acc + bias[n] + C[m, n]) -> ElementD, C (the residual) the epilogue's source tensor.
template <class ElementD, class ElementBias, class TileShape>
using BiasResidualActEpilogueOp = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<
        BiasResidualActivation, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast<ElementBias, TileShape>,
    cutlass::epilogue::fusion::Sm90SrcFetch<ElementD>>;

// ---------------------------------------------------------------------------
// Mainloop adapter: CUTLASS's conv collective under a persistent GEMM kernel.

// kPromoteKTiles > 0: two-level accumulation (what CUTLASS's FP8 mainloop
// does with GmmaFP8Accumulation). Hopper's wgmma adds into its fp32
// accumulator with truncated alignment, so its error grows ~linearly with the
// GEMM-K length (3xTF32: ~7e-9 * K relative, 3e-5 at K = 4608). Here the
// wgmmas accumulate kPromoteKTiles k-tiles into a zeroed temporary, which is
// then added into the real accumulator with ordinary round-to-nearest FP32
// adds: the wgmma error is that of a kPromoteKTiles-long sum, the long sum is
// fp32 RN. Costs a second accumulator fragment (the tiles of the promoted
// family are sized for it) and one wgmma drain per promotion.
//
// kBMnMajor: the weights are read straight from HWIO [R,S,C,K] (GEMM B with
// its N mode, the output channels, contiguous: "MN-major"), 16-bit types only
// (wgmma transposes 16-bit B operands from shared memory; TF32 needs K-major,
// so fp32 keeps the KRSC copy). CUTLASS's conv collective hard-codes a K-major
// filter (StrideB (k, (_1, s, r))), so for this case the adapter builds its
// own B TMA descriptor (and with it Params, load_init, load, mma); the
// collective's A side (im2col TMA), shared storage and pipeline are reused.
template <class ConvCollective, class KernelSchedule, int kPromoteKTiles = 0,
          bool kBMnMajor = false>
struct PersistentConvMainloop : ConvCollective {
  using Base = ConvCollective;
  using ConvShape = typename Base::ProblemShape;  // ConvProblemShape<kFprop, 2>
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using TileShape = typename Base::TileShape;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  using InternalElementA = typename Base::InternalElementA;
  using InternalElementB = typename Base::InternalElementB;
  // Own mma for promotion or MN-major B (the collective's takes its Params).
  static constexpr bool kOwnMma = kPromoteKTiles > 0 || kBMnMajor;

  // The persistent kernels dispatch on DispatchPolicy::Schedule; everything
  // else (stages, cluster, arch) stays the collective's own.
  struct DispatchPolicy : Base::DispatchPolicy {
    using Schedule = KernelSchedule;
  };
  static constexpr int NumProducerThreadEvents = 1;  // one TMA-issuing thread
  // The GEMM kernels only check that these are rank 3 ([M|N, K, L]).
  using StrideA = decltype(cute::append(typename Base::StrideA{}, int64_t{}));
  using StrideB = decltype(cute::append(typename Base::StrideB{}, int64_t{}));

  // HWIO filter as GEMM B (k, (c, s, r)): k contiguous.
  using StrideBMn = cute::Stride<cute::_1, cute::Stride<int64_t, int64_t, int64_t>>;

  // The collective's im2col TMA for x (its own builder is private).
  template <class TensorA>
  static constexpr auto make_tma_a(TensorA const& tensor_a,
                                   ConvShape const& problem_shape) {
    using namespace cute;
    namespace cdetail = cutlass::conv::collective::detail;
    constexpr int kSpatial = 2;
    auto lower_corner_whd = cdetail::compute_lower_corner_whd(problem_shape);
    auto upper_corner_whd = cdetail::compute_upper_corner_whd(problem_shape);
    auto lower_srt = cdetail::compute_lower_srt(problem_shape);
    cute::array<int32_t, kSpatial> stride_srt{};
    for (int i = 0; i < kSpatial; ++i)
      stride_srt[i] = problem_shape.dilation[kSpatial - 1 - i];
    return make_im2col_tma_copy(
        typename Base::GmemTiledCopyA{}, tensor_a,
        typename Base::SmemLayoutA{}(_, _, _0{}),
        product_each(shape(typename Base::SmemLayoutA{}(_, _, _0{}))),
        size<1>(ClusterShape{}), shape(lower_corner_whd), shape(upper_corner_whd),
        cute::reverse(shape(problem_shape.lower_padding)),
        cute::reverse(shape(problem_shape.upper_padding)),
        cute::reverse(shape(problem_shape.traversal_stride)), shape(lower_srt),
        shape(stride_srt));
  }

  // Tiled TMA for the HWIO weights, multicast across the cluster's M.
  template <class TensorB>
  static constexpr auto make_tma_b_mn(TensorB const& tensor_b) {
    using namespace cute;
    return make_tma_copy(typename Base::GmemTiledCopyB{}, tensor_b,
                         typename Base::SmemLayoutB{}(_, _, _0{}),
                         make_shape(shape<1>(TileShape{}), shape<2>(TileShape{})),
                         size<0>(ClusterShape{}));
  }

  struct ParamsMn {
    using SubmodeA = decltype(cute::take<0, 3>(typename ConvShape::TensorExtent{}));
    using TensorShapeA = decltype(cute::make_shape(SubmodeA{}, int(0)));
    using TensorShapeB = decltype(cute::repeat_like(StrideBMn{}, int32_t(0)));
    using TMA_A = decltype(make_tma_a(
        cute::make_tensor(cute::make_gmem_ptr(static_cast<InternalElementA const*>(nullptr)),
                          cute::make_layout(TensorShapeA{}, typename Base::StrideA{})),
        ConvShape{}));
    using TMA_B = decltype(make_tma_b_mn(cute::make_tensor(
        cute::make_gmem_ptr(static_cast<InternalElementB const*>(nullptr)),
        cute::make_layout(TensorShapeB{}, StrideBMn{}))));
    TMA_A tma_load_a;
    TMA_B tma_load_b;
    uint32_t tma_transaction_bytes = Base::TmaTransactionBytes;
  };
  using Params = std::conditional_t<kBMnMajor, ParamsMn, typename Base::Params>;

  // The TMA descriptors are built from the conv shape, not the GEMM one.
  // With kBMnMajor, ptr_B is HWIO [R,S,C,K] (the shape is problem.shape_B,
  // KRSC-ordered as CUTLASS keeps it; its strides are not used).
  struct Arguments {
    typename Base::ElementA const* ptr_A = nullptr;
    typename Base::ElementB const* ptr_B = nullptr;
    ConvShape problem{};
  };

  template <class GemmShape>
  static Params to_underlying_arguments(GemmShape const&, Arguments const& args,
                                        void* workspace) {
    if constexpr (kBMnMajor) {
      using namespace cute;
      auto dA = cutlass::make_cute_packed_stride(typename Base::StrideA{}, args.problem.stride_A,
                                        cutlass::conv::Operator::kFprop);
      Tensor tensor_a = make_tensor(
          make_gmem_ptr(reinterpret_cast<InternalElementA const*>(args.ptr_A)),
          make_layout(args.problem.get_shape_A(), dA));
      const auto& f = args.problem.shape_B;  // [K, R, S, C]
      const int32_t k = f[0], r = f[1], s = f[2], c = f[3];
      (void)r;
      StrideBMn dB{};
      get<1, 0>(dB) = int64_t(k);
      get<1, 1>(dB) = int64_t(c) * k;
      get<1, 2>(dB) = int64_t(s) * c * k;
      typename ParamsMn::TensorShapeB shape_b{};
      get<0>(shape_b) = k;
      get<1, 0>(shape_b) = c;
      get<1, 1>(shape_b) = s;
      get<1, 2>(shape_b) = r;
      Tensor tensor_b = make_tensor(
          make_gmem_ptr(reinterpret_cast<InternalElementB const*>(args.ptr_B)),
          make_layout(shape_b, dB));
      (void)workspace;
      return ParamsMn{make_tma_a(tensor_a, args.problem), make_tma_b_mn(tensor_b),
                      Base::TmaTransactionBytes};
    } else {
      return Base::to_underlying_arguments(
          args.problem, typename Base::Arguments{args.ptr_A, args.ptr_B},
          workspace);
    }
  }

  // For kBMnMajor the collective checks the KRSC strides the problem carries
  // (C-aligned); the launcher also requires K % 8 == 0 (16-byte HWIO rows).
  template <class GemmShape>
  static bool can_implement(GemmShape const&, Arguments const& args) {
    return Base::can_implement(
        args.problem, typename Base::Arguments{args.ptr_A, args.ptr_B});
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_load_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b.get_tma_descriptor());
  }

  // The persistent kernels index (BLK,BLK_K,m|n,k,l); the collective has no
  // l mode, so a unit one is appended here and dropped again in load().
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_mnkl,
                                Params const& params) {
    if constexpr (kBMnMajor) {
      using namespace cute;
      using X = Underscore;
      auto [M, N, K, L] = problem_shape_mnkl;
      Tensor mA_mk = params.tma_load_a.get_tma_tensor(make_shape(M, K));
      Tensor mB_nk = params.tma_load_b.get_tma_tensor(make_shape(N, K));
      Tensor gA_mk = local_tile(mA_mk, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
      Tensor gB_nk = local_tile(mB_nk, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
      return cute::make_tuple(append_unit_mode(gA_mk), append_unit_mode(gB_nk));
    } else {
      auto inputs = Base::load_init(problem_shape_mnkl, params);
      auto gA = cute::get<0>(inputs);
      auto gB = cute::get<1>(inputs);
      return cute::make_tuple(append_unit_mode(gA), append_unit_mode(gB));
    }
  }

  // x's im2col TMA tensor has a composed layout (TMA basis o offset o GEMM
  // coordinates): the unit mode goes on the GEMM-coordinate side. The weight
  // tensor's layout is a plain basis-strided one.
  template <class TmaTensor>
  CUTLASS_DEVICE static auto append_unit_mode(TmaTensor const& t) {
    auto const& layout = t.layout();
    auto unit = cute::make_layout(cute::_1{}, cute::_0{});
    if constexpr (cute::is_composed_layout<cute::remove_cvref_t<decltype(layout)>>::value) {
      return cute::make_tensor(
          t.data(), cute::make_composed_layout(layout.layout_a(), layout.offset(),
                                               cute::append(layout.layout_b(), unit)));
    } else {
      return cute::make_tensor(t.data(), cute::append(layout, unit));
    }
  }

  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_producer_state,
                           cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using cute::_;
    if constexpr (kBMnMajor) {
      load_mn(params, pipeline, smem_pipe_producer_state, cute::get<0>(inputs)(_, _, _, _, 0),
              cute::get<1>(inputs)(_, _, _, _, 0), blk_coord, k_tile_iter,
              k_tile_count, block_rank_in_cluster, shared_tensors);
    } else {
      Base::load(params, pipeline, smem_pipe_producer_state,
                 cute::make_tuple(cute::get<0>(inputs)(_, _, _, _, 0),
                                  cute::get<1>(inputs)(_, _, _, _, 0)),
                 blk_coord, k_tile_iter, k_tile_count, thread_idx,
                 block_rank_in_cluster, shared_tensors);
    }
  }

  // The collective's producer loop, on ParamsMn.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load_mn(Params const& params, MainloopPipeline pipeline,
                              PipelineState smem_pipe_producer_state,
                              TensorA const& gA_mk, TensorB const& gB_nk,
                              BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                              int k_tile_count, uint32_t block_rank_in_cluster,
                              TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                            typename Base::SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                            typename Base::SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    constexpr uint32_t cluster_shape_x = get<0>(ClusterShape());
    uint2 cluster_local_block_id = {block_rank_in_cluster % cluster_shape_x,
                                    block_rank_in_cluster / cluster_shape_x};
    auto block_tma_a = params.tma_load_a.get_slice(cluster_local_block_id.y);
    auto block_tma_b = params.tma_load_b.get_slice(cluster_local_block_id.x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gA = gA_mk(_, _, m_coord, _);  // (BLK_M,BLK_K,k)
    Tensor gB = gB_nk(_, _, n_coord, _);  // (BLK_N,BLK_K,k)
    Tensor tAgA = block_tma_a.partition_S(gA);
    Tensor tAsA = block_tma_a.partition_D(sA);
    Tensor tBgB = block_tma_b.partition_S(gB);
    Tensor tBsB = block_tma_b.partition_D(sB);

    uint16_t mcast_mask_a = 0;
    uint16_t mcast_mask_b = 0;
    using GmemTiledCopyA = typename Base::GmemTiledCopyA;
    using GmemTiledCopyB = typename Base::GmemTiledCopyB;
    if constexpr (cute::is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_IM2COL_MULTICAST> ||
                  cute::is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<ClusterShape>{};
      for (int n = 0; n < size<1>(block_layout); ++n)
        mcast_mask_a |= (uint16_t(1) << block_layout(cluster_local_block_id.x, n, Int<0>{}));
    }
    if constexpr (cute::is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_IM2COL_MULTICAST> ||
                  cute::is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<ClusterShape>{};
      for (int m = 0; m < size<0>(block_layout); ++m)
        mcast_mask_b |= (uint16_t(1) << block_layout(m, cluster_local_block_id.y, Int<0>{}));
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_producer_state);
      using BarrierType = typename MainloopPipeline::ProducerBarrierType;
      BarrierType* tma_barrier = pipeline.producer_get_barrier(smem_pipe_producer_state);
      const int write_stage = smem_pipe_producer_state.index();
      copy(params.tma_load_a.with(*tma_barrier, mcast_mask_a),
           tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, write_stage));
      copy(params.tma_load_b.with(*tma_barrier, mcast_mask_b),
           tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, write_stage));
      ++k_tile_iter;
      ++smem_pipe_producer_state;
    }
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& params) {
    if constexpr (!kOwnMma) {
      Base::mma(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx,
                shared_tensors, params);
    } else {
      mma_own(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx,
              shared_tensors);
    }
  }

  CUTLASS_DEVICE void mma_tail(MainloopPipeline pipeline,
                               PipelineState smem_pipe_release, int k_tile_count) {
    if constexpr (!kOwnMma) {
      Base::mma_tail(pipeline, smem_pipe_release, k_tile_count);
    } else {
      // mma_own drained its wgmmas and released every stage it read.
      cute::warpgroup_wait<0>();
    }
  }

  // One k-tile of wgmmas in flight (its stage is released once the next
  // k-tile's batch is issued and the older one retired). With promotion
  // (kPromoteKTiles > 0) the wgmmas sum into a temporary and every
  // kPromoteKTiles k-tiles (and at the end): drain, accum += temp, zero temp
  // (ScaleOut::Zero on its next wgmma), release every stage still held.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma_own(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                              FrgTensorC& accum, int k_tile_count, int thread_idx,
                              TensorStorage& shared_tensors) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    constexpr bool kPromote = kPromoteKTiles > 0;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                            typename Base::SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                            typename Base::SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    typename Base::TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor tCsA = thread_mma.partition_A(sA);
    Tensor tCsB = thread_mma.partition_B(sB);
    Tensor tCrA = thread_mma.make_fragment_A(tCsA);  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(tCsB);  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<2>(accum));
    CUTE_STATIC_ASSERT_V(size<2>(tCsA) == size<2>(tCsB));

    // What the wgmmas add into: a temporary with promotion, else accum.
    decltype(auto) accum_mma = [&]() -> decltype(auto) {
      if constexpr (kPromote) return make_fragment_like(accum);
      else return (accum);
    }();
    if constexpr (kPromote) clear(accum);
    PipelineState smem_pipe_release = smem_pipe_read;
    int held = 0;      // stages read and not yet released
    int in_group = 0;  // k-tiles summed in accum_mma since the last promotion
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.consumer_wait(smem_pipe_read);
      const int read_stage = smem_pipe_read.index();
      warpgroup_fence_operand(accum_mma);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage),
                   tCrB(_, _, k_block, read_stage), accum_mma);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      ++smem_pipe_read;
      ++held;
      if (k_tile_count == 1 || (kPromote && ++in_group == kPromoteKTiles)) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(accum_mma);
        if constexpr (kPromote) {
          warpgroup_fence_operand(accum);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(accum); ++i) accum(i) += accum_mma(i);
          warpgroup_fence_operand(accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
          in_group = 0;
        }
        for (; held > 0; --held) {
          pipeline.consumer_release(smem_pipe_release);
          ++smem_pipe_release;
        }
      } else {
        warpgroup_wait<1>();  // the previous k-tile's batch has retired
        warpgroup_fence_operand(accum_mma);
        for (; held > 1; --held) {
          pipeline.consumer_release(smem_pipe_release);
          ++smem_pipe_release;
        }
      }
    }
    warpgroup_fence_operand(accum);
  }
};

// ---------------------------------------------------------------------------
// One kernel configuration. Element: cutlass::bfloat16_t, cutlass::half_t or
// float (TF32 tensor cores; TMA hands the wgmma the fp32 bits, which it reads
// as TF32).

// PromoteK > 0 (GEMM-K elements): two-level accumulation every
// max(1, PromoteK / TileK) k-tiles (see PersistentConvMainloop).
// BMnMajor: B read from HWIO directly (16-bit types only, see
// PersistentConvMainloop).
// Residual: the epilogue reads the residual as its source tensor C (a separate instantiation:
// the source's shared-memory buffers and loads would cost every conv without one).
template <class Element, int TileM, int TileN, int TileKBytes, int ClusterM,
          bool Cooperative, int PromoteK = 0, bool BMnMajor = false, bool Residual = false>
struct TcConvKernel {
  static constexpr bool kResidual = Residual;
  using ElementMma =
      std::conditional_t<std::is_same_v<Element, float>, cutlass::tfloat32_t,
                         Element>;
  static constexpr int kTileK = TileKBytes / int(sizeof(Element));
  static constexpr int kAlign = 16 / int(sizeof(Element));  // 16-byte TMA rows
  static_assert(!BMnMajor || sizeof(Element) == 2,
                "wgmma reads MN-major B only for 16-bit types");
  static constexpr cute::GMMA::Major kMajorB =
      BMnMajor ? cute::GMMA::Major::MN : cute::GMMA::Major::K;

  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>,
                                cute::Shape<cute::Int<kTileK>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::_1, cute::_1>;
  using KernelSchedule =
      std::conditional_t<Cooperative,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                         cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule =
      std::conditional_t<Cooperative,
                         cutlass::epilogue::TmaWarpSpecializedCooperative,
                         cutlass::epilogue::TmaWarpSpecialized>;

  // y is [N*P*Q, K] row-major; the source tensor C is the residual (same shape), or none.
  using ElementC = std::conditional_t<Residual, Element, void>;
  using EpilogueOp =
      std::conditional_t<Residual, BiasResidualActEpilogueOp<Element, Element, TileShape>,
                         BiasActEpilogueOp<Element, Element, TileShape>>;
  using CollectiveEpilogue =
      typename cutlass::epilogue::collective::CollectiveBuilder<
          cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape,
          ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float,
          float, ElementC, cutlass::layout::RowMajor, kAlign, Element,
          cutlass::layout::RowMajor, kAlign, EpilogueSchedule, EpilogueOp>::CollectiveOp;

  // As many stages as fit beside the epilogue's shared memory (the
  // persistent kernels keep both alive), capped: past ~8 more stages only
  // add barrier traffic.
  static constexpr int kStagesFit =
      cutlass::conv::collective::detail::compute_stage_count_or_override<
          cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
          ElementMma, ElementMma, TileShape>(
          cutlass::conv::collective::StageCountAutoCarveout<
              int(sizeof(typename CollectiveEpilogue::SharedStorage)) + 1024>{});
  static constexpr int kStages = kStagesFit < 8 ? kStagesFit : 8;
  static_assert(kStages >= 2, "tile too large for shared memory");

  // What conv::collective::CollectiveBuilder does for its own schedule, with
  // the cooperative kernel's two consumer warpgroups split along M.
  using AtomLayout =
      std::conditional_t<Cooperative, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>,
                         cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<ElementMma, ElementMma, float, TileShape,
                                 cute::GMMA::Major::K, kMajorB>(),
      AtomLayout{}));
  // x: im2col TMA, no multicast (CTAs of the 2x1 cluster read different
  // pixels); w: multicast to the cluster (same output channels).
  using GmemTiledCopyA = decltype(
      cutlass::conv::collective::detail::sm90_cluster_shape_to_im2col_tma_atom(
          cute::shape<1>(ClusterShape{})));
  using GmemTiledCopyB =
      decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
          cute::shape<0>(ClusterShape{})));
  using SmemLayoutAtomA =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<
               cute::GMMA::Major::K, ElementMma,
               decltype(cute::get<0>(TileShape{})),
               decltype(cute::get<2>(TileShape{}))>());
  using SmemLayoutAtomB =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<
               kMajorB, ElementMma,
               decltype(cute::get<1>(TileShape{})),
               decltype(cute::get<2>(TileShape{}))>());
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemLayoutAtomA{},
      cute::make_shape(cute::shape<0>(TileShape{}), cute::shape<2>(TileShape{}),
                       cute::Int<kStages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemLayoutAtomB{},
      cute::make_shape(cute::shape<1>(TileShape{}), cute::shape<2>(TileShape{}),
                       cute::Int<kStages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using ConvPolicy = cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<
      cutlass::conv::Operator::kFprop, kStages, /*NumSpatialDims=*/2,
      ClusterShape, cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>;
  using ConvCollective = cutlass::conv::collective::CollectiveConv<
      ConvPolicy, TileShape, Element, Element, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<
          GmemTiledCopyA, SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<
          GmemTiledCopyB, SmemLayoutB>>;
  static constexpr int kPromoteKTiles =
      PromoteK == 0 ? 0 : (PromoteK / kTileK > 0 ? PromoteK / kTileK : 1);
  using CollectiveMainloop =
      PersistentConvMainloop<ConvCollective, KernelSchedule, kPromoteKTiles, BMnMajor>;
  using ConvShape = typename ConvCollective::ProblemShape;
  // (M = N*P*Q, N = K, K = (C,S,R), L); L stays dynamic because the
  // epilogue's TMA descriptor type is declared with a dynamic batch mode.
  using ProblemShape =
      cute::Shape<int, int, cute::Shape<int, int, int>, int>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      ProblemShape, CollectiveMainloop, CollectiveEpilogue, void>;
  static_assert(Kernel::SharedStorageSize <=
                    cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "kernel shared memory exceeds the sm90 limit");
};

// ---------------------------------------------------------------------------
// Host side: TcProblem -> CUTLASS arguments -> launch.

template <class Config>
struct TcConvRunner {
  using Kernel = typename Config::Kernel;
  using Element = std::conditional_t<
      std::is_same_v<typename Config::ElementMma, cutlass::tfloat32_t>, float,
      typename Config::ElementMma>;
  using ConvShape = typename Config::ConvShape;

  // Fills `args`; false if CUTLASS's output extents differ from ours.
  static bool make_arguments(const TcProblem& p, typename Kernel::Arguments* args) {
    typename ConvShape::TensorExtent shape_act{};
    typename ConvShape::TensorStride stride_act{};
    typename ConvShape::TensorExtent shape_flt{};
    typename ConvShape::TensorStride stride_flt{};
    shape_act[0] = p.N; shape_act[1] = p.H_eff; shape_act[2] = p.W_eff; shape_act[3] = p.C;
    stride_act[0] = p.x_stride_n; stride_act[1] = p.x_stride_h;
    stride_act[2] = p.x_stride_w; stride_act[3] = 1;
    shape_flt[0] = p.K; shape_flt[1] = p.R; shape_flt[2] = p.S; shape_flt[3] = p.C;
    stride_flt[0] = int64_t(p.R) * p.S * p.C; stride_flt[1] = int64_t(p.S) * p.C;
    stride_flt[2] = p.C; stride_flt[3] = 1;
    typename ConvShape::ShapePadding lower{}, upper{};
    typename ConvShape::TraversalStride tstride{};
    typename ConvShape::ShapeDilation dilation{};
    lower[0] = p.pad_top; lower[1] = p.pad_left;
    upper[0] = p.pad_bottom; upper[1] = p.pad_right;
    tstride[0] = p.stride_h; tstride[1] = p.stride_w;
    dilation[0] = p.dil_h; dilation[1] = p.dil_w;
    const ConvShape conv(cutlass::conv::Mode::kCrossCorrelation, shape_act,
                         stride_act, shape_flt, stride_flt, lower, upper,
                         tstride, dilation, /*groups=*/1);
    if (conv.shape_C[0] != p.N || conv.shape_C[1] != p.P ||
        conv.shape_C[2] != p.Q || conv.shape_C[3] != p.K)
      return false;

    const int64_t gemm_m = int64_t(p.N) * p.P * p.Q;
    args->mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args->problem_shape = typename Config::ProblemShape{
        static_cast<int>(gemm_m), p.K, cute::make_shape(p.C, p.S, p.R), 1};
    args->mainloop.ptr_A = static_cast<Element const*>(p.x);
    args->mainloop.ptr_B = static_cast<Element const*>(p.w);
    args->mainloop.problem = conv;
    auto& epi = args->epilogue;
    // EVT arguments: children (acc, bias[, residual]) first, then the node's own.
    const EpilogueArgs act{p.act, p.alpha};
    if constexpr (Config::kResidual) {
      if (p.residual == nullptr) return false;
      epi.thread = {{}, {static_cast<Element const*>(p.bias), Element(0), {}}, {}, act};
      epi.ptr_C = static_cast<Element const*>(p.residual);
      epi.dC = typename Kernel::StrideC{int64_t(p.K), cute::_1{}, gemm_m * p.K};
    } else {
      if (p.residual != nullptr) return false;
      epi.thread = {{}, {static_cast<Element const*>(p.bias), Element(0), {}}, act};
      epi.ptr_C = nullptr;
    }
    epi.ptr_D = static_cast<Element*>(p.y);
    epi.dD = typename Kernel::StrideD{p.y_stride_pixel, cute::_1{}, gemm_m * p.y_stride_pixel};
    args->hw_info.device_id = p.device;
    args->hw_info.sm_count = p.sm_count;
    return true;
  }

  static size_t workspace_bytes(const TcProblem& p) {
    typename Kernel::Arguments args{};
    if (!make_arguments(p, &args)) return 0;
    return Kernel::get_workspace_size(args);
  }

  static cudaError_t run(const TcProblem& p, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    typename Kernel::Arguments args{};
    if (!make_arguments(p, &args)) return cudaErrorInvalidValue;
    if (!Kernel::can_implement(args)) return cudaErrorInvalidValue;
    if (Kernel::get_workspace_size(args) > workspace_bytes)
      return cudaErrorInvalidValue;
    if (Kernel::initialize_workspace(args, workspace, stream) !=
        cutlass::Status::kSuccess)
      return cudaErrorInvalidValue;
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);

    const void* kernel_fn =
        reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
    const int smem_bytes = Kernel::SharedStorageSize;
    // Opt in to > 48 KiB of dynamic shared memory once per device.
    static std::atomic<uint64_t> configured_devices{0};
    const uint64_t bit = p.device < 64 ? (uint64_t{1} << p.device) : 0;
    if (bit == 0 || (configured_devices.load(std::memory_order_acquire) & bit) == 0) {
      const cudaError_t st = cudaFuncSetAttribute(
          kernel_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      if (st != cudaSuccess) return st;
      configured_devices.fetch_or(bit, std::memory_order_acq_rel);
    }

    cudaLaunchConfig_t config{};
    config.gridDim = Kernel::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cute::size<0>(typename Config::ClusterShape{});
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    void* kernel_args[] = {&params};
    return cudaLaunchKernelExC(&config, kernel_fn, kernel_args);
  }

  static constexpr TcKernelOps ops() { return {&workspace_bytes, &run}; }
};

}  // namespace conv_tc
}  // namespace jaxcnn
