// The CUDA execution model as ffi_cuda.cu uses it, in one place.
//
// Under nvcc this is CUDA itself: launch() is a triple-chevron launch and E3J_DYNAMIC_SMEM the
// kernel's extern shared array. Under a host C++ compiler with E3J_SIMT_EMULATION defined (the
// `_simt` target) it is an emulation of that model on the CPU, so that the CUDA kernels themselves —
// grid and block mapping, shared-memory staging, the y-axis split of the records, the reductions
// and their __syncthreads — run in the tests of a machine without a GPU:
//   - a launch runs the blocks one after another, in grid order; the threads of a block are OS
//     threads, so __syncthreads is a real barrier and a missing one can show up as a wrong result;
//   - dynamic shared memory is filled with 0xff bytes (NaN for floats) before every block, so a read
//     of an element no thread wrote propagates NaN instead of passing by chance;
//   - the launch limits of sm_90 are enforced and reported through cudaGetLastError as CUDA does:
//     1024 threads per block, grid y and z at most 65535, 48 KiB of dynamic shared memory unless the
//     kernel opted in with cudaFuncSetAttribute (at most 227 KiB);
//   - the vector loads of algorithm.cuh (records, float2/float4 rows) are checked for alignment and a
//     misaligned one fails the launch ("misaligned address"), as on the GPU.
// Not emulated: warps (no lockstep; the kernels use no warp intrinsics), timing and coalescing.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(E3J_SIMT_EMULATION)

#include <cuda_runtime.h>

#define E3J_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace e3j {
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, A... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
}
}  // namespace e3j

#else  // E3J_SIMT_EMULATION

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define E3J_DYNAMIC_SMEM(name) unsigned char* name = ::e3j_simt::dynamic_shared_memory()

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorMisalignedAddress = 716
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };

// The built-in variables, per emulated thread.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// Device code calls min/max unqualified (CUDA's overloads).
using std::max;
using std::min;

namespace e3j_simt {

constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_90's opt-in maximum per block
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxBlockZ = 64;

// A barrier for the threads of one block that tolerates threads leaving (returning from the kernel)
// while others wait, as exited threads no longer hold up a barrier on the GPU.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}

  // Wait for every thread still running; `on_release` runs once, in the last arriving thread,
  // before any thread leaves the barrier.
  template <typename F>
  void arrive_and_wait(F&& on_release) {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long phase = phase_;
    if (++arrived_ == count_) {
      on_release();
      release();
    } else {
      released_.wait(lock, [&] { return phase_ != phase; });
    }
  }
  void arrive_and_wait() {
    arrive_and_wait([] {});
  }

  // The calling thread leaves the barrier for good (it returned from the kernel).
  void drop() {
    std::lock_guard<std::mutex> lock(mutex_);
    --count_;
    if (arrived_ > 0 && arrived_ == count_) release();
  }

  void reset(int count) {
    std::lock_guard<std::mutex> lock(mutex_);
    count_ = count;
    arrived_ = 0;
  }

 private:
  void release() {
    arrived_ = 0;
    ++phase_;
    released_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable released_;
  int count_;
  int arrived_ = 0;
  unsigned long phase_ = 0;
};

struct Runtime {
  std::mutex mutex;
  std::map<const void*, size_t> shared_limit;  // kernels that opted in to more shared memory
  cudaError_t last_error = cudaSuccess;
};
inline Runtime& runtime() {
  static Runtime r;
  return r;
}

inline thread_local Barrier* block_barrier = nullptr;
inline thread_local unsigned char* shared_memory = nullptr;

inline unsigned char* dynamic_shared_memory() { return shared_memory; }

inline void fail(cudaError_t err) {
  std::lock_guard<std::mutex> lock(runtime().mutex);
  runtime().last_error = err;
}

// A load or store the device makes as one 64/128/256-bit vector access (a 256-bit one is two 128-bit
// accesses) must be aligned to min(bytes, 16); on the GPU a misaligned one aborts the kernel.
inline void vector_access(const void* p, size_t bytes) {
  if (bytes != 8 && bytes != 16 && bytes != 32) return;  // scalar accesses on the device
  const size_t align = bytes < 16 ? bytes : 16;
  if (reinterpret_cast<uintptr_t>(p) % align != 0) fail(cudaErrorMisalignedAddress);
}

}  // namespace e3j_simt

inline void __syncthreads() { e3j_simt::block_barrier->arrive_and_wait(); }

inline cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(e3j_simt::runtime().mutex);
  const cudaError_t err = e3j_simt::runtime().last_error;
  e3j_simt::runtime().last_error = cudaSuccess;
  return err;
}

inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated launch)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument (emulated launch)";
    case cudaErrorMisalignedAddress:
      return "misaligned address (emulated launch)";
  }
  return "unknown error";
}

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin || device != 0) return cudaErrorInvalidValue;
  *value = static_cast<int>(e3j_simt::kMaxSharedBytes);
  return cudaSuccess;
}

template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  std::lock_guard<std::mutex> lock(e3j_simt::runtime().mutex);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > e3j_simt::kMaxSharedBytes) {
    e3j_simt::runtime().last_error = cudaErrorInvalidValue;  // as CUDA: also the next cudaGetLastError's
    return cudaErrorInvalidValue;
  }
  e3j_simt::runtime().shared_limit[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  return cudaSuccess;
}

// The stream's work runs at once on the host: a memset is done when it returns.
inline cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  if (bytes > 0) std::memset(ptr, value, bytes);
  return cudaSuccess;
}

namespace e3j {

// Runs kernel<<<grid, block, shared_bytes>>>(args...) to completion on the host (see the header).
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t, A... args) {
  using namespace e3j_simt;
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > kMaxBlockZ || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 0x7fffffffu || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)
    return fail(cudaErrorInvalidConfiguration);
  size_t limit = kDefaultSharedBytes;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    const auto it = runtime().shared_limit.find(reinterpret_cast<const void*>(kernel));
    if (it != runtime().shared_limit.end()) limit = std::max(limit, it->second);
  }
  if (shared_bytes > limit) return fail(cudaErrorInvalidValue);

  const int nt = static_cast<int>(threads);
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  const size_t padded = std::max<size_t>(16, (shared_bytes + 15) / 16 * 16);
  std::unique_ptr<unsigned char, decltype(&std::free)> shared(
      static_cast<unsigned char*>(std::aligned_alloc(16, padded)), &std::free);
  std::memset(shared.get(), 0xff, padded);
  Barrier in_block(nt), between_blocks(nt);

  auto worker = [&](int t) {
    threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    blockDim = block;
    gridDim = grid;
    block_barrier = &in_block;
    shared_memory = shared_bytes ? shared.get() : nullptr;
    for (uint64_t k = 0; k < blocks; ++k) {
      blockIdx = dim3(static_cast<unsigned>(k % grid.x), static_cast<unsigned>((k / grid.x) % grid.y),
                      static_cast<unsigned>(k / (uint64_t(grid.x) * grid.y)));
      kernel(args...);
      in_block.drop();
      between_blocks.arrive_and_wait([&] {
        in_block.reset(nt);
        std::memset(shared.get(), 0xff, padded);
      });
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(nt);
  for (int t = 0; t < nt; ++t) pool.emplace_back(worker, t);
  for (auto& th : pool) th.join();
}

}  // namespace e3j

#endif  // E3J_SIMT_EMULATION
