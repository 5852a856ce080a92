// The end of every program the emulated NVRTC (nvrtc.cpp) builds: after
// cuda_shim.h and a kernel file's source, the ABI by which the emulated
// driver (cuda.cpp) launches the file's kernels. It owns turning a
// launch's argument array (`void** kernelParams`, one pointer to each
// argument, as cuLaunchKernel takes it) into a call of the kernel with its
// C types; it must not know any kernel but through TS_KERNEL(name), which
// nvrtc.cpp writes once for each `extern "C" __global__` function.
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>

// A launch's shape, as cuLaunchKernelEx's config gives it.
struct TsGeometry {
    uint32_t grid[3];
    uint32_t block;
    uint32_t shared;
};

// A kernel with its arguments copied: the driver binds a launch when it is
// issued (a graph's captured launch keeps its arguments, as CUDA's does)
// and runs it then or at each replay.
struct TsBound {
    virtual ~TsBound() = default;
    virtual void run(const TsGeometry& g) const = 0;
};

template <class... A>
struct TsArgs final : TsBound {
    void (*kernel)(A...);
    std::tuple<std::decay_t<A>...> args;
    TsArgs(void (*k)(A...), std::decay_t<A>... a) : kernel(k), args(a...) {}
    void run(const TsGeometry& g) const override {
        // Each thread gets its own copy of the arguments, as on the GPU.
        launch(g.grid[0], g.grid[1], g.grid[2], g.block, [this] { std::apply(kernel, args); },
               g.shared);
    }
};

// The arguments at `params` read with the kernel's own parameter types.
template <class... A, size_t... I>
TsBound* ts_bind(void (*k)(A...), void** params, std::index_sequence<I...>) {
    return new TsArgs<A...>(k, *static_cast<const std::decay_t<A>*>(params[I])...);
}
template <class... A>
TsBound* ts_bind(void (*k)(A...), void** params) {
    return ts_bind(k, params, std::index_sequence_for<A...>{});
}

// The parameter list names the kernel's type, which picks it where a device
// function template of the same name is declared too.
#define TS_KERNEL(name, parameters)                                \
    extern "C" TsBound* ts_bind_##name(void** params) {            \
        void(*kernel) parameters = name;                           \
        return ts_bind(kernel, params);                            \
    }

extern "C" void ts_run(const TsBound* b, const TsGeometry* g) { b->run(*g); }
extern "C" void ts_free(const TsBound* b) { delete b; }
