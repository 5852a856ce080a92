// An emulated CUDA driver (libcuda.so): the part of the driver API that
// cudarc calls for this crate, on the CPU, so that the GPU tests run the
// crate's host code (the launches' grids, shared sizes and arguments, the
// recorded decode step, the memory accounting) against its kernels'
// source in CI, which has no GPU. tests/common/emulated_gpu.rs builds it
// with nvrtc.cpp and cublas.cpp and loads all three in a test process that
// finds no GPU.
//
// It owns the device's description (an H200's: sm_90, 227 KB of opt-in
// shared memory; fewer multiprocessors, `multiprocessors`), its memory
// (host memory; a device pointer is the host address, and fresh memory is
// NaN bytes as uninitialised device memory is garbage), streams, events,
// graphs and modules. It must not
// compute anything itself: kernels are the programs nvrtc.cpp built from
// kernels/*.cu, run by their module.h entry points.
//
// Everything runs when issued, in issue order, on the calling thread: a
// stream is a queue that is always empty, so synchronising is free, and
// programmatic dependent launch is the plain order it allows. A stream
// being captured records instead; the graph replays its records in
// order. Captured kernel launches keep their arguments as CUDA does;
// captured copies and memsets read their operands at replay, as CUDA's
// nodes do.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

// CUresult values (cuda.h).
enum : CUresult {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_IMAGE = 200,
    NOT_FOUND = 500,
    CAPTURE_UNSUPPORTED = 900,
};

// The emulated device's memory: what cuMemGetInfo reports and allocations
// are refused past (TS_EMULATED_GPU_MEMORY bytes, default 4 GiB).
static size_t total_memory() {
    static const size_t total = [] {
        const char* v = std::getenv("TS_EMULATED_GPU_MEMORY");
        return v != nullptr ? (size_t)std::strtoull(v, nullptr, 10) : (size_t)4 << 30;
    }();
    return total;
}

// The allocations (device and pinned host), by address, and their sum.
static std::mutex lock;
static std::map<uintptr_t, size_t> allocations;
static size_t allocated = 0;

// `device`: counted against the device's memory (pinned host memory is
// not).
static CUresult allocate(CUdeviceptr* out, size_t bytes, bool device = true) {
    std::lock_guard<std::mutex> g(lock);
    if (out == nullptr) return INVALID_VALUE;
    if (device && bytes > total_memory() - allocated) return OUT_OF_MEMORY;
    // 256-byte aligned as the GPU's are; NaN bytes as uninitialised memory
    // is garbage there (a kernel reading what nothing wrote shows).
    const size_t size = (bytes + 255) / 256 * 256 + 256;
    void* p = std::aligned_alloc(256, size);
    if (p == nullptr) return OUT_OF_MEMORY;
    std::memset(p, 0xff, size);
    const size_t counted = device ? bytes : 0;  // what release() gives back
    allocations[(uintptr_t)p] = counted;
    allocated += counted;
    *out = (CUdeviceptr)p;
    return OK;
}

static CUresult release(CUdeviceptr p) {
    std::lock_guard<std::mutex> g(lock);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end()) return p == 0 ? OK : INVALID_VALUE;
    allocated -= it->second;
    allocations.erase(it);
    std::free((void*)p);
    return OK;
}

// ---- the device --------------------------------------------------------

extern "C" CUresult cuInit(unsigned) { return OK; }
extern "C" CUresult cuDeviceGetCount(int* n) {
    *n = 1;
    return OK;
}
extern "C" CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal != 0) return INVALID_VALUE;
    *d = 0;
    return OK;
}
extern "C" CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    std::snprintf(name, (size_t)len, "TurboSpark emulated GPU (sm_90, CPU)");
    return OK;
}

