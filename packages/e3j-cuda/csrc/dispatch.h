// Dtype / index-width / vector-width dispatch and shape checks shared by the host and CUDA handlers.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace e3j {

namespace ffi = xla::ffi;

template <typename T>
struct Tag {
  using type = T;
};

template <int V>
using Width = std::integral_constant<int, V>;

// Calls f(Tag<T>, Tag<Idx>, Width<V>) for the operand dtype T (f32/f64), record index type Idx
// (1 byte: uint8, 4 bytes: int32) and the widest V in {4, 2, 1} dividing `channels`.
template <typename F>
ffi::Error dispatch(ffi::DataType dtype, int64_t index_bytes, int64_t channels, F&& f) {
  auto with_index = [&](auto t) -> ffi::Error {
    auto with_width = [&](auto i) -> ffi::Error {
      if (channels % 4 == 0) return f(t, i, Width<4>{});
      if (channels % 2 == 0) return f(t, i, Width<2>{});
      return f(t, i, Width<1>{});
    };
    if (index_bytes == 1) return with_width(Tag<uint8_t>{});
    if (index_bytes == 4) return with_width(Tag<int32_t>{});
    return ffi::Error::InvalidArgument("e3j_cuda: index_bytes must be 1 or 4, got " + std::to_string(index_bytes));
  };
  if (dtype == ffi::DataType::F32) return with_index(Tag<float>{});
  if (dtype == ffi::DataType::F64) return with_index(Tag<double>{});
  return ffi::Error::InvalidArgument("e3j_cuda: operands must be float32 or float64");
}

inline int64_t dim(const ffi::AnyBuffer& b, int k) { return b.dimensions()[k]; }
inline int64_t rank(const ffi::AnyBuffer& b) { return b.dimensions().size(); }

// Sizes of the backward handlers, read the same way by both targets. Unneeded operands and unwanted
// results are 0-size placeholders, so the table sizes come from the row pointers (rows + 1 each).
struct TpBwdDims {
  int64_t B, Dz, C, Dx, Dy;
};
inline TpBwdDims tp_bwd_dims(const ffi::AnyBuffer& dz, const ffi::Buffer<ffi::S32>& rowptr_x,
                             const ffi::Buffer<ffi::S32>& rowptr_y) {
  return {dim(dz, 0), dim(dz, 1), dim(dz, 2), static_cast<int64_t>(rowptr_x.element_count()) - 1,
          static_cast<int64_t>(rowptr_y.element_count()) - 1};
}

struct ConvBwdDims {
  int64_t N, Dz, C, E, Dx, Dy, P;
  int64_t Ws, Wds;  // row widths of s and ds: 0 when s is not read / ds not wanted
};
inline ConvBwdDims conv_bwd_dims(const ffi::AnyBuffer& dm, const ffi::Buffer<ffi::S32>& order,
                                 const ffi::Buffer<ffi::S32>& rowptr_x, const ffi::Buffer<ffi::S32>& rowptr_y,
                                 const ffi::Buffer<ffi::S32>& s_cols, const ffi::AnyBuffer& s, const ffi::AnyBuffer& ds,
                                 bool want_s) {
  return {dim(dm, 0),
          dim(dm, 1),
          dim(dm, 2),
          static_cast<int64_t>(order.element_count()),
          static_cast<int64_t>(rowptr_x.element_count()) - 1,
          static_cast<int64_t>(rowptr_y.element_count()) - 1,
          static_cast<int64_t>(s_cols.element_count()),
          rank(s) == 2 ? dim(s, 1) : 0,
          want_s ? dim(ds, 1) : 0};
}

inline ffi::Error expect(bool ok, const char* what) {
  return ok ? ffi::Error::Success() : ffi::Error::InvalidArgument(std::string("e3j_cuda: ") + what);
}

}  // namespace e3j
