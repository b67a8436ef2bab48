// CUDA XLA FFI handlers: the per-thread algorithm of algorithm.cuh / ops.cuh as GPU kernels.
//
// Threads: x = channel lanes (V channels each), y = a split of the output rows into ranges of about
// equal record counts (Algorithm 1's coefficient loop split for occupancy). No atomics anywhere:
// every output element has one writer, every reduction a fixed order, so results are bitwise
// reproducible.
#include <algorithm>
#include <string>

#include "bindings.h"
#include "dispatch.h"
#include "handlers.h"
#include "ops.cuh"
#include "simt.h"

namespace e3j {
namespace {

constexpr int kMaxLanes = 64;
constexpr int kThreads = 256;
constexpr int kMaxSplits = 16;
constexpr size_t kDefaultSmem = 48 * 1024;
// Shared memory the convolution forward (accumulator and staged rows) may take per block: at most a
// quarter of an sm_90 SM's 228 KiB, so that four blocks (of up to 256 threads) can be resident.
constexpr size_t kConvSharedBytes = 56 * 1024;

// First row of part `part` of `parts`: rows split where the record count crosses part / parts.
__device__ int split_begin(const int32_t* rowptr, int rows, int part, int parts) {
  if (part <= 0) return 0;
  if (part >= parts) return rows;
  const int64_t target = static_cast<int64_t>(rowptr[rows]) * part / parts;
  int lo = 0, hi = rows;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (rowptr[mid] < target)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

template <typename T>
__device__ void stage(T* dst, const T* src, int rows, int width, int block_channels, int64_t src_row) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  for (int k = tid; k < rows * width; k += nt) {
    const int i = k / width, c = k % width;
    dst[i * block_channels + c] = src[i * src_row + c];
  }
}

// An edge's weight rows into dst[rows][block_channels]: path i's `width` channels from src + cols[i]
// (element-wise, so a path may start at any column of the weights' rows).
template <typename T>
__device__ void stage_columns(T* dst, const T* src, const int32_t* cols, int rows, int width, int block_channels) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  for (int k = tid; k < rows * width; k += nt) {
    const int i = k / width, c = k % width;
    dst[i * block_channels + c] = src[cols[i] + c];
  }
}

// Tensor product forward: block = one batch row × a block of channels; x, y rows staged in smem
// (`staged`; rows too long for the device's shared memory are read from global memory instead).
template <int V, typename T, typename Rec>
__global__ void tp_fwd_kernel(const Rec* rec, const int32_t* rowptr, const T* x, const T* y, T* z, int Dx, int Dy,
                              int Dz, int C, bool y_channels, bool staged) {
  E3J_DYNAMIC_SMEM(smem_raw);
  const int CB = blockDim.x * V;
  const int64_t b = blockIdx.x;
  const int cbase = blockIdx.y * CB;
  const int width = min(CB, C - cbase);
  const int c0 = threadIdx.x * V;
  Rows<T> a = channel_rows(x, b, Dx, C, cbase + c0);
  Rows<T> bb = y_rows(y, b, Dy, C, cbase + c0, y_channels);
  if (staged) {  // (uniform across the block, so the barrier is reached by all or none)
    T* sx = reinterpret_cast<T*>(smem_raw);
    T* sy = sx + Dx * CB;
    stage(sx, x + b * Dx * C + cbase, Dx, width, CB, C);
    if (y_channels)
      stage(sy, y + b * Dy * C + cbase, Dy, width, CB, C);
    else
      stage(sy, y + b * Dy, 1, Dy, Dy, 0);
    __syncthreads();
    a = Rows<T>{sx + c0, CB, 1};
    bb = y_channels ? Rows<T>{sy + c0, CB, 1} : Rows<T>{sy, 1, 0};
  }
  if (c0 >= width) return;
  const int lo = split_begin(rowptr, Dz, threadIdx.y, blockDim.y);
  const int hi = split_begin(rowptr, Dz, threadIdx.y + 1, blockDim.y);
  store_contraction<V, T>(rec, rowptr, lo, hi, a, bb, z + b * Dz * C + cbase + c0, C);
}

// Tensor product backward: block = one batch row, all channels (lanes loop over channel groups),
// streaming x, y, dz once for both cotangents; a broadcast y's cotangent is reduced over lanes in smem.
template <int V, typename T, typename Rec>
__global__ void tp_bwd_kernel(const Rec* rx, const int32_t* px, const Rec* ry, const int32_t* py, const T* x,
                              const T* y, const T* dz, T* dx, T* dy, int Dx, int Dy, int Dz, int C, bool y_channels,
                              bool want_x, bool want_y) {
  E3J_DYNAMIC_SMEM(smem_raw);
  T* red = reinterpret_cast<T*>(smem_raw);  // [Dy][blockDim.x]
  const int64_t b = blockIdx.x;
  const int lx = split_begin(px, Dx, threadIdx.y, blockDim.y), hx = split_begin(px, Dx, threadIdx.y + 1, blockDim.y);
  const int ly = split_begin(py, Dy, threadIdx.y, blockDim.y), hy = split_begin(py, Dy, threadIdx.y + 1, blockDim.y);
  const bool reduce = want_y && !y_channels;
  if (reduce)
    for (int i = ly; i < hy; ++i) red[i * blockDim.x + threadIdx.x] = T(0);
  for (int c0 = threadIdx.x * V; c0 < C; c0 += blockDim.x * V) {
    const Rows<T> dzr = channel_rows(dz, b, Dz, C, c0);
    if (want_x)
      store_contraction<V, T>(rx, px, lx, hx, y_rows(y, b, Dy, C, c0, y_channels), dzr, dx + b * Dx * C + c0, C);
    if (want_y) {
      const Rows<T> xr = channel_rows(x, b, Dx, C, c0);
      if (y_channels) {
        store_contraction<V, T>(ry, py, ly, hy, xr, dzr, dy + b * Dy * C + c0, C);
      } else {
        contract<V, T>(ry, py, ly, hy, xr, dzr, [&](int i, const T* acc) {
          T sum = T(0);
#pragma unroll
          for (int v = 0; v < V; ++v) sum += acc[v];
          red[i * blockDim.x + threadIdx.x] += sum;
        });
      }
    }
  }
  if (!reduce) return;
  __syncthreads();
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  for (int i = tid; i < Dy; i += nt) {
    T sum = T(0);
    for (int l = 0; l < blockDim.x; ++l) sum += red[i * blockDim.x + l];
    dy[b * Dy + i] = sum;
  }
}

// `n` elements of T rounded up to 16 bytes: shared-memory regions start aligned for vector accesses.
template <typename T>
__host__ __device__ int64_t aligned16(int64_t n) {
  constexpr int64_t q = 16 / sizeof(T);
  return (n + q - 1) / q * q;
}

// Shared memory of the convolution forward, in elements of T, each region 16-byte aligned (vector
// loads): the accumulator [Dz][CB], then the current edge's rows x_a [Dx][CB], y_ab [Dy][CB] (or
// [Dy] when broadcast) and s_ab [P][CB].
struct ConvFwdSmem {
  int64_t x, y, s, total;
};
template <typename T>
__host__ __device__ ConvFwdSmem conv_fwd_smem(int64_t Dz, int64_t Dx, int64_t Dy, int64_t P, int64_t CB,
                                              bool y_channels) {
  ConvFwdSmem r;
  r.x = aligned16<T>(Dz * CB);
  r.y = r.x + aligned16<T>(Dx * CB);
  r.s = r.y + aligned16<T>(y_channels ? Dy * CB : Dy);
  r.total = r.s + aligned16<T>(P * CB);
  return r;
}

// Convolution forward: block = one receiver × a block of channels, its output rows split across the
// block's y axis by record count (as the tensor product's). The weights s [E, Ws] hold path p's
// channels at columns s_cols[p] + c. With `staged`, the CSR loop over the receiver's edges stages
// each edge's rows x_a, y_ab, s_ab in shared memory (all threads, coalesced), and every thread
// accumulates its rows × V channels of the message in a shared-memory accumulator, written once per
// node; else rows and accumulator live in global memory (the output row itself). Every
// accumulator element has one owner: no atomics.
template <int V, typename T, typename Rec>
__global__ void conv_fwd_kernel(const Rec* rec, const int32_t* rowptr, const int32_t* i3, const int32_t* s_cols,
                                const int32_t* offsets, const int32_t* order, const int32_t* senders, const T* x,
                                const T* y, const T* s, T* m, int Dx, int Dy, int P, int64_t Ws, int Dz, int C,
                                bool y_channels, bool staged) {
  E3J_DYNAMIC_SMEM(smem_raw);
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int CB = blockDim.x * V;
  const int64_t b = blockIdx.x;
  const int cbase = blockIdx.y * CB;
  const int width = min(CB, C - cbase);
  const int c0 = threadIdx.x * V;  // within the block
  const bool active = c0 < width;  // (no early return: the block meets at barriers)
  const int lo = split_begin(rowptr, Dz, threadIdx.y, blockDim.y);
  const int hi = split_begin(rowptr, Dz, threadIdx.y + 1, blockDim.y);
  const ConvFwdSmem at = conv_fwd_smem<T>(Dz, Dx, Dy, P, CB, y_channels);
  T* acc = staged ? smem + c0 : m + b * Dz * C + cbase + c0;
  const int64_t row = staged ? CB : C;
  if (active)
    for (int i = lo; i < hi; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[i * row + v] = T(0);
  for (int k = offsets[b]; k < offsets[b + 1]; ++k) {
    const int64_t e = order[k], a = senders[e];
    if (staged) {
      __syncthreads();  // the previous edge's rows are consumed
      stage(smem + at.x, x + a * Dx * C + cbase, Dx, width, CB, C);
      if (y_channels)
        stage(smem + at.y, y + e * Dy * C + cbase, Dy, width, CB, C);
      else
        stage(smem + at.y, y + e * Dy, 1, Dy, Dy, 0);
      stage_columns(smem + at.s, s + e * Ws + cbase, s_cols, P, width, CB);
      __syncthreads();
      if (active)
        accumulate_message<V, T>(rec, rowptr, lo, hi, Rows<T>{smem + at.x + c0, CB, 1},
                                 y_channels ? Rows<T>{smem + at.y + c0, CB, 1} : Rows<T>{smem + at.y, 1, 0},
                                 Rows<T>{smem + at.s + c0, CB, 1}, i3, acc, row);
    } else if (active) {
      const int cc = cbase + c0;
      accumulate_message<V, T>(rec, rowptr, lo, hi, channel_rows(x, a, Dx, C, cc), y_rows(y, e, Dy, C, cc, y_channels),
                               ColumnRows<T>{s + e * Ws + cc, s_cols}, i3, acc, row);
    }
  }
  if (staged && active)
    for (int i = lo; i < hi; ++i) store<V>(m + (b * Dz + i) * C + cbase + c0, acc + i * row);
}

// Blocks after the backward kernels' N senders that zero the padding edges' cotangent rows: one per
// kEdgesPerClearingBlock edge slots, at most kMaxClearingBlocks. How many edges are padding is known
// only on the device (num_valid), so the slots size it; one block alone would write every padding row
// in turn (e3j-models' buckets keep 11-16 % padding edges). Twin of e3j_pallas_gpu._blocks's
// clearing_programs: kernel packages never import each other.
constexpr int64_t kEdgesPerClearingBlock = 512;
constexpr int64_t kMaxClearingBlocks = 1024;
int64_t clearing_blocks(int64_t E) {
  return std::max<int64_t>(1, std::min(kMaxClearingBlocks, (E + kEdgesPerClearingBlock - 1) / kEdgesPerClearingBlock));
}

// Clearing block q of Q (the backward's blocks N + q) zeroes its run of the padding edges,
// order[num_valid:E] cut into Q equal runs, with threads tid of nt: dy's rows (dy_row elements per
// edge; 0 when not wanted) and ds's P paths of C channels at columns s_cols[p] of its rows of Wds (0
// when not wanted; other columns untouched).
template <typename T>
__device__ void clear_padding_edges(const int32_t* order, int num_valid, int E, T* dy, T* ds, int64_t dy_row,
                                    const int32_t* s_cols, int P, int C, int64_t Wds, int tid, int nt, int q, int Q) {
  const int per = (E - num_valid + Q - 1) / Q;
  const int lo = num_valid + q * per, hi = min(lo + per, E);
  for (int k = lo; k < hi; ++k) {
    const int64_t e = order[k];
    for (int64_t j = tid; j < dy_row; j += nt) dy[e * dy_row + j] = T(0);
    if (Wds > 0)
      for (int64_t j = tid; j < int64_t(P) * C; j += nt) ds[e * Wds + s_cols[j / C] + j % C] = T(0);
  }
}

// First row of part `part` of `parts` of the output rows, split by record count and moved forward to
// the start of a path, so that every part holds whole paths (the rows of a path are contiguous).
__device__ int path_split_begin(const int32_t* rowptr, const int32_t* i3, int rows, int part, int parts) {
  int r = split_begin(rowptr, rows, part, parts);
  while (r > 0 && r < rows && i3[r] == i3[r - 1]) ++r;
  return r;
}

// Shared memory of the staged convolution backward, in elements of T, regions 16-byte aligned: the
// sender's x_a [Dx][CB] and dx accumulator [Dx][CB], then per edge dm_b [Dz][CB], s_ab [P][CB],
// y_ab [Dy][CB] (or [Dy]), and the broadcast y's reduction buffer [Dy][lanes]; a region is empty
// when the cotangents asked for do not need it.
struct ConvBwdSmem {
  int64_t dx, dm, s, y, red, total;
};
template <typename T>
__host__ __device__ ConvBwdSmem conv_bwd_smem(int64_t Dx, int64_t Dy, int64_t Dz, int64_t P, int64_t lanes, int V,
                                              bool y_channels, bool want_x, bool want_y, bool want_s) {
  const int64_t CB = lanes * V;
  const bool need_x = want_y || want_s, need_y = want_x || want_s, need_s = want_x || want_y;
  ConvBwdSmem r;
  r.dx = need_x ? aligned16<T>(Dx * CB) : 0;
  r.dm = r.dx + (want_x ? aligned16<T>(Dx * CB) : 0);
  r.s = r.dm + aligned16<T>(Dz * CB);
  r.y = r.s + (need_s ? aligned16<T>(P * CB) : 0);
  r.red = r.y + (need_y ? aligned16<T>(y_channels ? Dy * CB : Dy) : 0);
  r.total = r.red + (want_y && !y_channels ? aligned16<T>(Dy * lanes) : 0);
  return r;
}

// Convolution backward, staged: block = one sender (the transposed graph's CSR) × its channels in
// chunks of CB; x_a is staged once per chunk and dx accumulated in shared memory, written once; per
// edge, dm_b, s_ab and y_ab are staged by the whole block (coalesced), and each thread computes its
// share of dx's, dy's and ds's rows (split across the block's y axis; ds's at path boundaries),
// reading operands from shared memory. dy and ds rows are written once per edge and chunk; a
// broadcast y's cotangent is reduced over lanes in shared memory, then over chunks in order. Blocks
// N .. zero the padding edges' rows (clearing_blocks). No atomics.
template <int V, typename T, typename Rec>
__global__ void conv_bwd_staged_kernel(const Rec* rt, const int32_t* pt, const Rec* rx, const int32_t* px,
                                       const Rec* ry, const int32_t* py, const int32_t* i3, const int32_t* s_cols,
                                       const int32_t* offsets, const int32_t* order, const int32_t* receivers,
                                       const int32_t* num_valid, const T* x, const T* y, const T* s, const T* dm,
                                       T* dx, T* dy, T* ds, int N, int E, int Dx, int Dy, int P, int64_t Ws,
                                       int64_t Wds, int Dz, int C, bool y_channels, bool want_x, bool want_y,
                                       bool want_s) {
  E3J_DYNAMIC_SMEM(smem_raw);
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int lanes = blockDim.x, splits = blockDim.y, CB = lanes * V;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * lanes + tx, nt = lanes * splits;
  const int64_t a = blockIdx.x;
  const bool reduce = want_y && !y_channels;
  if (a >= N) {
    clear_padding_edges(order, num_valid[0], E, dy, ds, want_y ? (y_channels ? int64_t(Dy) * C : Dy) : 0, s_cols,
                        P, C, Wds, tid, nt, int(a - N), int(gridDim.x - N));
    return;
  }
  const bool need_x = want_y || want_s, need_y = want_x || want_s, need_s = want_x || want_y;
  const ConvBwdSmem at = conv_bwd_smem<T>(Dx, Dy, Dz, P, lanes, V, y_channels, want_x, want_y, want_s);
  const int lx = split_begin(px, Dx, ty, splits), hx = split_begin(px, Dx, ty + 1, splits);
  const int ly = split_begin(py, Dy, ty, splits), hy = split_begin(py, Dy, ty + 1, splits);
  const int lt = path_split_begin(pt, i3, Dz, ty, splits), ht = path_split_begin(pt, i3, Dz, ty + 1, splits);
  const int c0 = tx * V;
  T* red = smem + at.red;
  for (int cbase = 0; cbase < C; cbase += CB) {
    const int width = min(CB, C - cbase);
    const bool active = c0 < width;
    __syncthreads();  // the previous chunk's rows are consumed
    if (need_x) stage(smem, x + a * Dx * C + cbase, Dx, width, CB, C);
    T* dx_acc = smem + at.dx + c0;
    if (want_x && active) {
      E3J_VEC(T, V) zero[V] = {};
      for (int i = lx; i < hx; ++i) store<V>(dx_acc + i * CB, zero);
    }
    const Rows<T> xa{smem + c0, CB, 1};
    const Rows<T> ye = y_channels ? Rows<T>{smem + at.y + c0, CB, 1} : Rows<T>{smem + at.y, 1, 0};
    const Rows<T> dmb{smem + at.dm + c0, CB, 1};
    const ScaledRows<T> g{dmb, Rows<T>{smem + at.s + c0, CB, 1}, i3};
    for (int k = offsets[a]; k < offsets[a + 1]; ++k) {
      const int64_t e = order[k], b = receivers[e];
      __syncthreads();  // the previous edge's rows and reduction buffer are consumed
      stage(smem + at.dm, dm + b * Dz * C + cbase, Dz, width, CB, C);
      if (need_s) stage_columns(smem + at.s, s + e * Ws + cbase, s_cols, P, width, CB);
      if (need_y) {
        if (y_channels)
          stage(smem + at.y, y + e * Dy * C + cbase, Dy, width, CB, C);
        else
          stage(smem + at.y, y + e * Dy, 1, Dy, Dy, 0);
      }
      __syncthreads();
      if (active) {
        if (want_x)
          contract<V, T>(rx, px, lx, hx, ye, g, [&](int i, const T* acc) {
            E3J_VEC(T, V) cur[V];
            load<V>(Rows<T>{dx_acc + i * CB, 0, 1}, 0, cur);
#pragma unroll
            for (int v = 0; v < V; ++v) cur[v] += acc[v];
            store<V>(dx_acc + i * CB, cur);
          });
        if (want_y) {
          if (y_channels) {
            store_contraction<V, T>(ry, py, ly, hy, xa, g, dy + e * Dy * C + cbase + c0, C);
          } else {
            contract<V, T>(ry, py, ly, hy, xa, g, [&](int i, const T* acc) {
              T sum = T(0);
#pragma unroll
              for (int v = 0; v < V; ++v) sum += acc[v];
              red[i * lanes + tx] = sum;
            });
          }
        }
        if (want_s) edge_scalar_cotangent<V, T>(rt, pt, lt, ht, xa, ye, dmb, i3, ds + e * Wds + cbase + c0, s_cols);
      } else if (reduce) {
        for (int i = ly; i < hy; ++i) red[i * lanes + tx] = T(0);
      }
      if (reduce) {
        __syncthreads();
        for (int i = tid; i < Dy; i += nt) {
          T sum = T(0);
          for (int l = 0; l < lanes; ++l) sum += red[i * lanes + l];
          dy[e * Dy + i] = cbase == 0 ? sum : dy[e * Dy + i] + sum;
        }
      }
    }
    if (want_x && active)
      for (int i = lx; i < hx; ++i) store<V>(dx + (a * Dx + i) * C + cbase + c0, dx_acc + i * CB);
  }
}

// Convolution backward from global memory (when not even one lane's rows fit the staged kernel's
// shared memory): block = one sender, all channels; dx is accumulated in the sender's own row, dy and
// ds written per edge; blocks N .. zero padding edges.
template <int V, typename T, typename Rec>
__global__ void conv_bwd_kernel(const Rec* rt, const int32_t* pt, const Rec* rx, const int32_t* px, const Rec* ry,
                                const int32_t* py, const int32_t* i3, const int32_t* s_cols, const int32_t* offsets,
                                const int32_t* order, const int32_t* receivers, const int32_t* num_valid, const T* x,
                                const T* y, const T* s, const T* dm, T* dx, T* dy, T* ds, int N, int E, int Dx,
                                int Dy, int P, int64_t Ws, int64_t Wds, int Dz, int C, bool y_channels, bool want_x,
                                bool want_y, bool want_s) {
  E3J_DYNAMIC_SMEM(smem_raw);
  T* red = reinterpret_cast<T*>(smem_raw);  // [Dy][blockDim.x]
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t a = blockIdx.x;
  if (a >= N) {
    clear_padding_edges(order, num_valid[0], E, dy, ds, want_y ? (y_channels ? int64_t(Dy) * C : Dy) : 0, s_cols,
                        P, C, Wds, tid, nt, int(a - N), int(gridDim.x - N));
    return;
  }
  if (want_x)
    for (int c0 = tid * V; c0 < C; c0 += nt * V)
      for (int i = 0; i < Dx; ++i)
#pragma unroll
        for (int v = 0; v < V; ++v) dx[(a * Dx + i) * C + c0 + v] = T(0);
  const bool reduce = want_y && !y_channels;
  for (int k = offsets[a]; k < offsets[a + 1]; ++k) {
    const int64_t e = order[k], b = receivers[e];
    if (reduce)
      for (int i = 0; i < Dy; ++i) red[i * nt + tid] = T(0);
    for (int c0 = tid * V; c0 < C; c0 += nt * V) {
      const Rows<T> dmb = channel_rows(dm, b, Dz, C, c0);
      const ScaledRows<T, ColumnRows<T>> g{dmb, ColumnRows<T>{s + e * Ws + c0, s_cols}, i3};
      if (want_x)
        contract<V, T>(rx, px, 0, Dx, y_rows(y, e, Dy, C, c0, y_channels), g, [&](int i, const T* acc) {
          T* out = dx + (a * Dx + i) * C + c0;
          E3J_VEC(T, V) cur[V];
          load<V>(Rows<T>{out, 0, 1}, 0, cur);
#pragma unroll
          for (int v = 0; v < V; ++v) cur[v] += acc[v];
          store<V>(out, cur);
        });
      if (want_y) {
        const Rows<T> xa = channel_rows(x, a, Dx, C, c0);
        if (y_channels) {
          store_contraction<V, T>(ry, py, 0, Dy, xa, g, dy + e * Dy * C + c0, C);
        } else {
          contract<V, T>(ry, py, 0, Dy, xa, g, [&](int i, const T* acc) {
            T sum = T(0);
#pragma unroll
            for (int v = 0; v < V; ++v) sum += acc[v];
            red[i * nt + tid] += sum;
          });
        }
      }
      if (want_s)
        edge_scalar_cotangent<V, T>(rt, pt, 0, Dz, channel_rows(x, a, Dx, C, c0), y_rows(y, e, Dy, C, c0, y_channels),
                                    dmb, i3, ds + e * Wds + c0, s_cols);
    }
    if (reduce) {
      __syncthreads();
      for (int i = tid; i < Dy; i += nt) {
        T sum = T(0);
        for (int l = 0; l < nt; ++l) sum += red[i * nt + l];
        dy[e * Dy + i] = sum;
      }
      __syncthreads();
    }
  }
}

ffi::Error launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("e3j_cuda: ") + what + ": " + cudaGetErrorString(err));
}

