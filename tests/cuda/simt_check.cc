// Checks of csrc/simt.h's emulation of CUDA's execution model (compiled and run by test_cuda.py):
// every line printed is "name ok" or "name FAILED: why"; the exit status is the number of failures.
#define E3J_SIMT_EMULATION 1
#include "simt.h"
#include "algorithm.cuh"

#include <cstdio>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* name, const std::string& why = "") {
  std::printf("%s %s%s\n", name, ok ? "ok" : "FAILED: ", ok ? "" : why.c_str());
  failures += !ok;
}

// Each thread of each block writes its coordinates once.
__global__ void coordinates(int* out) {
  const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] += 1 + thread + 1000 * block;
}

// Reads shared memory no thread wrote.
__global__ void read_unwritten(unsigned char* out) {
  E3J_DYNAMIC_SMEM(smem);
  out[threadIdx.x] = smem[threadIdx.x];
}

// Each thread reads its neighbour's shared-memory slot after a barrier; then the block's second
// half leaves early while the first half meets at a second barrier (exited threads do not block it).
__global__ void neighbours(int* out) {
  E3J_DYNAMIC_SMEM(smem_raw);
  int* smem = reinterpret_cast<int*>(smem_raw);
  const int t = threadIdx.x, n = blockDim.x;
  smem[t] = t + 100 * blockIdx.x;
  __syncthreads();
  out[blockIdx.x * n + t] = smem[(t + 1) % n];
  if (t >= n / 2) return;
  __syncthreads();
  smem[t] = -1;
}

// A block's shared memory does not carry over to the next block: every block sees 0xff bytes first.
__global__ void fresh_shared_memory(int* out) {
  E3J_DYNAMIC_SMEM(smem_raw);
  int* smem = reinterpret_cast<int*>(smem_raw);
  out[blockIdx.x * blockDim.x + threadIdx.x] = smem[threadIdx.x];
  smem[threadIdx.x] = 7;
}

__global__ void nothing(int) {}

// float4 row loads through algorithm.cuh (a 128-bit load on the device) at an offset of `shift` floats.
__global__ void vector_loads(const float* base, int shift, float* out) {
  e3j::load<4>(e3j::Rows<float>{base + shift, 4, 1}, 0, out + 4 * threadIdx.x);
}

}  // namespace

int main() {
  using e3j::launch;

  {  // the grid and block coordinates
    const dim3 grid(3, 2, 2), block(4, 2, 3);
    std::vector<int> out(12 * 24, 0);
    launch(coordinates, grid, block, 0, nullptr, out.data());
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int k = 0; k < 12 * 24; ++k) ok = ok && out[k] == 1 + k % 24 + 1000 * (k / 24);
    check(ok, "coordinates");
  }
  {  // unwritten shared memory reads as 0xff
    std::vector<unsigned char> out(32, 0);
    launch(read_unwritten, dim3(2), dim3(32), 32, nullptr, out.data());
    bool ok = cudaGetLastError() == cudaSuccess;
    for (unsigned char v : out) ok = ok && v == 0xff;
    check(ok, "unwritten_shared_memory_is_poisoned");
  }
  {  // barriers, and threads that leave before one
    const int n = 64, blocks = 3;
    std::vector<int> out(n * blocks, -7);
    launch(neighbours, dim3(blocks), dim3(n), n * sizeof(int), nullptr, out.data());
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int b = 0; b < blocks; ++b)
      for (int t = 0; t < n; ++t) ok = ok && out[b * n + t] == (t + 1) % n + 100 * b;
    check(ok, "barrier_with_early_exits");
  }
  {
    const int n = 16;
    std::vector<int> out(n * 2, 0);
    launch(fresh_shared_memory, dim3(2), dim3(n), n * sizeof(int), nullptr, out.data());
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int v : out) ok = ok && v == -1;  // 0xffffffff
    check(ok, "shared_memory_is_per_block");
  }
  {  // vector loads must be aligned as on the device
    alignas(16) float data[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    float out[8];
    launch(vector_loads, dim3(1), dim3(2), 0, nullptr, static_cast<const float*>(data), 4, out);
    check(cudaGetLastError() == cudaSuccess && out[0] == 4 && out[7] == 7, "aligned_vector_load");
    launch(vector_loads, dim3(1), dim3(2), 0, nullptr, static_cast<const float*>(data), 2, out);
    check(cudaGetLastError() == cudaErrorMisalignedAddress, "misaligned_vector_load");
  }
  // launch limits (sm_90), reported by cudaGetLastError and then cleared
  launch(nothing, dim3(1), dim3(1025), 0, nullptr, 0);
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "too_many_threads");
  check(cudaGetLastError() == cudaSuccess, "error_is_cleared_once_read");
  launch(nothing, dim3(1, 65536), dim3(32), 0, nullptr, 0);
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid_y_limit");
  launch(nothing, dim3(1), dim3(32), 48 * 1024 + 1, nullptr, 0);
  check(cudaGetLastError() == cudaErrorInvalidValue, "shared_memory_needs_opt_in");
  check(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
            cudaErrorInvalidValue,
        "opt_in_limit");
  check(cudaGetLastError() == cudaErrorInvalidValue, "failed_opt_in_is_the_last_error");  // as CUDA's runtime
  check(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) == cudaSuccess,
        "opt_in");
  launch(nothing, dim3(1), dim3(32), 100 * 1024, nullptr, 0);
  check(cudaGetLastError() == cudaSuccess, "opted_in_launch");
  launch(nothing, dim3(1), dim3(32), 100 * 1024 + 1, nullptr, 0);
  check(cudaGetLastError() == cudaErrorInvalidValue, "beyond_opt_in");
  return failures;
}
