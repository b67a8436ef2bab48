// The XLA FFI handler symbols of one target (host or CUDA), exported to Python by module.cc.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* e3j_tp_fwd(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* e3j_tp_bwd(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* e3j_conv_fwd(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* e3j_conv_bwd(XLA_FFI_CallFrame* call_frame);
}