template <typename K>
ffi::Error allow_smem(K kernel, size_t bytes) {
  if (bytes <= kDefaultSmem) return ffi::Error::Success();
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess) return ffi::Error::Success();
  // CUDA keeps the error as the thread's last one too: read it here, or the next call's launch check
  // (launched) would report it as its own
  cudaGetLastError();
  return ffi::Error::Internal("e3j_cuda: opting a kernel in to " + std::to_string(bytes) +
                              " bytes of dynamic shared memory failed: " + cudaGetErrorString(err));
}

// A backward call with nothing to launch still owes a broadcast y's cotangent [B|E, Dy]: a sum over
// no channels, zero (the other cotangents are then empty).
ffi::Error zero_broadcast_dy(ffi::Result<ffi::AnyBuffer>& dy, bool broadcast_dy, cudaStream_t stream) {
  if (!broadcast_dy || dy->size_bytes() == 0) return ffi::Error::Success();
  const cudaError_t err = cudaMemsetAsync(dy->untyped_data(), 0, dy->size_bytes(), stream);
  if (err == cudaSuccess) return ffi::Error::Success();
  cudaGetLastError();  // (read, as allow_smem does)
  return ffi::Error::Internal(std::string("e3j_cuda: zeroing dy: ") + cudaGetErrorString(err));
}

