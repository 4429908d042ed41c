// ops/kernels/cuda/rows.cu compiled for the CUDA emulator (tests only).
#include "tests/cuda_emulator/kernel_language.h"

#include "ops/kernels/cuda/rows.cu"
