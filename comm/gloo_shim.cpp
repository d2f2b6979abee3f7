// The Gloo transport behind comm/comm.h: the only C++ in comm/, reached through the
// extern "C" functions of comm/comm_internal.h. Every Gloo exception is caught here and
// becomes SMELT_EBACKEND with Gloo's message: none crosses into C.
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// common/error.h has no extern "C" block of its own.
extern "C" {
#include "common/error.h"
}
#include "comm/comm_internal.h"

namespace {

// Gloo's Store over a comm_store, with this communicator's key prefix.
class StoreAdapter : public gloo::rendezvous::Store {
  public:
    StoreAdapter(comm_store *store, std::string prefix, int timeout_ms)
        : store_(store), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        smelt_error err{};
        if (store_->ops->set(store_->impl, full(key).c_str(), data.data(), data.size(), &err))
            throw gloo::Exception(err.message);
    }
    std::vector<char> get(const std::string &key) override {
        smelt_error err{};
        void *data = nullptr;
        size_t len = 0;
        if (store_->ops->get(store_->impl, full(key).c_str(), timeout_ms_, &data, &len, &err))
            throw gloo::Exception(err.message);
        std::vector<char> out(static_cast<char *>(data), static_cast<char *>(data) + len);
        free(data);
        return out;
    }
    void wait(const std::vector<std::string> &keys) override {
        wait(keys, std::chrono::milliseconds(timeout_ms_));
    }
    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override {
        std::vector<std::string> names;
        std::vector<const char *> ptrs;
        for (const auto &k : keys) names.push_back(full(k));
        for (const auto &n : names) ptrs.push_back(n.c_str());
        smelt_error err{};
        if (store_->ops->wait(store_->impl, ptrs.data(), ptrs.size(),
                              static_cast<int>(timeout.count()), &err))
            throw gloo::Exception(err.message);
    }

  private:
    std::string full(const std::string &key) const { return prefix_ + "/" + key; }
    comm_store *store_;
    std::string prefix_;
    int timeout_ms_;
};

// bf16 as the upper half of an f32; rounding back is to nearest even, NaN kept quiet.
float bf16_load(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
uint16_t bf16_store(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}
void bf16_sum(void *c, const void *a, const void *b, size_t n) {
    auto *o = static_cast<uint16_t *>(c);
    auto *x = static_cast<const uint16_t *>(a);
    auto *y = static_cast<const uint16_t *>(b);
    for (size_t i = 0; i < n; i++) o[i] = bf16_store(bf16_load(x[i]) + bf16_load(y[i]));
}
void bf16_max(void *c, const void *a, const void *b, size_t n) {
    auto *o = static_cast<uint16_t *>(c);
    auto *x = static_cast<const uint16_t *>(a);
    auto *y = static_cast<const uint16_t *>(b);
    for (size_t i = 0; i < n; i++) o[i] = bf16_load(x[i]) >= bf16_load(y[i]) ? x[i] : y[i];
}

gloo::AllreduceOptions::Func reduce_fn(comm_dtype dtype, comm_reduce op) {
    if (dtype == COMM_BF16) return op == COMM_SUM ? bf16_sum : bf16_max;
    using F = void (*)(void *, const void *, const void *, size_t);
    return op == COMM_SUM ? static_cast<F>(&gloo::sum<float>) : static_cast<F>(&gloo::max<float>);
}

int fail(smelt_error *err, const char *what, const std::exception &e) {
    return error_set(err, SMELT_EBACKEND, "%s: %s", what, e.what());
}

}  // namespace

struct gloo_ctx {
    std::shared_ptr<gloo::rendezvous::Context> context;
};

extern "C" int gloo_ctx_create(comm_store *store, const char *prefix, int rank, int size,
                               const char *host, int timeout_ms, gloo_ctx **out,
                               smelt_error *err) {
    *out = nullptr;
    try {
        auto ctx = std::make_unique<gloo_ctx>();
        gloo::transport::tcp::attr attr(host ? host : "127.0.0.1");
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        ctx->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        ctx->context->setTimeout(std::chrono::milliseconds(timeout_ms));
        StoreAdapter adapter(store, prefix, timeout_ms);
        ctx->context->connectFullMesh(adapter, dev);
        *out = ctx.release();
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "connecting", e);
    }
}

extern "C" void gloo_ctx_destroy(gloo_ctx *ctx) {
    delete ctx;
}

extern "C" int gloo_all_reduce(gloo_ctx *ctx, void *buf, size_t count, comm_dtype dtype,
                               comm_reduce op, uint32_t tag, int timeout_ms,
                               smelt_error *err) {
    try {
        gloo::AllreduceOptions opts(ctx->context);
        if (dtype == COMM_BF16)
            opts.setOutput(static_cast<uint16_t *>(buf), count);
        else
            opts.setOutput(static_cast<float *>(buf), count);
        opts.setReduceFunction(reduce_fn(dtype, op));
        opts.setTag(tag);
        opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        gloo::allreduce(opts);
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "all_reduce", e);
    }
}