int lanes_for(int64_t groups) { return static_cast<int>(std::min<int64_t>(groups, kMaxLanes)); }

// The most dynamic shared memory one block may use on the current device, once opted in.
size_t shared_memory_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess || bytes <= 0) {
    cudaGetLastError();  // (clear it: the launch check reports errors of its own)
    return kDefaultSmem;
  }
  return static_cast<size_t>(bytes);
}

// The most lanes, halving from `lanes`, whose shared memory `bytes(lanes)` fits in `budget`; 0 when
// not even one lane fits.
template <typename Bytes>
int lanes_within(int lanes, Bytes&& bytes, size_t budget) {
  while (lanes > 0 && bytes(lanes) > budget) lanes /= 2;
  return lanes;
}

// Lanes of a backward kernel (its lanes loop over channel groups, so fewer lanes only serialize
// them): with a broadcast y (`reduce`), as many as leave room for the [Dy][lanes] reduction buffer
// of `row_bytes` per lane, at least one (then a buffer too large says so at launch).
int reduction_lanes(int64_t groups, bool reduce, size_t row_bytes) {
  const int lanes = lanes_for(groups);
  const auto bytes = [&](int n) { return row_bytes * static_cast<size_t>(n); };
  return reduce ? std::max(1, lanes_within(lanes, bytes, shared_memory_limit())) : lanes;
}

