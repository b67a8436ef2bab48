// Host (CPU) XLA FFI handlers: the per-thread algorithm of algorithm.cuh / ops.cuh run by loops,
// one "thread" per (unit, channel group). The units (batch rows; a convolution's receivers, or its
// backward's senders) are split into blocks that run on XLA's CPU thread pool and the calling
// thread. Deterministic: every output element is written by the one unit that owns it (a receiver's
// rows, a sender's dx rows and the dy / ds rows of its edges), and every reduction visits its terms
// in a fixed order, so the result does not depend on which thread ran which block.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>

#define E3J_HOST_THREAD_POOL 1
#include "bindings.h"
#include "dispatch.h"
#include "handlers.h"
#include "ops.cuh"

namespace e3j {
namespace {

// body(lo, hi) over [0, n) in blocks (about four per thread of `pool`), on the pool and the calling
// thread. The caller takes blocks too and waits only for blocks already taken: XLA may run scheduled
// tasks late, on the caller's thread or on a pool of one, so nothing waits for a task to start. A
// task that starts after every block was taken touches only the shared counters, never `body`.
// noexcept: a throw after the first Schedule would leave tasks running `body` on an unwound stack;
// terminating is the defined alternative (the bodies are arithmetic: nothing in them throws).
template <typename Body>
void parallel_for(ffi::ThreadPool& pool, int64_t n, const Body& body) noexcept {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t blocks = std::min<int64_t>(n, 4 * threads);
  if (threads == 1 || blocks <= 1) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mu;
    std::condition_variable finished;
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, blocks, &body]() noexcept {
    for (int64_t k = state->next.fetch_add(1); k < blocks; k = state->next.fetch_add(1)) {
      body(k * n / blocks, (k + 1) * n / blocks);
      if (state->done.fetch_add(1) + 1 == blocks) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->finished.notify_all();
      }
    }
  };
  // each task a copy of `work` (Schedule takes ownership)
  for (int64_t t = 1; t < std::min(threads, blocks); ++t) pool.Schedule(decltype(work)(work));
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->finished.wait(lock, [&] { return state->done.load() == blocks; });
}

// dy of one unit (a batch row, or an edge) for the thread's channels c0 .. c0 + V - 1: its rows per
// channel, or, for a y broadcast over channels, those channels' sums added to its rows
template <int V, typename T, typename Rec, typename G>
void y_cotangent(const Rec* rec, const int32_t* rowptr, int64_t Dy, const Rows<T>& x_unit, const G& g, T* dy,
                 int64_t unit, int64_t C, int64_t c0, bool y_channels) {
  if (y_channels)
    store_contraction<V, T>(rec, rowptr, 0, Dy, x_unit, g, dy + (unit * Dy * C + c0), C);
  else
    channel_sum_contraction<V, T>(rec, rowptr, 0, Dy, x_unit, g, dy + unit * Dy);
}

template <typename T>
const T* data(const ffi::AnyBuffer& b) {
  return static_cast<const T*>(b.untyped_data());
}
template <typename T>
T* data(ffi::Result<ffi::AnyBuffer>& b) {
  return static_cast<T*>(b->untyped_data());
}

ffi::Error TpFwd(ffi::ThreadPool pool, ffi::AnyBuffer records, ffi::Buffer<ffi::S32> rowptr, ffi::AnyBuffer x,
                 ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> z, int64_t index_bytes, bool y_channels) {
  const int64_t B = dim(x, 0), Dx = dim(x, 1), C = dim(x, 2), Dy = dim(y, 1), Dz = dim(*z, 1);
  return dispatch(x.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const Rec* rec = static_cast<const Rec*>(records.untyped_data());
    parallel_for(pool, B, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b)
        for (int64_t c0 = 0; c0 < C; c0 += V)
          store_contraction<V, T>(rec, rowptr.typed_data(), 0, Dz, channel_rows(data<T>(x), b, Dx, C, c0),
                                  y_rows(data<T>(y), b, Dy, C, c0, y_channels), data<T>(z) + (b * Dz * C + c0), C);
    });
    return ffi::Error::Success();
  });
}

