/* The emulator's launch: one std::thread per CUDA thread, a std::barrier per block and
 * per warp. */
#include "cuda_emu.h"

#include <barrier>
#include <memory>
#include <thread>
#include <vector>

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

/* The kernels' `extern __shared__ float attn_shared[]`: one buffer for every block. */
float attn_shared[EMU_SHARED_FLOATS];

namespace {

struct block_state {
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<uint64_t> exchange;
    explicit block_state(unsigned threads) : block((std::ptrdiff_t)threads), exchange(threads) {
        for (unsigned w = 0; w < threads / 32; w++) warps.push_back(std::make_unique<std::barrier<>>(32));
    }
};

thread_local block_state *current;

} // namespace

void __syncthreads(void) { current->block.arrive_and_wait(); }

uint64_t emu_warp_exchange(uint64_t value, int src_lane) {
    unsigned warp = threadIdx.x / 32;
    current->exchange[threadIdx.x] = value;
    current->warps[warp]->arrive_and_wait();
    uint64_t got = current->exchange[warp * 32 + (unsigned)src_lane];
    current->warps[warp]->arrive_and_wait(); /* nobody overwrites a slot still being read */
    return got;
}

/* One team of host threads runs every block in turn (starting threads per block cost
 * more than the kernels); the barrier after each block keeps blocks from overlapping,
 * as every block uses the one attn_shared buffer. */
void emu_launch(dim3 grid, unsigned threads, const std::function<void()> &body) {
    block_state state(threads);
    std::vector<std::thread> team;
    team.reserve(threads);
    for (unsigned t = 0; t < threads; t++)
        team.emplace_back([&, t] {
            current = &state;
            threadIdx = dim3{t, 0, 0};
            blockDim = dim3{threads, 1, 1};
            gridDim = grid;
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++) {
                    blockIdx = dim3{bx, by, 0};
                    body();
                    state.block.arrive_and_wait();
                }
        });
    for (auto &th : team) th.join();
}