template <typename T>
const T* in(const ffi::AnyBuffer& b) {
  return static_cast<const T*>(b.untyped_data());
}
template <typename T>
T* out(ffi::Result<ffi::AnyBuffer>& b) {
  return static_cast<T*>(b->untyped_data());
}

ffi::Error TpFwd(cudaStream_t stream, ffi::AnyBuffer records, ffi::Buffer<ffi::S32> rowptr, ffi::AnyBuffer x,
                 ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> z, int64_t index_bytes, bool y_channels) {
  const int64_t B = dim(x, 0), Dx = dim(x, 1), C = dim(x, 2), Dy = dim(y, 1), Dz = dim(*z, 1);
  if (B == 0 || C == 0) return ffi::Error::Success();
  return dispatch(x.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    // rows staged in shared memory; fewer lanes when they would not fit, global rows when none would
    const size_t per_lane = (Dx + (y_channels ? Dy : 0)) * V * sizeof(T), fixed = (y_channels ? 0 : Dy) * sizeof(T);
    const auto bytes = [&](int n) { return fixed + per_lane * static_cast<size_t>(n); };
    int lanes = lanes_within(lanes_for(C / V), bytes, shared_memory_limit());
    const bool staged = lanes > 0;
    if (!staged) lanes = lanes_for(C / V);
    const int splits = std::max(1, std::min(4, kThreads / lanes));
    const int CB = lanes * V;
    const size_t smem = staged ? bytes(lanes) : 0;
    auto kernel = tp_fwd_kernel<V, T, Rec>;
    if (auto err = allow_smem(kernel, smem); err.failure()) return err;
    const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>((C + CB - 1) / CB));
    launch(kernel, grid, dim3(lanes, splits), smem, stream, static_cast<const Rec*>(records.untyped_data()),
           rowptr.typed_data(), in<T>(x), in<T>(y), out<T>(z), Dx, Dy, Dz, C, y_channels, staged);
    return launched("tensor product forward");
  });
}

