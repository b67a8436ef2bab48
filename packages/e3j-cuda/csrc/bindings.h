// The FFI signatures of e3j's four handlers, written once for the host and the CUDA targets.
// Each target defines the implementations TpFwd, TpBwd, ConvFwd, ConvBwd (the CUDA ones take the
// stream first, the host ones XLA's CPU thread pool) and expands E3J_DEFINE_HANDLERS() once.
#pragma once

#include "xla/ffi/api/ffi.h"

#ifdef E3J_WITH_CUDA
#include <cuda_runtime.h>
#define E3J_BIND() ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
#elif defined(E3J_HOST_THREAD_POOL)
// the host target runs its loops on XLA's CPU thread pool (intra-op threads), handed in per call
#define E3J_BIND() ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>()
#else
#define E3J_BIND() ::xla::ffi::Ffi::Bind()
#endif

// clang-format off
#define E3J_DEFINE_HANDLERS(TpFwd, TpBwd, ConvFwd, ConvBwd) \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_tp_fwd, TpFwd, \
    E3J_BIND() \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records: packed (i0, i1, i2, c) of the table, raw bytes */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dout + 1]: CSR of the records by i0 */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* x [B, Dx, C] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* y [B, Dy] or [B, Dy, C] */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* z [B, Dout, C] */ \
        .Attr<int64_t>("index_bytes")                    /* 1 (uint8 indices) or 4 (int32) */ \
        .Attr<bool>("y_channels")                        /* y has a channel axis */); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_tp_bwd, TpBwd, \
    E3J_BIND() \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of vjp_x (i1, i2, i0, c) */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dx + 1] of vjp_x */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of vjp_y (i2, i1, i0, c) */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dy + 1] of vjp_y */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* x [B, Dx, C], or 0-size when dy is not wanted */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* y [B, Dy(, C)], or 0-size when dx is not wanted */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* dz [B, Dout, C] */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* dx [B, Dx, C], or 0-size */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* dy [B, Dy(, C)], or 0-size */ \
        .Attr<int64_t>("index_bytes")                    /* 1 (uint8 indices) or 4 (int32) */ \
        .Attr<bool>("y_channels")                        /* y has a channel axis */ \
        .Attr<bool>("want_x")                            /* compute dx */ \
        .Attr<bool>("want_y")                            /* compute dy */); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_conv_fwd, ConvFwd, \
    E3J_BIND() \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of the table */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dout + 1] */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* i3 [Dout]: path of each output row */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* s_cols [P]: first column of each path's weights */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* receiver_offsets [N + 1]: CSR of order by receiver */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* order [E]: edge ids sorted by receiver, padding last */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* senders [E] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* x [N, Dx, C] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* y [E, Dy] or [E, Dy, C] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* s [E, W]: weights at columns s_cols[p] .. + C - 1 */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* m [N, Dout, C] */ \
        .Attr<int64_t>("index_bytes")                    /* 1 (uint8 indices) or 4 (int32) */ \
        .Attr<bool>("y_channels")                        /* y has a channel axis */); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_conv_bwd, ConvBwd, \
    E3J_BIND() \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of the table (ds) */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dout + 1] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of vjp_x (dx) */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dx + 1] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* records of vjp_y (dy) */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* rowptr [Dy + 1] */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* i3 [Dout]: path of each output row */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* s_cols [P]: each path's first column in s, ds */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* sender_offsets [N + 1]: CSR of sender_order */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* sender_order [E]: edge ids sorted by sender, padding last */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* receivers [E] */ \
        .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()      /* num_valid [1]: non-padding edges */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* x [N, Dx, C], or 0-size when not read */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* y [E, Dy(, C)], or 0-size when not read */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* s [E, W], or 0-size when not read */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* dm [N, Dout, C] */ \
        .Arg<::xla::ffi::AnyBuffer>()                    /* ds_into [E, W] (aliased to ds; not read), or 0-size */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* dx [N, Dx, C], or 0-size */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* dy [E, Dy(, C)], or 0-size */ \
        .Ret<::xla::ffi::AnyBuffer>()                    /* ds [E, W]: only the paths' columns written; or 0-size */ \
        .Attr<int64_t>("index_bytes")                    /* 1 (uint8 indices) or 4 (int32) */ \
        .Attr<bool>("y_channels")                        /* y has a channel axis */ \
        .Attr<bool>("want_x")                            /* compute dx */ \
        .Attr<bool>("want_y")                            /* compute dy */ \
        .Attr<bool>("want_s")                            /* compute ds */);
// clang-format on
