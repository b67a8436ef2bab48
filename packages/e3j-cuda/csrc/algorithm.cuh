// The per-thread algorithm of e3j's CUDA kernels (paper Algorithm 1), written once for host and
// device: the host FFI target runs it in CPU loops, the CUDA target in GPU threads.
//
// A thread owns V consecutive channels (V = 4, 2 or 1: float4/float2-style vectorization) and a
// range of output rows [lo, hi). For each output row i0 it walks that row's records (CSR over the
// records, which e3j-core sorts by i0), accumulates c * a[i1] * b[i2] in registers and hands the
// row's V sums to an `emit` callback — which stores them, scales and accumulates them (the
// convolution's edge scalar), or reduces them (cotangents of broadcast operands).
//
// Records are e3j-core's packed records (COO format 2): {Idx i0, i1, i2; T c} with natural
// alignment, Idx = uint8_t when every dimension is <= 255 (8-byte records for float32) else int32_t.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define E3J_HD __host__ __device__ __forceinline__
#else
#define E3J_HD inline
#endif

// Under the `_simt` emulation, every access the device makes with a 64/128-bit instruction is checked
// for the alignment the GPU requires (a misaligned one fails the launch, as it does on the GPU).
#if defined(E3J_SIMT_EMULATION)
#include "simt.h"
#define E3J_VECTOR_ACCESS(p, bytes) ::e3j_simt::vector_access(p, bytes)
#else
#define E3J_VECTOR_ACCESS(p, bytes) ((void)0)
#endif

// The e3j-core COO format (COO_FORMAT_VERSION) whose packed records these kernels read; the Python
// loader refuses a module built for another format than the installed e3j-core writes.
#define E3J_COO_FORMAT 2

namespace e3j {

template <typename Idx, typename T>
struct Record {
  Idx i0, i1, i2;
  T c;
};

// Rows of one operand for one batch row / node / edge: value(i, v) = base[i * row + v * lane].
// lane == 0 broadcasts the row over channels (spherical harmonics y_ab, shared by every channel).
template <typename T>
struct Rows {
  const T* base;
  int64_t row;
  int64_t lane;
  E3J_HD T at(int i, int v) const { return base[i * row + v * lane]; }
};

// An edge's weights read where they are: path p's channels at base[cols[p] + v], where `cols` is the
// per-path column table of the weights' rows (s [E, P, C] viewed as [E, P·C]: cols[p] = p·C; e3nn's
// [E, num_weights]: each path's first column in e3nn's order).
template <typename T>
struct ColumnRows {
  const T* base;
  const int32_t* cols;
  E3J_HD T at(int i, int v) const { return base[cols[i] + v]; }
};

// value(i, v) = a(i, v) * s(map[i], v): the convolution's output cotangent mixed with the edge scalar
// of the path that row i0 belongs to (w = s[i3(i0)] * dm[i0], paper Algorithm 7).
template <typename T, typename S = Rows<T>>
struct ScaledRows {
  Rows<T> a;
  S s;
  const int32_t* map;
  E3J_HD T at(int i, int v) const { return a.at(i, v) * s.at(map[i], v); }
};

// One record in one 64-bit (uint8 indices, float32) or 128-bit (int32 / float32, uint8 / float64)
// load on the device (LDG.64 / LDG.128, paper E.2.1); XLA buffers are at least 16-byte aligned.
template <typename Rec>
E3J_HD Rec load_record(const Rec* p) {
  E3J_VECTOR_ACCESS(p, sizeof(Rec));
#if defined(__CUDA_ARCH__)
  Rec r;
  if constexpr (sizeof(Rec) == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    memcpy(&r, &u, sizeof(Rec));
    return r;
  } else if constexpr (sizeof(Rec) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    memcpy(&r, &u, sizeof(Rec));
    return r;
  }
#endif
  return *p;
}

// Row i's V channels into registers. On the device a contiguous row is read with one 64- or 128-bit
// load (float2/float4, double2): the paper's vectorization, amortizing each record over V channels.
template <int V, typename T>
E3J_HD void load(const Rows<T>& r, int i, T* out) {
  const T* p = r.base + i * r.row;
  if (r.lane == 1) E3J_VECTOR_ACCESS(p, sizeof(T) * V);
#if defined(__CUDA_ARCH__)
  if (r.lane == 1) {
    if constexpr (sizeof(T) * V == 16) {
      *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(p);
      return;
    } else if constexpr (sizeof(T) * V == 8) {
      *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(p);
      return;
    } else if constexpr (sizeof(T) * V == 32) {
      reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(p)[0];
      reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(p)[1];
      return;
    }
  }
#endif
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] = p[v * r.lane];
}

// V channels from registers into a contiguous row: one 64- or 128-bit store on the device (the
// outputs dominate a tensor product's traffic: Dout rows out for Dx + Dy in).
template <int V, typename T>
E3J_HD void store(T* p, const T* in) {
  E3J_VECTOR_ACCESS(p, sizeof(T) * V);
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) * V == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(in);
  } else if constexpr (sizeof(T) * V == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(in);
  } else if constexpr (sizeof(T) * V == 32) {
    reinterpret_cast<uint4*>(p)[0] = reinterpret_cast<const uint4*>(in)[0];
    reinterpret_cast<uint4*>(p)[1] = reinterpret_cast<const uint4*>(in)[1];
  } else  // (one scalar store per channel below)
#endif
  {
#pragma unroll
    for (int v = 0; v < V; ++v) p[v] = in[v];
  }
}

// Register arrays of V values are reinterpreted as one vector by load/store: align them as one.
#define E3J_VEC(T, V) alignas(sizeof(T) * (V) < 16 ? sizeof(T) * (V) : 16) T

// Element by element: a path's first column need not be a multiple of V (e3nn's weight columns are
// sums of any multiplicities), so no vector load is assumed aligned. Only the global-memory kernels
// and the host loops read weights so; the staged kernels copy them into shared memory rows first.
template <int V, typename T>
E3J_HD void load(const ColumnRows<T>& r, int i, T* out) {
  const T* p = r.base + r.cols[i];
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] = p[v];
}

template <int V, typename T, typename S>
E3J_HD void load(const ScaledRows<T, S>& r, int i, T* out) {
  E3J_VEC(T, V) scale[V];
  load<V>(r.a, i, out);
  load<V>(r.s, r.map[i], scale);
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] *= scale[v];
}

// Algorithm 1 over output rows [lo, hi) for V channels: emit(i0, acc[V]) once per row, in order
// (a row without records emits zeros).
template <int V, typename T, typename Rec, typename A, typename B, typename Emit>
E3J_HD void contract(const Rec* rec, const int32_t* rowptr, int lo, int hi, const A& a, const B& b, Emit&& emit) {
  for (int i0 = lo; i0 < hi; ++i0) {
    E3J_VEC(T, V) acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = T(0);
    const int end = rowptr[i0 + 1];
    for (int p = rowptr[i0]; p < end; ++p) {
      const Rec r = load_record(rec + p);
      const T c = static_cast<T>(r.c);
      E3J_VEC(T, V) av[V];
      E3J_VEC(T, V) bv[V];
      load<V>(a, r.i1, av);
      load<V>(b, r.i2, bv);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += c * av[v] * bv[v];
    }
    emit(i0, acc);
  }
}

// Shapes shared by the handlers (all operands are row-major with trailing channels).
struct TableView {
  const void* records;  // packed records
  const int32_t* rowptr;  // [rows + 1]
  int rows;  // output dimension of the table
};

}  // namespace e3j