ffi::Error TpBwd(cudaStream_t stream, ffi::AnyBuffer rec_x, ffi::Buffer<ffi::S32> rowptr_x, ffi::AnyBuffer rec_y,
                 ffi::Buffer<ffi::S32> rowptr_y, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer dz,
                 ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dy, int64_t index_bytes, bool y_channels,
                 bool want_x, bool want_y) {
  const TpBwdDims d = tp_bwd_dims(dz, rowptr_x, rowptr_y);
  const int64_t B = d.B, Dz = d.Dz, C = d.C, Dx = d.Dx, Dy = d.Dy;  // (lambdas cannot capture bindings in C++17)
  if (B == 0 || C == 0) return zero_broadcast_dy(dy, want_y && !y_channels, stream);
  return dispatch(dz.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const int lanes = reduction_lanes(C / V, want_y && !y_channels, Dy * sizeof(T));
    const int splits = std::max(1, std::min(4, kThreads / lanes));
    const size_t smem = (want_y && !y_channels) ? Dy * lanes * sizeof(T) : 0;
    auto kernel = tp_bwd_kernel<V, T, Rec>;
    if (auto err = allow_smem(kernel, smem); err.failure()) return err;
    launch(kernel, dim3(static_cast<unsigned>(B)), dim3(lanes, splits), smem, stream,
        static_cast<const Rec*>(rec_x.untyped_data()), rowptr_x.typed_data(),
        static_cast<const Rec*>(rec_y.untyped_data()), rowptr_y.typed_data(), in<T>(x), in<T>(y), in<T>(dz),
        out<T>(dx), out<T>(dy), Dx, Dy, Dz, C, y_channels, want_x, want_y);
    return launched("tensor product backward");
  });
}

