// The FFI signatures of e3j's four handlers, written once for the host and the CUDA targets.
// Each target defines the implementations TpFwd, TpBwd, ConvFwd, ConvBwd (the CUDA ones take the
// stream first) and expands E3J_DEFINE_HANDLERS() once.
#pragma once

#include "xla/ffi/api/ffi.h"

#ifdef E3J_WITH_CUDA
#include <cuda_runtime.h>
#define E3J_BIND() ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
#else
#define E3J_BIND() ::xla::ffi::Ffi::Bind()
#endif

// clang-format off
#define E3J_DEFINE_HANDLERS(TpFwd, TpBwd, ConvFwd, ConvBwd) \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_tp_fwd, TpFwd, \
                              E3J_BIND() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Attr<int64_t>("index_bytes") \
                                  .Attr<bool>("y_channels")); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_tp_bwd, TpBwd, \
                              E3J_BIND() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Attr<int64_t>("index_bytes") \
                                  .Attr<bool>("y_channels") \
                                  .Attr<bool>("want_x") \
                                  .Attr<bool>("want_y")); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_conv_fwd, ConvFwd, \
                              E3J_BIND() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Attr<int64_t>("index_bytes") \
                                  .Attr<bool>("y_channels")); \
 \
XLA_FFI_DEFINE_HANDLER_SYMBOL(e3j_conv_bwd, ConvBwd, \
                              E3J_BIND() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Arg<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Ret<::xla::ffi::AnyBuffer>() \
                                  .Attr<int64_t>("index_bytes") \
                                  .Attr<bool>("y_channels") \
                                  .Attr<bool>("want_x") \
                                  .Attr<bool>("want_y") \
                                  .Attr<bool>("want_s"));
// clang-format on
