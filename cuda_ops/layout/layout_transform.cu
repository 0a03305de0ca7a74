// Layout-transform launcher: reduce the direction to a copy or a batched
// transpose, pick the tile and the vector widths, launch.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "common/host_arith.h"
#include "layout/layout_transform.h"
#include "layout/layout_transform_kernel.cuh"

namespace jaxcnn {
namespace {

namespace lt = layout_transform;

// Logical axes of the reduced problem (H and W merge into S).
enum Axis : int { kAxisN = 0, kAxisC = 1, kAxisS = 2 };

// Outermost to innermost.
void AxisOrder(TensorLayout layout, int order[3]) {
  switch (layout) {
    case TensorLayout::kNHWC: order[0] = kAxisN; order[1] = kAxisS; order[2] = kAxisC; return;
    case TensorLayout::kNCHW: order[0] = kAxisN; order[1] = kAxisC; order[2] = kAxisS; return;
    case TensorLayout::kCHWN: order[0] = kAxisC; order[1] = kAxisS; order[2] = kAxisN; return;
  }
}

// One axis of the reduced problem: a run of original axes merged together.
struct Group {
  int first;     // original axis leading the run (in the source order)
  int64_t size;  // product of the merged sizes
};

int Log2Ceil(int64_t v) {
  int log = 0;
  while ((int64_t{1} << log) < v) ++log;
  return log;
}

// The plan's transpose extents and strides, as both kernels' parameters (lt::PackedParams,
// lt::TransposeParams) name them.
template <typename KernelParams>
void SetPlanExtents(const LayoutTransformPlan& plan, KernelParams* p) {
  p->I = plan.I;
  p->J = plan.J;
  p->in_stride_b = plan.in_stride_b;
  p->in_stride_i = plan.in_stride_i;
  p->out_stride_b = plan.out_stride_b;
  p->out_stride_j = plan.out_stride_j;
}

struct TileShape {
  int log_tb, log_ti, log_tj;
};

int64_t CountTiles(const LayoutTransformPlan& plan, const TileShape& t) {
  auto tiles = [](int64_t extent, int log) {
    return (extent + (int64_t{1} << log) - 1) >> log;
  };
  return tiles(plan.B, t.log_tb) * tiles(plan.I, t.log_ti) *
         tiles(plan.J, t.log_tj);
}

// Small tensors (batch 1) would give a few dozen blocks: shrink tiles down to
// 1024 elements while the halved tiles still fit in one wave of resident
// blocks (SMs x kMinBlocksPerSm), so every SM gets work without a tail wave
// (a fixed 512-tile target overshot 528 resident blocks on 132 SMs: 784
// tiles, two rounds of latency).
constexpr int kLogMinTileElems = 10;

// SMs of the current device; 132 (H100/H200 SXM) when the query fails, its error cleared so
// that the launch does not report it.
int CurrentSmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess || sms <= 0) {
    cudaGetLastError();
    sms = 132;
  }
  return sms;
}

int64_t ResidentBlocks() { return int64_t{CurrentSmCount()} * lt::kMinBlocksPerSm; }

// Both sides need long contiguous runs: TJ covers j (the input's contiguous
// axis), TI covers i (the output's). A short extent is covered whole and the
// freed tile budget goes to the other axis, then to the batch.
// log_load_w / log_store_w: vector widths the tile sides must keep.
TileShape ChooseTile(const LayoutTransformPlan& plan, int tile_elems,
                     int log_load_w, int log_store_w) {
  const int log_cap = Log2Ceil(tile_elems);
  const int log_max_dim = Log2Ceil(lt::kMaxTileDim);
  int log_tj = std::min(Log2Ceil(plan.J), log_max_dim);
  int log_ti = std::min(Log2Ceil(plan.I), log_max_dim);
  if (log_tj < log_max_dim)
    log_ti = std::min(Log2Ceil(plan.I), log_cap - log_tj);
  else if (log_ti < log_max_dim)
    log_tj = std::min(Log2Ceil(plan.J), log_cap - log_ti);
  // Halved tiles (scalar loads, 8-byte elements) shorten the longer side.
  while (log_ti + log_tj > log_cap) (log_ti >= log_tj ? log_ti : log_tj) -= 1;
  TileShape t{0, log_ti, log_tj};
  t.log_tb = std::max(0, std::min(Log2Ceil(plan.B), log_cap - log_ti - log_tj));
  // Runs stay >= 16 elements (and >= a vector) on both sides.
  const int log_min_ti = std::min(log_ti, std::max(4, log_store_w));
  const int log_min_tj = std::min(log_tj, std::max(4, log_load_w));
  const int64_t resident = ResidentBlocks();
  while (2 * CountTiles(plan, t) <= resident &&
         t.log_tb + t.log_ti + t.log_tj > kLogMinTileElems) {
    if (t.log_tb > 0) {
      --t.log_tb;
    } else if (t.log_ti >= t.log_tj && t.log_ti > log_min_ti) {
      --t.log_ti;
    } else if (t.log_tj > log_min_tj) {
      --t.log_tj;
    } else if (t.log_ti > log_min_ti) {
      --t.log_ti;
    } else {
      break;
    }
  }
  return t;
}