ffi::Error ConvFwd(cudaStream_t stream, ffi::AnyBuffer records, ffi::Buffer<ffi::S32> rowptr,
                   ffi::Buffer<ffi::S32> i3, ffi::Buffer<ffi::S32> s_cols, ffi::Buffer<ffi::S32> offsets,
                   ffi::Buffer<ffi::S32> order, ffi::Buffer<ffi::S32> senders, ffi::AnyBuffer x, ffi::AnyBuffer y,
                   ffi::AnyBuffer s, ffi::Result<ffi::AnyBuffer> m, int64_t index_bytes, bool y_channels) {
  const int64_t N = dim(x, 0), Dx = dim(x, 1), C = dim(x, 2), Dy = dim(y, 1), Dz = dim(*m, 1);
  const int64_t P = static_cast<int64_t>(s_cols.element_count()), Ws = dim(s, 1);
  if (N == 0 || C == 0) return ffi::Error::Success();
  return dispatch(x.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    // accumulator and staged rows in shared memory: fewer lanes when they would not fit the budget,
    // global memory when not even one lane's would
    const auto bytes = [&](int lanes) {
      return static_cast<size_t>(conv_fwd_smem<T>(Dz, Dx, Dy, P, lanes * V, y_channels).total) * sizeof(T);
    };
    int lanes = lanes_within(lanes_for(C / V), bytes, std::min(kConvSharedBytes, shared_memory_limit()));
    const bool staged = lanes > 0;
    if (!staged) lanes = lanes_for(C / V);
    const int splits = std::max(1, std::min(kMaxSplits, kThreads / lanes)), CB = lanes * V;
    const size_t smem = staged ? bytes(lanes) : 0;
    auto kernel = conv_fwd_kernel<V, T, Rec>;
    if (auto err = allow_smem(kernel, smem); err.failure()) return err;
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((C + CB - 1) / CB));
    launch(kernel, grid, dim3(lanes, splits), smem, stream,
        static_cast<const Rec*>(records.untyped_data()), rowptr.typed_data(), i3.typed_data(), s_cols.typed_data(),
        offsets.typed_data(), order.typed_data(), senders.typed_data(), in<T>(x), in<T>(y), in<T>(s), out<T>(m), Dx,
        Dy, P, Ws, Dz, C, y_channels, staged);
    return launched("convolution forward");
  });
}