// The multiprocessors it reports (TS_EMULATED_GPU_SMS, default 8). An
// H200 has 132, and the host sizes persistent grids to fill them; here
// every block runs in turn whether it has work or not, and on the tests'
// small shapes most would not: 8 keeps the host's geometry code on its
// general path (a grid of several blocks a multiprocessor, splits of the
// keys over them) at a sixteenth of the empty blocks.
static int multiprocessors() {
    static const int n = [] {
        const char* v = std::getenv("TS_EMULATED_GPU_SMS");
        return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 8;
    }();
    return n;
}

// Device attributes (CUdevice_attribute values in cuda.h): an H200's but
// for the multiprocessors.
extern "C" CUresult cuDeviceGetAttribute(int* v, int attribute, CUdevice) {
    switch (attribute) {
        case 1: *v = 1024; return OK;         // max threads per block
        case 8: *v = 48 * 1024; return OK;    // shared memory per block
        case 10: *v = 32; return OK;          // warp size
        case 13: *v = 1980000; return OK;     // clock rate (kHz)
        case 16: *v = multiprocessors(); return OK;
        case 36: *v = 3201000; return OK;     // memory clock rate (kHz)
        case 37: *v = 6144; return OK;        // memory bus width (bits)
        case 38: *v = 60 << 20; return OK;    // L2 bytes
        case 39: *v = 2048; return OK;        // threads per multiprocessor
        case 75: *v = 9; return OK;           // compute capability
        case 76: *v = 0; return OK;
        case 81: *v = 228 * 1024; return OK;  // shared memory per multiprocessor
        case 82: *v = 65536; return OK;       // registers per multiprocessor
        case 97: *v = 227 * 1024; return OK;  // opt-in shared memory per block
        case 115: *v = 1; return OK;          // memory pools
        default: *v = 0; return OK;
    }
}

// ---- contexts: one, always current --------------------------------------

static int context_token;
typedef void* CUcontext;
extern "C" CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
    *c = &context_token;
    return OK;
}
extern "C" CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return OK; }
extern "C" CUresult cuCtxSetCurrent(CUcontext) { return OK; }
extern "C" CUresult cuCtxGetCurrent(CUcontext* c) {
    *c = &context_token;
    return OK;
}

extern "C" CUresult cuGetErrorString(CUresult e, const char** s) {
    static char text[64];
    std::snprintf(text, sizeof text, "emulated driver error %d", e);
    *s = text;
    return OK;
}

// ---- memory --------------------------------------------------------------

extern "C" CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(lock);
    *free_bytes = total_memory() - allocated;
    *total = total_memory();
    return OK;
}
extern "C" CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) { return allocate(p, bytes); }
extern "C" CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
extern "C" CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    CUdeviceptr d = 0;
    const CUresult r = allocate(&d, bytes, false);
    *p = (void*)d;
    return r;
}
extern "C" CUresult cuMemFreeHost(void* p) { return release((CUdeviceptr)p); }
extern "C" CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned) {
    *d = (CUdeviceptr)p;
    return OK;
}

typedef void* CUmemoryPool;
static int pool_token;
extern "C" CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* p, CUdevice) {
    *p = &pool_token;
    return OK;
}
extern "C" CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void*) { return OK; }
extern "C" CUresult cuMemPoolTrimTo(CUmemoryPool, size_t) { return OK; }

// ---- streams and what they run -------------------------------------------

// A recorded operation: a kernel launch with its bound arguments, a copy,
// a memset, a host function (the emulated cuBLAS's products), or an
// allocation made while recording.
struct Function;
struct Node {
    int type;  // CUgraphNodeType: 0 kernel, 1 copy, 2 memset, 3 host, 10 allocation
    const Function* f = nullptr;
    void* bound = nullptr;
    uint32_t geometry[5] = {};  // grid x, y, z, block, shared bytes
    bool programmatic = false;  // launched with PDL: its edge in is one
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    unsigned char value = 0;  // a memset's byte
    void (*host)(void*) = nullptr;     // a host function, its data's drop
    void (*host_drop)(void*) = nullptr;
    void* data = nullptr;
};
struct Graph {
    std::vector<Node> nodes;
    std::vector<CUdeviceptr> freed;  // freed while recording: at destruction
};
struct Stream {
    Graph* capture = nullptr;
};
typedef Stream* CUstream;