template <typename E, bool kVecLoad, bool kVecStore>
cudaError_t LaunchTranspose(const E* x, E* y, const lt::TransposeParams& p,
                            cudaStream_t stream) {
  const size_t smem_bytes =
      (size_t{1} << (p.log_tb + p.log_ti)) *
      ((size_t{1} << p.log_tj) + lt::SmemPad<E>()) * sizeof(E);
  // Enough blocks to fill the GPU several times over; larger problems loop.
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(p.num_tiles, kMaxBlocks));
  lt::transpose_kernel<E, kVecLoad, kVecStore>
      <<<blocks, lt::kThreads, smem_bytes, stream>>>(x, y, p);
  return cudaGetLastError();
}

// Blocks of the packed kernel resident on the whole GPU at once for a given
// dynamic shared-memory size (cached per element size and tile size).
template <int kBytes>
int64_t PackedResidentBlocks(size_t smem_bytes) {
  static std::atomic<int> per_sm_cache[16];  // by log2(smem_bytes)
  const int sms = CurrentSmCount();
  const int slot = std::min(15, Log2Ceil(static_cast<int64_t>(smem_bytes)));
  int per_sm = per_sm_cache[slot].load(std::memory_order_relaxed);
  if (per_sm <= 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, lt::transpose_packed_kernel<kBytes>, lt::kPackedThreads,
            smem_bytes) != cudaSuccess ||
        per_sm <= 0) {
      cudaGetLastError();
      per_sm = 4;
    }
    per_sm_cache[slot].store(per_sm, std::memory_order_relaxed);
  }
  return int64_t{per_sm} * sms;
}

// Packed kernel: 1-, 2- or 4-byte elements, 16-byte vectors on both sides,
// both extents >= 128 bytes' worth. Tiles are TI x TJ (batch 1), each side
// >= 128 bytes (the swizzle spans 8 chunks) and <= 16 KB in all. Returns
// cudaErrorNotSupported (nothing launched) when the shape does not fit.
template <typename E>
cudaError_t LaunchPacked(const E* x, E* y, const LayoutTransformPlan& plan,
                         cudaStream_t stream) {
  constexpr int kBytes = sizeof(E);
  constexpr int kLogBytes = kBytes == 1 ? 0 : (kBytes == 2 ? 1 : 2);
  const int log_min = 7 - kLogBytes;  // 128 bytes' worth of elements
  const int log_max_tile = 14 - kLogBytes;
  const int log_i = Log2Ceil(plan.I), log_j = Log2Ceil(plan.J);
  if (log_i < log_min || log_j < log_min) return cudaErrorNotSupported;
  // Grow from the minimum, the smaller side first, while it still has
  // elements to cover: square tiles for large extents, the whole extent
  // (and the rest of the budget on the other side) for short ones.
  int log_ti = log_min, log_tj = log_min;
  while (log_ti + log_tj < log_max_tile) {
    const bool grow_i = log_ti < log_i, grow_j = log_tj < log_j;
    if (grow_i && (!grow_j || log_ti <= log_tj)) {
      ++log_ti;
    } else if (grow_j) {
      ++log_tj;
    } else {
      break;
    }
  }
  auto count_tiles = [&](int lti, int ltj) {
    return ((plan.I + (int64_t{1} << lti) - 1) >> lti) *
           ((plan.J + (int64_t{1} << ltj) - 1) >> ltj) * plan.B;
  };
  auto smem_for = [&](int lti, int ltj) {
    return size_t{1} << (lti + ltj + kLogBytes);
  };
  // Small tensors: split into smaller tiles while the result still fits in
  // one wave of resident blocks, so every SM gets work and no tail wave
  // follows.
  while (log_ti + log_tj > 2 * log_min) {
    const int nti = log_ti >= log_tj && log_ti > log_min ? log_ti - 1 : log_ti;
    const int ntj = nti == log_ti ? log_tj - 1 : log_tj;
    if (count_tiles(nti, ntj) >
        PackedResidentBlocks<kBytes>(smem_for(nti, ntj)))
      break;
    log_ti = nti;
    log_tj = ntj;
  }
  const int64_t num_tiles = count_tiles(log_ti, log_tj);
  if (num_tiles >= (int64_t{1} << 31)) return cudaErrorNotSupported;
  lt::PackedParams p;
  SetPlanExtents(plan, &p);
  p.tiles_i = static_cast<uint32_t>((plan.I + (int64_t{1} << log_ti) - 1) >> log_ti);
  p.tiles_j = static_cast<uint32_t>((plan.J + (int64_t{1} << log_tj) - 1) >> log_tj);
  p.num_tiles = static_cast<uint32_t>(num_tiles);
  p.log_ti = log_ti;
  p.log_tj = log_tj;
  const unsigned blocks = static_cast<unsigned>(num_tiles);
  lt::transpose_packed_kernel<kBytes>
      <<<blocks, lt::kPackedThreads, smem_for(log_ti, log_tj), stream>>>(
          reinterpret_cast<const unsigned char*>(x),
          reinterpret_cast<unsigned char*>(y), p);
  return cudaGetLastError();
}

