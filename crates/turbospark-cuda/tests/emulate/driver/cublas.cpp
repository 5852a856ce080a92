// An emulated cuBLAS (libcublas.so) for the emulated driver (cuda.cpp):
// handles and cublasGemmEx, the one product src/gemm.rs asks for, over the
// operand types it passes (f32, bf16 and f16 in; f32 or bf16 out). It owns
// that arithmetic; it must not do anything else, and runs through the
// driver's stream (`ts_emulated_enqueue`) so that a product issued while a
// step is being recorded replays with it.
//
// Numbers: each output is the f64 sum of its products, rounded once to
// f32 (cuBLAS sums in f32 in an order of its own; the tests' bounds are
// those of that rounding), then alpha and beta as cuBLAS applies them.
#include <cstdint>
#include <cstring>

typedef int cublasStatus_t;
enum : cublasStatus_t { OK = 0, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };

struct Handle {
    void* stream = nullptr;
};

// cuda.cpp's: runs `run(data)` in stream order (now, or at each replay of a
// graph being recorded), then `drop(data)` when it is done with it.
extern "C" int ts_emulated_enqueue(void* stream, void (*run)(void*), void (*drop)(void*),
                                   void* data);

extern "C" cublasStatus_t cublasCreate_v2(Handle** h) {
    *h = new Handle;
    return OK;
}
extern "C" cublasStatus_t cublasDestroy_v2(Handle* h) {
    delete h;
    return OK;
}
extern "C" cublasStatus_t cublasSetStream_v2(Handle* h, void* stream) {
    h->stream = stream;
    return OK;
}
extern "C" cublasStatus_t cublasSetMathMode(Handle*, int) { return OK; }
extern "C" cublasStatus_t cublasSetWorkspace_v2(Handle*, void*, size_t) { return OK; }

// cudaDataType codes (library_types.h).
enum : int { R_32F = 0, R_16F = 2, R_16BF = 14 };

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    uint32_t bits;
    if (e == 31) {
        bits = sign | 0x7f800000u | m << 13;
    } else if (e != 0) {
        bits = sign | (e + 112) << 23 | m << 13;
    } else {
        float f = (float)m * (1.0f / 16777216.0f);  // subnormal: m · 2^-24
        return sign ? -f : f;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static float load(const void* p, int type, size_t i) {
    switch (type) {
        case R_32F: return ((const float*)p)[i];
        case R_16BF: {
            const uint32_t bits = (uint32_t)((const uint16_t*)p)[i] << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
        }
        default: return f16_to_f32(((const uint16_t*)p)[i]);
    }
}

// Round to nearest even, NaN kept quiet.
static void store(void* p, int type, size_t i, float v) {
    if (type == R_32F) {
        ((float*)p)[i] = v;
        return;
    }
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint16_t b = (v != v) ? (uint16_t)(u >> 16 | 0x40)
                                : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    ((uint16_t*)p)[i] = b;
}

// One product's operands, copied when it is issued.
struct Gemm {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *a, *b;
    void* c;
    int at, bt, ct, lda, ldb, ldc;
};

// Column-major, as cuBLAS: C (m × n) = alpha · op(A) (m × k) · op(B)
// (k × n) + beta · C.
static void gemm(void* data) {
    const Gemm& g = *(const Gemm*)data;
    for (int j = 0; j < g.n; j++) {
        for (int i = 0; i < g.m; i++) {
            double sum = 0;
            for (int l = 0; l < g.k; l++) {
                const size_t ai = g.ta ? (size_t)l + (size_t)i * g.lda : i + (size_t)l * g.lda;
                const size_t bi = g.tb ? (size_t)j + (size_t)l * g.ldb : l + (size_t)j * g.ldb;
                sum += (double)load(g.a, g.at, ai) * load(g.b, g.bt, bi);
            }
            const size_t ci = i + (size_t)j * g.ldc;
            float v = g.alpha * (float)sum;
            if (g.beta != 0.0f) v += g.beta * load(g.c, g.ct, ci);
            store(g.c, g.ct, ci, v);
        }
    }
}
static void drop(void* data) { delete (Gemm*)data; }

extern "C" cublasStatus_t cublasGemmEx(Handle* h, int transa, int transb, int m, int n, int k,
                                       const void* alpha, const void* a, int at, int lda,
                                       const void* b, int bt, int ldb, const void* beta, void* c,
                                       int ct, int ldc, int compute, int) {
    // CUBLAS_COMPUTE_32F and its pedantic form: f32 alpha and beta.
    if (compute != 68 && compute != 69) return NOT_SUPPORTED;
    const auto known = [](int t) { return t == R_32F || t == R_16BF || t == R_16F; };
    if (!known(at) || !known(bt) || !known(ct) || m < 0 || n < 0 || k < 0) return INVALID_VALUE;
    if (lda < (transa ? k : m) || ldb < (transb ? n : k) || ldc < m) return INVALID_VALUE;
    Gemm* g = new Gemm{transa != 0, transb != 0, m, n, k, *(const float*)alpha, *(const float*)beta,
                       a, b, c, at, bt, ct, lda, ldb, ldc};
    return ts_emulated_enqueue(h->stream, gemm, drop, g) == 0 ? OK : INVALID_VALUE;
}
