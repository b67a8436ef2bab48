// The CUDA backward handlers (ffi_cuda.cu under csrc/simt.h's emulation) with nothing to launch:
// every cotangent they owe is still written, over outputs prefilled with garbage (XLA does not clear
// result buffers). And a failed shared-memory opt-in leaves no error behind for the next call.
// Prints one "<case> ok" or "<case> FAILED ..." line per case; built and run by test_cuda.py.
#define E3J_SIMT_EMULATION 1
#include "ffi_cuda.cu"

#include <cstdio>
#include <string>
#include <vector>

using namespace e3j;

namespace {

struct Buf {
  std::vector<int64_t> dims;
  std::vector<unsigned char> bytes;
  XLA_FFI_Buffer b{};
  Buf(XLA_FFI_DataType dtype, std::vector<int64_t> d, size_t item, unsigned char fill = 0x7f) : dims(std::move(d)) {
    size_t n = item;
    for (int64_t k : dims) n *= static_cast<size_t>(k);
    bytes.assign(n, fill);
    b.struct_size = sizeof b;
    b.dtype = dtype;
    b.data = n ? bytes.data() : nullptr;
    b.rank = static_cast<int64_t>(dims.size());
    b.dims = dims.data();
  }
  ffi::AnyBuffer any() { return ffi::AnyBuffer(&b); }
  ffi::Buffer<ffi::S32> s32() { return ffi::Buffer<ffi::S32>(&b); }
  ffi::Result<ffi::AnyBuffer> result() { return ffi::Result<ffi::AnyBuffer>(ffi::AnyBuffer(&b)); }
  float f(size_t k) const { return reinterpret_cast<const float*>(bytes.data())[k]; }
  size_t floats() const { return bytes.size() / sizeof(float); }
};

Buf ints(std::vector<int32_t> v) {
  Buf b(XLA_FFI_DataType_S32, {static_cast<int64_t>(v.size())}, 4);
  if (!v.empty()) std::memcpy(b.bytes.data(), v.data(), v.size() * 4);
  return b;
}

Buf floats(std::vector<int64_t> dims) { return Buf(XLA_FFI_DataType_F32, std::move(dims), 4); }

bool all_zero(const Buf& b, size_t begin = 0, size_t end = size_t(-1)) {
  for (size_t k = begin; k < std::min(end, b.floats()); ++k)
    if (b.f(k) != 0.0f) return false;
  return true;
}

void report(const char* name, const ffi::Error& err, bool ok, const std::string& what = "") {
  if (err.failure()) std::printf("%s FAILED: %s\n", name, err.message().c_str());
  else std::printf(ok ? "%s ok\n" : "%s FAILED %s\n", name, what.c_str());
}

// tensor product backward with C = 0 and a broadcast y: dy [B, Dy] is a sum over no channels
void tp_no_channels() {
  const int64_t B = 2, Dx = 3, Dy = 4, Dz = 5;
  Buf rec(XLA_FFI_DataType_U8, {0}, 1), px = ints(std::vector<int32_t>(Dx + 1, 0)),
      py = ints(std::vector<int32_t>(Dy + 1, 0)), x = floats({B, Dx, 0}), y = floats({B, Dy}),
      dz = floats({B, Dz, 0}), dx = floats({B, Dx, 0}), dy = floats({B, Dy});
  const ffi::Error err = TpBwd(nullptr, rec.any(), px.s32(), rec.any(), py.s32(), x.any(), y.any(), dz.any(),
                               dx.result(), dy.result(), 1, false, true, true);
  report("tp_bwd_no_channels", err, all_zero(dy), "(dy not zero)");
}

// convolution backward; `nodes` 0 (every edge padding) or `channels` 0, y broadcast or per channel
void conv(const char* name, int64_t N, int64_t C, bool y_channels) {
  const int64_t E = 3, Dx = 1, Dy = 1, Dz = 1, W = C + 2;  // ds: one path, columns 1..C of W
  Buf rec(XLA_FFI_DataType_U8, {0}, 1), rowptr = ints({0, 0}), i3 = ints({0}), cols = ints({1}),
      offsets = ints(std::vector<int32_t>(N + 1, 0)), order = ints({0, 1, 2}), receivers = ints({0, 0, 0}),
      num_valid = ints({0}), x = floats({N, Dx, C}), y = y_channels ? floats({E, Dy, C}) : floats({E, Dy}),
      s = floats({E, W}), dm = floats({N, Dz, C}), ds_into = floats({0}), dx = floats({N, Dx, C}),
      dy = y_channels ? floats({E, Dy, C}) : floats({E, Dy}), ds = floats({E, W});
  const ffi::Error err = ConvBwd(nullptr, rec.any(), rowptr.s32(), rec.any(), rowptr.s32(), rec.any(), rowptr.s32(),
                                 i3.s32(), cols.s32(), offsets.s32(), order.s32(), receivers.s32(), num_valid.s32(),
                                 x.any(), y.any(), s.any(), dm.any(), ds_into.any(), dx.result(), dy.result(),
                                 ds.result(), 1, y_channels, true, true, true);
  const float garbage = floats({1}).f(0);
  bool ds_ok = true;  // the path's columns zero, the others (another group's) untouched
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < W; ++j) {
      const bool path = j >= 1 && j < 1 + C;
      if (ds.f(e * W + j) != (path ? 0.0f : garbage)) ds_ok = false;
    }
  report(name, err, all_zero(dy) && ds_ok, all_zero(dy) ? "(ds)" : "(dy not zero)");
}

// a kernel opted in to more shared memory than the device has: the error is returned, and not left
// as the thread's last error for the next call's launch check to report as its own
void failed_opt_in() {
  const ffi::Error err = allow_smem(tp_bwd_kernel<1, float, Record<uint8_t, float>>, size_t(1) << 30);
  const cudaError_t left = cudaGetLastError();
  const bool ok = err.failure() && left == cudaSuccess &&
                  err.message().find("dynamic shared memory failed") != std::string::npos;
  std::printf(ok ? "failed_opt_in ok\n" : "failed_opt_in FAILED (returned %d, left %d: %s)\n", int(err.failure()),
              int(left), err.message().c_str());
}

}  // namespace

int main() {
  tp_no_channels();
  conv("conv_bwd_no_nodes_broadcast_y", 0, 4, false);
  conv("conv_bwd_no_nodes_channel_y", 0, 4, true);
  conv("conv_bwd_no_channels_broadcast_y", 2, 0, false);
  failed_opt_in();
}