template <typename E>
cudaError_t LaunchForType(const void* x_raw, void* y_raw,
                          const LayoutTransformPlan& plan,
                          cudaStream_t stream) {
  const E* x = static_cast<const E*>(x_raw);
  E* y = static_cast<E*>(y_raw);
  if (plan.kind == LayoutTransformPlan::Kind::kCopy) {
    return cudaMemcpyAsync(y, x, plan.elements * sizeof(E),
                           cudaMemcpyDeviceToDevice, stream);
  }
  // 16-byte accesses need every vector start aligned: the extent along the
  // vector and the other strides (multiples of it here) divisible by the
  // width, and the base pointer 16-byte aligned.
  constexpr int kV = lt::VecWidth<E>();
  const bool vec_load = plan.J % kV == 0 && plan.in_stride_i % kV == 0 &&
                        plan.in_stride_b % kV == 0 && IsAligned(x, 16);
  const bool vec_store = plan.I % kV == 0 && plan.out_stride_j % kV == 0 &&
                         plan.out_stride_b % kV == 0 && IsAligned(y, 16);
  if constexpr (sizeof(E) <= 4) {
    if (vec_load && vec_store) {
      const cudaError_t status = LaunchPacked<E>(x, y, plan, stream);
      if (status != cudaErrorNotSupported) return status;
    }
  }
  const int log_v = Log2Ceil(kV);
  const TileShape tile = ChooseTile(
      plan, vec_load ? lt::TileElems<E, true>() : lt::TileElems<E, false>(),
      vec_load ? log_v : 0, vec_store ? log_v : 0);
  lt::TransposeParams p;
  p.B = plan.B;
  SetPlanExtents(plan, &p);
  p.log_tb = tile.log_tb;
  p.log_ti = tile.log_ti;
  p.log_tj = tile.log_tj;
  p.batch_middle = plan.batch_middle;
  p.tiles_i = (plan.I + (int64_t{1} << tile.log_ti) - 1) >> tile.log_ti;
  p.tiles_j = (plan.J + (int64_t{1} << tile.log_tj) - 1) >> tile.log_tj;
  p.num_tiles = CountTiles(plan, tile);
  if (vec_load && vec_store) return LaunchTranspose<E, true, true>(x, y, p, stream);
  if (vec_load) return LaunchTranspose<E, true, false>(x, y, p, stream);
  if (vec_store) return LaunchTranspose<E, false, true>(x, y, p, stream);
  return LaunchTranspose<E, false, false>(x, y, p, stream);
}

}  // namespace

bool is_valid_layout(int64_t code) {
  return code == static_cast<int64_t>(TensorLayout::kNHWC) ||
         code == static_cast<int64_t>(TensorLayout::kNCHW) ||
         code == static_cast<int64_t>(TensorLayout::kCHWN);
}

void layout_dims(TensorLayout layout, int64_t N, int64_t C, int64_t H,
                 int64_t W, int64_t dims[4]) {
  switch (layout) {
    case TensorLayout::kNHWC: dims[0] = N; dims[1] = H; dims[2] = W; dims[3] = C; return;
    case TensorLayout::kNCHW: dims[0] = N; dims[1] = C; dims[2] = H; dims[3] = W; return;
    case TensorLayout::kCHWN: dims[0] = C; dims[1] = H; dims[2] = W; dims[3] = N; return;
  }
}

