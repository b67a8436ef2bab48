// The `_simt` target: the CUDA kernels of ffi_cuda.cu compiled for the host and launched by simt.h's
// emulation of CUDA's execution model, so the tests run the kernels themselves (launch configuration,
// shared memory, block splits, barriers) on a machine without a GPU. For tests only: it is slow.
#define E3J_SIMT_EMULATION 1
#include "ffi_cuda.cu"
