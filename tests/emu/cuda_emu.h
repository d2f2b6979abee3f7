/* Runs a CUDA kernel's logic on the CPU: emu_launch(grid, threads, body) runs the blocks
 * one after another, each with `threads` host threads executing body() concurrently, so
 * __syncthreads and warp shuffles synchronise real threads (a missing barrier can show up
 * as a wrong or varying result, as on a GPU). Dynamic shared memory is emu_shared, one
 * buffer reused by every block (blocks never overlap). See README.md for what this
 * checks and what it cannot. */
#ifndef SMELT_TESTS_EMU_CUDA_EMU_H
#define SMELT_TESTS_EMU_CUDA_EMU_H

#include <cuda_runtime.h>

#include <functional>

/* Floats of dynamic shared memory available to an emulated block. */
enum { EMU_SHARED_FLOATS = 1 << 16 };

/* grid.x * grid.y blocks of `threads` threads (a multiple of 32). */
void emu_launch(dim3 grid, unsigned threads, const std::function<void()> &body);

#endif