static void run(const Node& n);
static void drop(const Node& n);

// Runs `n` now and drops what it owns, or records it (its owner the
// graph) where `s` is being captured.
static CUresult issue(CUstream s, Node n) {
    if (s != nullptr && s->capture != nullptr) {
        s->capture->nodes.push_back(n);
        return OK;
    }
    run(n);
    drop(n);
    return OK;
}

extern "C" CUresult cuStreamCreate(CUstream* s, unsigned) {
    *s = new Stream;
    return OK;
}
extern "C" CUresult cuStreamDestroy_v2(CUstream s) {
    delete s;
    return OK;
}
extern "C" CUresult cuStreamSynchronize(CUstream) { return OK; }

extern "C" CUresult cuStreamBeginCapture_v2(CUstream s, int) {
    if (s == nullptr || s->capture != nullptr) return CAPTURE_UNSUPPORTED;
    s->capture = new Graph;
    return OK;
}
extern "C" CUresult cuStreamEndCapture(CUstream s, Graph** g) {
    if (s == nullptr || s->capture == nullptr) return INVALID_VALUE;
    *g = s->capture;
    s->capture = nullptr;
    return OK;
}
extern "C" CUresult cuThreadExchangeStreamCaptureMode(int*) { return OK; }

static CUresult copy(void* dst, const void* src, size_t bytes, CUstream s) {
    Node n{1};
    n.dst = dst, n.src = src, n.bytes = bytes;
    return issue(s, n);
}
extern "C" CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, CUstream s) {
    return copy((void*)d, h, n, s);
}
extern "C" CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, CUstream s) {
    return copy(h, (const void*)d, n, s);
}
extern "C" CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) {
    return copy((void*)d, (const void*)src, n, s);
}

extern "C" CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t count, CUstream s) {
    Node n{2};
    n.dst = (void*)d, n.value = v, n.bytes = count;
    return issue(s, n);
}

// Stream-ordered allocation: at once, even while recording (the graph's
// allocation node then only marks it); a free while recording waits for
// the graph's destruction, since its replays still use the memory.
extern "C" CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream s) {
    const CUresult r = allocate(p, bytes);
    if (r == OK && s != nullptr && s->capture != nullptr) s->capture->nodes.push_back(Node{10});
    return r;
}
extern "C" CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    if (s != nullptr && s->capture != nullptr) {
        s->capture->freed.push_back(p);
        return OK;
    }
    return release(p);
}

// ---- events: host time when issued ---------------------------------------

struct Event {
    std::chrono::steady_clock::time_point at;
};
extern "C" CUresult cuEventCreate(Event** e, unsigned) {
    *e = new Event{std::chrono::steady_clock::now()};
    return OK;
}
extern "C" CUresult cuEventDestroy_v2(Event* e) {
    delete e;
    return OK;
}
extern "C" CUresult cuEventRecord(Event* e, CUstream s) {
    if (s != nullptr && s->capture != nullptr) return CAPTURE_UNSUPPORTED;
    e->at = std::chrono::steady_clock::now();
    return OK;
}
extern "C" CUresult cuEventSynchronize(Event*) { return OK; }
extern "C" CUresult cuEventElapsedTime_v2(float* ms, Event* a, Event* b) {
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return OK;
}

// ---- modules: the programs nvrtc.cpp built --------------------------------

struct Module {
    void* handle;
};
// A kernel: its module's entry points (module.h) and the attributes set.
struct Function {
    void* (*bind)(void**);
    void (*run)(const void*, const uint32_t*);
    void (*free)(const void*);
    std::string name;
    int max_dynamic_shared = 48 * 1024;
};