ffi::Error TpBwd(ffi::ThreadPool pool, ffi::AnyBuffer rec_x, ffi::Buffer<ffi::S32> rowptr_x, ffi::AnyBuffer rec_y,
                 ffi::Buffer<ffi::S32> rowptr_y, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer dz,
                 ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dy, int64_t index_bytes, bool y_channels,
                 bool want_x, bool want_y) {
  const TpBwdDims d = tp_bwd_dims(dz, rowptr_x, rowptr_y);
  const int64_t B = d.B, Dz = d.Dz, C = d.C, Dx = d.Dx, Dy = d.Dy;  // (lambdas cannot capture bindings in C++17)
  return dispatch(dz.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const Rec* rx = static_cast<const Rec*>(rec_x.untyped_data());
    const Rec* ry = static_cast<const Rec*>(rec_y.untyped_data());
    if (want_y && !y_channels) std::memset(dy->untyped_data(), 0, dy->size_bytes());
    parallel_for(pool, B, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b)
        for (int64_t c0 = 0; c0 < C; c0 += V) {
          const Rows<T> dzr = channel_rows(data<T>(dz), b, Dz, C, c0);
          if (want_x)
            store_contraction<V, T>(rx, rowptr_x.typed_data(), 0, Dx, y_rows(data<T>(y), b, Dy, C, c0, y_channels),
                                    dzr, data<T>(dx) + (b * Dx * C + c0), C);
          if (want_y)
            y_cotangent<V, T>(ry, rowptr_y.typed_data(), Dy, channel_rows(data<T>(x), b, Dx, C, c0), dzr, data<T>(dy),
                              b, C, c0, y_channels);
        }
    });
    return ffi::Error::Success();
  });
}

ffi::Error ConvFwd(ffi::ThreadPool pool, ffi::AnyBuffer records, ffi::Buffer<ffi::S32> rowptr, ffi::Buffer<ffi::S32> i3,
                   ffi::Buffer<ffi::S32> s_cols, ffi::Buffer<ffi::S32> offsets, ffi::Buffer<ffi::S32> order,
                   ffi::Buffer<ffi::S32> senders, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer s,
                   ffi::Result<ffi::AnyBuffer> m, int64_t index_bytes, bool y_channels) {
  const int64_t N = dim(x, 0), Dx = dim(x, 1), C = dim(x, 2), Dy = dim(y, 1), Ws = dim(s, 1), Dz = dim(*m, 1);
  return dispatch(x.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const Rec* rec = static_cast<const Rec*>(records.untyped_data());
    parallel_for(pool, N, [&](int64_t lo, int64_t hi) {  // receivers lo..hi own their rows of m
      std::memset(data<T>(m) + lo * Dz * C, 0, (hi - lo) * Dz * C * sizeof(T));
      for (int64_t b = lo; b < hi; ++b)
        for (int64_t k = offsets.typed_data()[b]; k < offsets.typed_data()[b + 1]; ++k) {
          const int64_t e = order.typed_data()[k], a = senders.typed_data()[e];
          for (int64_t c0 = 0; c0 < C; c0 += V)
            accumulate_message<V, T>(rec, rowptr.typed_data(), 0, Dz, channel_rows(data<T>(x), a, Dx, C, c0),
                                     y_rows(data<T>(y), e, Dy, C, c0, y_channels),
                                     ColumnRows<T>{data<T>(s) + e * Ws + c0, s_cols.typed_data()}, i3.typed_data(),
                                     data<T>(m) + (b * Dz * C + c0), C);
        }
    });
    return ffi::Error::Success();
  });
}

