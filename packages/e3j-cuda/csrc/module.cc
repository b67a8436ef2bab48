// Python module of one target (_host, _cuda or _simt): the FFI handler capsules, under the names the
// target registers them (E3J_FFI_PREFIX: "e3j", or "e3j_simt" so the emulated CUDA kernels can sit
// beside the host target on the CPU platform), and what it was built with.
#include <nanobind/nanobind.h>

#include "algorithm.cuh"
#include "handlers.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

#ifndef E3J_FFI_PREFIX
#define E3J_FFI_PREFIX "e3j"
#endif

namespace {
template <typename F>
nb::capsule handler(F* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(E3J_MODULE_NAME, m) {
  m.doc() = "e3j XLA FFI handlers (see e3j_cuda._ffi)";
  m.def("handlers", []() {
    nb::dict d;
    d[E3J_FFI_PREFIX "_tp_fwd"] = handler(e3j_tp_fwd);
    d[E3J_FFI_PREFIX "_tp_bwd"] = handler(e3j_tp_bwd);
    d[E3J_FFI_PREFIX "_conv_fwd"] = handler(e3j_conv_fwd);
    d[E3J_FFI_PREFIX "_conv_bwd"] = handler(e3j_conv_bwd);
    return d;
  });
  m.attr("FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.attr("BUILT_WITH_JAX") = E3J_BUILT_WITH_JAX;
  m.attr("COO_FORMAT_VERSION") = E3J_COO_FORMAT;
  m.attr("FFI_PREFIX") = E3J_FFI_PREFIX;
#ifdef E3J_WITH_CUDA
  m.attr("PLATFORM") = "CUDA";
#else
  m.attr("PLATFORM") = "cpu";
#endif
}