// The image is the shared object nvrtc.cpp built (its ELF bytes, which
// carry their length in the header: the section headers come last),
// loaded from a temporary file that is removed at once
// (TS_KEEP_MODULES=1 keeps it, for a profiler to find the symbols).
extern "C" CUresult cuModuleLoadData(Module** m, const void* image) {
    const unsigned char* e = (const unsigned char*)image;
    if (std::memcmp(e, "\x7f" "ELF\x02", 5) != 0) return INVALID_IMAGE;
    uint64_t shoff;
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, e + 0x28, 8);
    std::memcpy(&shentsize, e + 0x3a, 2);
    std::memcpy(&shnum, e + 0x3c, 2);
    const size_t size = shoff + (size_t)shentsize * shnum;
    char path[] = "/tmp/ts-emulated-module-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return INVALID_IMAGE;
    const bool written = write(fd, e, size) == (ssize_t)size;
    close(fd);
    void* h = written ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (h == nullptr) std::fprintf(stderr, "emulated driver: %s\n", dlerror());
    if (std::getenv("TS_KEEP_MODULES") == nullptr) unlink(path);
    if (h == nullptr) return INVALID_IMAGE;
    *m = new Module{h};
    return OK;
}
extern "C" CUresult cuModuleUnload(Module* m) {
    // The code stays mapped: a graph may still hold a launch of it.
    delete m;
    return OK;
}
extern "C" CUresult cuModuleGetFunction(Function** f, Module* m, const char* name) {
    void* bind = dlsym(m->handle, ("ts_bind_" + std::string(name)).c_str());
    if (bind == nullptr) return NOT_FOUND;
    *f = new Function{(void* (*)(void**))bind,
                      (void (*)(const void*, const uint32_t*))dlsym(m->handle, "ts_run"),
                      (void (*)(const void*))dlsym(m->handle, "ts_free"), name};
    return OK;
}
extern "C" CUresult cuFuncSetAttribute(Function* f, int attribute, int v) {
    if (attribute == 8) {  // max dynamic shared bytes: at most the opt-in's
        if (v < 0 || v > 227 * 1024) return INVALID_VALUE;
        f->max_dynamic_shared = v;
    }
    // The preferred carveout: a percentage, or -1 for the driver's choice.
    if (attribute == 9 && (v < -1 || v > 100)) return INVALID_VALUE;
    return OK;
}
// Every kernel here fits twice on a multiprocessor where its shared memory
// does (the GPU's register limits are not modelled).
extern "C" CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, Function*, int threads,
                                                                size_t shared) {
    const int by_threads = 2048 / (threads > 0 ? threads : 1);
    const int by_shared = shared > 0 ? (int)(228 * 1024 / (shared + 1024)) : 32;
    *n = std::max(1, std::min({by_threads, by_shared, 32}));
    return OK;
}
extern "C" CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, Function* f,
                                                                         int threads,
                                                                         size_t shared, unsigned) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, threads, shared);
}

// cuLaunchKernelEx's config (cuda.h's CUlaunchConfig and CUlaunchAttribute).
struct LaunchAttribute {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;
    };
};
struct LaunchConfig {
    unsigned grid[3], block[3], shared;
    CUstream stream;
    LaunchAttribute* attrs;
    unsigned count;
};

static CUresult launch(Function* f, const unsigned grid[3], const unsigned block[3],
                       unsigned shared, CUstream s, void** params, bool programmatic) {
    // What the GPU refuses: no blocks, more than 1,024 threads or a block
    // that is not whole warps' worth of the emulation's warps, more dynamic
    // shared memory than the kernel was allowed.
    const size_t threads = (size_t)block[0] * block[1] * block[2];
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || threads == 0 || threads > 1024 ||
        block[1] != 1 || block[2] != 1 || (int)shared > f->max_dynamic_shared) {
        std::fprintf(stderr,
                     "emulated driver: %s refused: grid (%u, %u, %u), block (%u, %u, %u), "
                     "%u shared bytes of %d allowed\n",
                     f->name.c_str(), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                     shared, f->max_dynamic_shared);
        return INVALID_VALUE;
    }
    Node n{0};
    n.f = f;
    n.bound = f->bind(params);
    n.geometry[0] = grid[0], n.geometry[1] = grid[1], n.geometry[2] = grid[2];
    n.geometry[3] = block[0], n.geometry[4] = shared;
    n.programmatic = programmatic;
    return issue(s, n);
}
extern "C" CUresult cuLaunchKernelEx(const LaunchConfig* c, Function* f, void** params, void**) {
    bool programmatic = false;
    for (unsigned i = 0; i < c->count; i++) {
        // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        if (c->attrs[i].id == 6 && c->attrs[i].value != 0) programmatic = true;
    }
    return launch(f, c->grid, c->block, c->shared, c->stream, params, programmatic);
}