ffi::Error ConvBwd(ffi::ThreadPool pool, ffi::AnyBuffer rec_t, ffi::Buffer<ffi::S32> rowptr_t, ffi::AnyBuffer rec_x,
                   ffi::Buffer<ffi::S32> rowptr_x, ffi::AnyBuffer rec_y, ffi::Buffer<ffi::S32> rowptr_y,
                   ffi::Buffer<ffi::S32> i3, ffi::Buffer<ffi::S32> s_cols, ffi::Buffer<ffi::S32> offsets,
                   ffi::Buffer<ffi::S32> order, ffi::Buffer<ffi::S32> receivers, ffi::Buffer<ffi::S32> num_valid,
                   ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer s, ffi::AnyBuffer dm, ffi::AnyBuffer /*ds_into*/,
                   ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dy, ffi::Result<ffi::AnyBuffer> ds,
                   int64_t index_bytes, bool y_channels, bool want_x, bool want_y, bool want_s) {
  const ConvBwdDims d = conv_bwd_dims(dm, order, rowptr_x, rowptr_y, s_cols, s, *ds, want_s);
  const int64_t N = d.N, Dz = d.Dz, C = d.C, E = d.E, Dx = d.Dx, Dy = d.Dy, P = d.P, Ws = d.Ws, Wds = d.Wds;
  return dispatch(dm.element_type(), index_bytes, C, [&](auto t, auto i, auto w) {
    using T = typename decltype(t)::type;
    using Rec = Record<typename decltype(i)::type, T>;
    constexpr int V = decltype(w)::value;
    const Rec* rt = static_cast<const Rec*>(rec_t.untyped_data());
    const Rec* rx = static_cast<const Rec*>(rec_x.untyped_data());
    const Rec* ry = static_cast<const Rec*>(rec_y.untyped_data());
    const int32_t* map = i3.typed_data();
    const int32_t* cols = s_cols.typed_data();
    if (want_x) std::memset(dx->untyped_data(), 0, dx->size_bytes());
    if (want_y) std::memset(dy->untyped_data(), 0, dy->size_bytes());  // padding edges stay zero
    if (want_s)  // the padding edges' paths (the sweep writes the others'; ds's other columns are kept)
      for (int64_t k = num_valid.typed_data()[0]; k < E; ++k)
        for (int64_t p = 0; p < P; ++p)
          std::memset(data<T>(ds) + order.typed_data()[k] * Wds + cols[p], 0, C * sizeof(T));
    // senders lo..hi own their rows of dx and their edges' rows of dy and ds: each valid edge is in
    // exactly one sender's range of the sender order (e3j.Graph's CSR; padding edges in none)
    parallel_for(pool, N, [&](int64_t lo, int64_t hi) {
      for (int64_t a = lo; a < hi; ++a)
        for (int64_t k = offsets.typed_data()[a]; k < offsets.typed_data()[a + 1]; ++k) {
          const int64_t e = order.typed_data()[k], b = receivers.typed_data()[e];
          for (int64_t c0 = 0; c0 < C; c0 += V) {
            const Rows<T> dmb = channel_rows(data<T>(dm), b, Dz, C, c0);
            if (want_x || want_y) {
              const ScaledRows<T, ColumnRows<T>> g{dmb, ColumnRows<T>{data<T>(s) + e * Ws + c0, cols}, map};
              if (want_x)
                contract<V, T>(rx, rowptr_x.typed_data(), 0, Dx, y_rows(data<T>(y), e, Dy, C, c0, y_channels), g,
                               [&](int r, const T* acc) {
                                 T* out = data<T>(dx) + (a * Dx + r) * C + c0;
                                 for (int v = 0; v < V; ++v) out[v] += acc[v];
                               });
              if (want_y)
                y_cotangent<V, T>(ry, rowptr_y.typed_data(), Dy, channel_rows(data<T>(x), a, Dx, C, c0), g,
                                  data<T>(dy), e, C, c0, y_channels);
            }
            if (want_s)
              edge_scalar_cotangent<V, T>(rt, rowptr_t.typed_data(), 0, static_cast<int>(Dz),
                                          channel_rows(data<T>(x), a, Dx, C, c0),
                                          y_rows(data<T>(y), e, Dy, C, c0, y_channels), dmb, map,
                                          data<T>(ds) + (e * Wds + c0), cols);
          }
        }
    });
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace e3j

E3J_DEFINE_HANDLERS(e3j::TpFwd, e3j::TpBwd, e3j::ConvFwd, e3j::ConvBwd)