extern "C" int gloo_all_gather(gloo_ctx *ctx, const void *send, void *recv,
                               const size_t *counts, comm_dtype dtype, uint32_t tag,
                               int timeout_ms, smelt_error *err) {
    try {
        gloo::AllgathervOptions opts(ctx->context);
        int n = ctx->context->size;
        std::vector<size_t> elems(counts, counts + n);
        // Gloo reads the input without writing it; its API wants a non-const pointer.
        void *in = const_cast<void *>(send);
        if (dtype == COMM_BF16) {
            opts.setInput(static_cast<uint16_t *>(in), elems[ctx->context->rank]);
            opts.setOutput(static_cast<uint16_t *>(recv), elems);
        } else {
            opts.setInput(static_cast<float *>(in), elems[ctx->context->rank]);
            opts.setOutput(static_cast<float *>(recv), elems);
        }
        opts.setTag(tag);
        opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        gloo::allgatherv(opts);
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "all_gather", e);
    }
}

namespace {

// Apart from Gloo's own algorithms' prefixes (gloo/common/... 0x01-0x08).
constexpr uint8_t kReduceScatterSlotPrefix = 0x5e;

// One step's wait: false (aborted) and Gloo's timeout exception both fail the step.
void wait_step(gloo::transport::UnboundBuffer &sent, gloo::transport::UnboundBuffer &got, bool sending,
               bool receiving, int timeout_ms) {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    if (receiving && !got.waitRecv(timeout)) throw gloo::Exception("receive aborted");
    if (sending && !sent.waitSend(timeout)) throw gloo::Exception("send aborted");
}

}  // namespace

// Ring reduce-scatter: at step k rank r passes part (r - k - 1) mod n, as reduced so far,
// to rank r + 1 and receives part (r - k - 2) mod n from rank r - 1, adding its own values
// to it; after n - 1 steps the part received last is its own, reduced over every rank.
extern "C" int gloo_reduce_scatter(gloo_ctx *ctx, const void *send, void *recv, const size_t *offsets,
                                   const size_t *counts, comm_dtype dtype, comm_reduce op, uint32_t tag,
                                   int timeout_ms, smelt_error *err) {
    int n = ctx->context->size, r = ctx->context->rank;
    size_t esize = dtype == COMM_BF16 ? 2 : 4, most = 0;
    for (int i = 0; i < n; i++) most = counts[i] > most ? counts[i] : most;
    const char *in = static_cast<const char *>(send);
    try {
        std::vector<char> a(most * esize + 1), b(most * esize + 1); // the part sent, the part received
        auto abuf = ctx->context->createUnboundBuffer(a.data(), a.size());
        auto bbuf = ctx->context->createUnboundBuffer(b.data(), b.size());
        auto *out = abuf.get(), *inc = bbuf.get();
        char *outp = a.data(), *incp = b.data();
        auto reduce = reduce_fn(dtype, op);
        uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
        int right = (r + 1) % n, left = (r + n - 1) % n;
        int part = (r + n - 1) % n;
        std::memcpy(outp, in + offsets[part] * esize, counts[part] * esize);
        for (int k = 0; k < n - 1; k++) {
            int next = (r + 2 * n - k - 2) % n;
            bool sending = counts[part] > 0, receiving = counts[next] > 0;
            if (receiving) inc->recv(left, slot, 0, counts[next] * esize);
            if (sending) out->send(right, slot, 0, counts[part] * esize);
            wait_step(*out, *inc, sending, receiving, timeout_ms);
            reduce(incp, incp, in + offsets[next] * esize, counts[next]);
            std::swap(out, inc);
            std::swap(outp, incp);
            part = next;
        }
        std::memcpy(recv, outp, counts[r] * esize);
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "reduce_scatter", e);
    }
}

extern "C" int gloo_broadcast(gloo_ctx *ctx, void *buf, size_t count, comm_dtype dtype,
                              int root, uint32_t tag, int timeout_ms, smelt_error *err) {
    try {
        gloo::BroadcastOptions opts(ctx->context);
        if (dtype == COMM_BF16)
            opts.setOutput(static_cast<uint16_t *>(buf), count);
        else
            opts.setOutput(static_cast<float *>(buf), count);
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        gloo::broadcast(opts);
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "broadcast", e);
    }
}

extern "C" int gloo_barrier(gloo_ctx *ctx, uint32_t tag, int timeout_ms, smelt_error *err) {
    try {
        gloo::BarrierOptions opts(ctx->context);
        opts.setTag(tag);
        opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        gloo::barrier(opts);
        return SMELT_OK;
    } catch (const std::exception &e) {
        return fail(err, "barrier", e);
    }
}