LayoutTransformPlan plan_layout_transform(TensorLayout src, TensorLayout dst,
                                          int64_t N, int64_t C, int64_t H,
                                          int64_t W) {
  LayoutTransformPlan plan;
  plan.elements = N * C * H * W;
  if (plan.elements == 0) return plan;  // kEmpty
  const int64_t size[3] = {N, C, H * W};
  int src_order[3], dst_order[3];
  AxisOrder(src, src_order);
  AxisOrder(dst, dst_order);

  // Drop size-1 axes (they do not move data), then merge runs of axes that
  // are adjacent and in the same order in both layouts.
  int src_kept[3], dst_kept[3], kept = 0, dst_count = 0;
  for (int a : src_order)
    if (size[a] > 1) src_kept[kept++] = a;
  for (int a : dst_order)
    if (size[a] > 1) dst_kept[dst_count++] = a;
  auto dst_pos = [&](int axis) {
    for (int k = 0; k < dst_count; ++k)
      if (dst_kept[k] == axis) return k;
    return -1;
  };
  Group groups[3];
  int num_groups = 0;
  for (int k = 0; k < kept; ++k) {
    const int a = src_kept[k];
    if (num_groups > 0 && dst_pos(a) == dst_pos(src_kept[k - 1]) + 1) {
      groups[num_groups - 1].size *= size[a];
    } else {
      groups[num_groups++] = {a, size[a]};
    }
  }
  if (num_groups <= 1) {
    plan.kind = LayoutTransformPlan::Kind::kCopy;
    return plan;
  }
  // Group order in dst: rank of each group's leading axis among the groups.
  int dst_rank[3];
  for (int g = 0; g < num_groups; ++g) {
    dst_rank[g] = 0;
    for (int h = 0; h < num_groups; ++h)
      if (dst_pos(groups[h].first) < dst_pos(groups[g].first)) ++dst_rank[g];
  }
  plan.kind = LayoutTransformPlan::Kind::kTranspose;
  if (num_groups == 2) {
    // [I, J] -> [J, I]
    plan.I = groups[0].size;
    plan.J = groups[1].size;
    plan.in_stride_i = plan.J;
    plan.out_stride_j = plan.I;
    plan.in_stride_b = plan.out_stride_b = plan.elements;
    return plan;
  }
  // Three groups with no adjacent pair kept: dst is [g0, g2, g1] or
  // [g2, g1, g0]. ([g1, g0, g2] keeps the innermost axis, which no pair of
  // these layouts does: their innermost axes C, S, N all differ.)
  if (dst_rank[0] == 0) {
    plan.B = groups[0].size;
    plan.I = groups[1].size;
    plan.J = groups[2].size;
    plan.in_stride_i = plan.J;
    plan.in_stride_b = plan.I * plan.J;
    plan.out_stride_j = plan.I;
    plan.out_stride_b = plan.I * plan.J;
  } else if (dst_rank[0] == 2 && dst_rank[1] == 1) {
    plan.I = groups[0].size;
    plan.B = groups[1].size;
    plan.J = groups[2].size;
    plan.batch_middle = true;
    plan.in_stride_b = plan.J;
    plan.in_stride_i = plan.B * plan.J;
    plan.out_stride_b = plan.I;
    plan.out_stride_j = plan.B * plan.I;
  } else {
    plan.kind = LayoutTransformPlan::Kind::kUnsupported;
  }
  return plan;
}

const char* layout_transform_unsupported_reason(TensorLayout src,
                                                TensorLayout dst, int64_t N,
                                                int64_t C, int64_t H, int64_t W,
                                                size_t element_bytes) {
  if (!is_valid_layout(static_cast<int64_t>(src)) ||
      !is_valid_layout(static_cast<int64_t>(dst)))
    return "unknown layout";
  if (N < 0 || C < 0 || H < 0 || W < 0) return "negative dimension";
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 &&
      element_bytes != 8)
    return "element size must be 1, 2, 4 or 8 bytes";
  int64_t bytes;
  if (!CheckedProduct({N, C, H, W, static_cast<int64_t>(element_bytes)}, &bytes))
    return "tensor size overflows int64";
  return nullptr;
}

cudaError_t launch_layout_transform(const void* x, void* y,
                                    size_t element_bytes, TensorLayout src,
                                    TensorLayout dst, int64_t N, int64_t C,
                                    int64_t H, int64_t W, cudaStream_t stream) {
  if (layout_transform_unsupported_reason(src, dst, N, C, H, W,
                                          element_bytes) != nullptr)
    return cudaErrorInvalidValue;
  const LayoutTransformPlan plan = plan_layout_transform(src, dst, N, C, H, W);
  if (plan.kind == LayoutTransformPlan::Kind::kEmpty) return cudaSuccess;
  if (plan.kind == LayoutTransformPlan::Kind::kUnsupported)
    return cudaErrorNotSupported;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  switch (element_bytes) {
    case 1: return LaunchForType<uint8_t>(x, y, plan, stream);
    case 2: return LaunchForType<uint16_t>(x, y, plan, stream);
    case 4: return LaunchForType<uint32_t>(x, y, plan, stream);
    case 8: return LaunchForType<uint64_t>(x, y, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jaxcnn