ffi::Error ConvBwd(cudaStream_t stream, ffi::AnyBuffer rec_t, ffi::Buffer<ffi::S32> rowptr_t, ffi::AnyBuffer rec_x,
                   ffi::Buffer<ffi::S32> rowptr_x, ffi::AnyBuffer rec_y, ffi::Buffer<ffi::S32> rowptr_y,
                   ffi::Buffer<ffi::S32> i3, ffi::Buffer<ffi::S32> s_cols, ffi::Buffer<ffi::S32> offsets,
                   ffi::Buffer<ffi::S32> order, ffi::Buffer<ffi::S32> receivers, ffi::Buffer<ffi::S32> num_valid,
                   ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer s, ffi::AnyBuffer dm, ffi::AnyBuffer /*ds_into*/,
                   ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dy, ffi::Result<ffi::AnyBuffer> ds,
                   int64_t index_bytes, bool y_channels, bool want_x, bool want_y, bool want_s) {
  const ConvBwdDims d = conv_bwd_dims(dm, order, rowptr_x, rowptr_y, s_cols, s, *ds, want_s);
  const int64_t N = d.N, Dz = d.Dz, C = d.C, E = d.E, Dx = d.Dx, Dy = d.Dy, P = d.P, Ws = d.Ws, Wds = d.Wds;
  // no channels: ds's paths and dx are empty; with no nodes but edges the launch below has only the
  // clearing blocks, which zero every edge's dy and ds rows (all padding)
  if (C == 0 || (N == 0 && E == 0)) return zero_broadcast_dy(dy, want_y && !y_channels, stream);
  return dispatch(dm.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const auto args = [&](auto kernel, dim3 block, size_t smem) {
      launch(kernel, dim3(static_cast<unsigned>(N + clearing_blocks(E))), block, smem, stream,
             static_cast<const Rec*>(rec_t.untyped_data()), rowptr_t.typed_data(),
             static_cast<const Rec*>(rec_x.untyped_data()), rowptr_x.typed_data(),
             static_cast<const Rec*>(rec_y.untyped_data()), rowptr_y.typed_data(), i3.typed_data(),
             s_cols.typed_data(), offsets.typed_data(), order.typed_data(), receivers.typed_data(),
             num_valid.typed_data(), in<T>(x), in<T>(y), in<T>(s), in<T>(dm), out<T>(dx), out<T>(dy), out<T>(ds), N,
             E, Dx, Dy, P, Ws, Wds, Dz, C, y_channels, want_x, want_y, want_s);
    };
    // staged: rows in shared memory within the convolution's budget, fewer lanes (channel chunks)
    // when they would not fit; from global memory when not even one lane's would
    const auto bytes = [&](int lanes) {
      return static_cast<size_t>(
                 conv_bwd_smem<T>(Dx, Dy, Dz, P, lanes, V, y_channels, want_x, want_y, want_s).total) *
             sizeof(T);
    };
    const int staged_lanes = lanes_within(lanes_for(C / V), bytes, std::min(kConvSharedBytes, shared_memory_limit()));
    if (staged_lanes > 0) {
      const int splits = std::max(1, std::min(kMaxSplits, kThreads / staged_lanes));
      const size_t smem = bytes(staged_lanes);
      auto kernel = conv_bwd_staged_kernel<V, T, Rec>;
      if (auto err = allow_smem(kernel, smem); err.failure()) return err;
      args(kernel, dim3(staged_lanes, splits), smem);
      return launched("convolution backward");
    }
    const int lanes = reduction_lanes(C / V, want_y && !y_channels, Dy * sizeof(T));
    const size_t smem = (want_y && !y_channels) ? Dy * lanes * sizeof(T) : 0;
    auto kernel = conv_bwd_kernel<V, T, Rec>;
    if (auto err = allow_smem(kernel, smem); err.failure()) return err;
    args(kernel, dim3(lanes), smem);
    return launched("convolution backward");
  });
}

}  // namespace
}  // namespace e3j

#if defined(E3J_SIMT_EMULATION)
// The `_simt` target binds for the host, which has no stream to pass: the emulated launches need none.
#define E3J_WITHOUT_STREAM(f) [](auto... a) { return f(cudaStream_t{}, a...); }
E3J_DEFINE_HANDLERS(E3J_WITHOUT_STREAM(e3j::TpFwd), E3J_WITHOUT_STREAM(e3j::TpBwd), E3J_WITHOUT_STREAM(e3j::ConvFwd),
                    E3J_WITHOUT_STREAM(e3j::ConvBwd))
#else
E3J_DEFINE_HANDLERS(e3j::TpFwd, e3j::TpBwd, e3j::ConvFwd, e3j::ConvBwd)
#endif
