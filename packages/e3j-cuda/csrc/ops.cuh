// One work unit of each op, for one thread's V channels (host and device share these).
//
// Layouts (trailing channels, row-major): x [B|N, Dx, C], y [B|E, Dy] (broadcast) or [B|E, Dy, C],
// s [E, W] with path p's C weights at columns cols[p] .. cols[p] + C - 1 (s [E, P, C] viewed as
// [E, P·C], or e3nn's [E, num_weights] in place), z/m [B|N, Dout, C]. `c0` is the thread's first
// channel; `lo..hi` its output rows.
#pragma once

#include "algorithm.cuh"

namespace e3j {

template <typename T>
E3J_HD Rows<T> channel_rows(const T* base, int64_t unit, int dim, int channels, int c0) {
  return Rows<T>{base + unit * dim * channels + c0, channels, 1};
}

// y rows of one batch row / edge: per channel, or one value per row broadcast over channels.
template <typename T>
E3J_HD Rows<T> y_rows(const T* y, int64_t unit, int dim, int channels, int c0, bool y_channels) {
  return y_channels ? channel_rows(y, unit, dim, channels, c0) : Rows<T>{y + unit * dim, 1, 0};
}

// z[unit] rows [lo, hi) = table(a, b) (tensor product forward, and each cotangent of its backward).
template <int V, typename T, typename Rec, typename A, typename B>
E3J_HD void store_contraction(const Rec* rec, const int32_t* rowptr, int lo, int hi, const A& a, const B& b, T* out,
                              int64_t row) {
  contract<V, T>(rec, rowptr, lo, hi, a, b, [&](int i, const T* acc) { store<V>(out + i * row, acc); });
}

// out[i] += sum over the thread's V channels of table(a, b)[i]: one thread's share of the
// cotangent of an operand broadcast over channels (the caller adds the shares in a fixed order).
template <int V, typename T, typename Rec, typename A, typename B>
E3J_HD void channel_sum_contraction(const Rec* rec, const int32_t* rowptr, int lo, int hi, const A& a, const B& b,
                                    T* out) {
  contract<V, T>(rec, rowptr, lo, hi, a, b, [&](int i, const T* acc) {
    T sum = T(0);
#pragma unroll
    for (int v = 0; v < V; ++v) sum += acc[v];
    out[i] += sum;
  });
}

// Convolution forward, one edge: acc[i0] += s[e, i3(i0)] * (x_a ⊗ y_e)[i0] (the edge scalar is
// factored out of the row's record sum). `acc` rows are contiguous (V channels at acc + i0 * row).
template <int V, typename T, typename Rec, typename A, typename B, typename S>
E3J_HD void accumulate_message(const Rec* rec, const int32_t* rowptr, int lo, int hi, const A& xa, const B& ye,
                               const S& se, const int32_t* i3, T* acc, int64_t row) {
  const Rows<T> accr{acc, row, 1};
  contract<V, T>(rec, rowptr, lo, hi, xa, ye, [&](int i0, const T* z) {
    E3J_VEC(T, V) sv[V];
    E3J_VEC(T, V) av[V];
    load<V>(se, i3[i0], sv);
    load<V>(accr, i0, av);
#pragma unroll
    for (int v = 0; v < V; ++v) av[v] += sv[v] * z[v];
    store<V>(acc + i0 * row, av);
  });
}

// Convolution backward, ds of one edge over output rows [lo, hi), which must hold whole paths (the
// rows of a path are contiguous: core lists paths in output order):
// ds[p] = Σ_{i0 in [lo, hi): i3(i0)=p} (x_a ⊗ y_e)[i0] * dm_b[i0], the paths of those rows zeroed first;
// path p's V channels at ds + cols[p] (scalar stores: any column, as ColumnRows reads).
template <int V, typename T, typename Rec, typename A, typename B>
E3J_HD void edge_scalar_cotangent(const Rec* rec, const int32_t* rowptr, int lo, int hi, const A& xa, const B& ye,
                                  const Rows<T>& dmb, const int32_t* i3, T* ds, const int32_t* cols) {
  if (lo >= hi) return;
  for (int p = i3[lo]; p <= i3[hi - 1]; ++p)
#pragma unroll
    for (int v = 0; v < V; ++v) ds[cols[p] + v] = T(0);
  contract<V, T>(rec, rowptr, lo, hi, xa, ye, [&](int i0, const T* z) {
    T* out = ds + cols[i3[i0]];
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] += z[v] * dmb.at(i0, v);
  });
}

}  // namespace e3j