static void run(const Node& n) {
    switch (n.type) {
        case 0: n.f->run(n.bound, n.geometry); break;
        case 1: std::memmove(n.dst, n.src, n.bytes); break;
        case 2: std::memset(n.dst, n.value, n.bytes); break;
        case 3: n.host(n.data); break;
        default: break;
    }
}

// What a node owns: a launch's bound arguments, a host function's data.
static void drop(const Node& n) {
    if (n.type == 0) n.f->free(n.bound);
    if (n.type == 3) n.host_drop(n.data);
}

// For cublas.cpp: `run(data)` in `s`'s order, then `drop(data)` once it is
// no longer needed (at once, or when the recorded graph is destroyed).
extern "C" int ts_emulated_enqueue(CUstream s, void (*run_fn)(void*), void (*drop)(void*),
                                   void* data) {
    Node n{3};
    n.host = run_fn, n.host_drop = drop, n.data = data;
    return issue(s, n);
}

// ---- graphs ----------------------------------------------------------------

struct GraphExec {
    Graph* graph;
};
extern "C" CUresult cuGraphInstantiateWithFlags(GraphExec** e, Graph* g, unsigned long long) {
    *e = new GraphExec{g};
    return OK;
}
extern "C" CUresult cuGraphLaunch(GraphExec* e, CUstream s) {
    if (s != nullptr && s->capture != nullptr) return CAPTURE_UNSUPPORTED;
    for (const Node& n : e->graph->nodes) run(n);
    return OK;
}
extern "C" CUresult cuGraphExecDestroy(GraphExec* e) {
    delete e;
    return OK;
}
extern "C" CUresult cuGraphDestroy(Graph* g) {
    for (const Node& n : g->nodes) drop(n);
    for (CUdeviceptr p : g->freed) release(p);
    delete g;
    return OK;
}

// The census (src/recording.rs): a node's handle is its record, and the
// edges are the chain of issue order (one stream's), the edge into a
// kernel launched with PDL a programmatic one.
extern "C" CUresult cuGraphGetNodes(Graph* g, Node** nodes, size_t* n) {
    if (nodes != nullptr) {
        for (size_t i = 0; i < *n && i < g->nodes.size(); i++) nodes[i] = &g->nodes[i];
    }
    *n = g->nodes.size();
    return OK;
}
extern "C" CUresult cuGraphNodeGetType(const Node* node, int* type) {
    *type = node->type;
    return OK;
}
// cuda.h's CUgraphEdgeData.
struct EdgeData {
    unsigned char from_port, to_port, type, reserved[5];
};
extern "C" CUresult cuGraphGetEdges_v2(Graph* g, Node** from, Node** to, EdgeData* data,
                                       size_t* n) {
    const size_t edges = g->nodes.empty() ? 0 : g->nodes.size() - 1;
    if (from != nullptr) {
        for (size_t i = 0; i < *n && i < edges; i++) {
            from[i] = &g->nodes[i];
            to[i] = &g->nodes[i + 1];
            if (data != nullptr) {
                // CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC and
                // CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC, or the defaults.
                const bool p = g->nodes[i + 1].programmatic && g->nodes[i].type == 0;
                data[i] = EdgeData{(unsigned char)(p ? 1 : 0), 0, (unsigned char)(p ? 1 : 0), {}};
            }
        }
    }
    *n = edges;
    return OK;
}
