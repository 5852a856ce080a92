// An emulated NVRTC (libnvrtc.so) for the emulated driver (cuda.cpp): it
// "compiles" a kernel file by building it with the system's C++ compiler
// behind tests/emulate/cuda_shim.h into a shared object, whose ELF bytes
// are the "cubin" that cuModuleLoadData loads. It owns finding the file's
// kernels and writing their module.h entry points; it must not change the
// source it is given (the host's prelude, common.cuh and the file, as
// src/compile.rs puts them together), so what runs is what NVRTC compiles.
//
// Built by tests/common/emulated_gpu.rs with these defines (C strings):
// TS_CXX, the compiler; TS_EMULATE_DIR, tests/emulate; TS_KERNELS_DIR,
// kernels/; TS_BUILD_DIR, where the built objects are kept by a hash of
// everything that makes them (test processes run side by side, so a lock
// file makes each object once).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

typedef int nvrtcResult;
enum : nvrtcResult { OK = 0, INVALID_INPUT = 3, INVALID_PROGRAM = 4, COMPILATION = 6 };

struct Program {
    std::string source, name, log;
    std::vector<char> object;
};

extern "C" const char* nvrtcGetErrorString(nvrtcResult r) {
    switch (r) {
        case OK: return "NVRTC_SUCCESS";
        case COMPILATION: return "NVRTC_ERROR_COMPILATION (emulated)";
        default: return "NVRTC_ERROR (emulated)";
    }
}

extern "C" nvrtcResult nvrtcCreateProgram(Program** p, const char* src, const char* name, int,
                                          const char* const*, const char* const*) {
    if (p == nullptr || src == nullptr) return INVALID_INPUT;
    *p = new Program{src, name != nullptr ? name : "program.cu", "", {}};
    return OK;
}
extern "C" nvrtcResult nvrtcDestroyProgram(Program** p) {
    if (p == nullptr || *p == nullptr) return INVALID_PROGRAM;
    delete *p;
    *p = nullptr;
    return OK;
}

static std::string read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}
static bool write(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    return bool(f);
}

static uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// The compiler's flags: the emulation programs' (tests/emulated_kernels.rs),
// position-independent for a shared object.
static const char* FLAGS =
    "-std=c++20 -O1 -fno-strict-aliasing -ffp-contract=off -fPIC -Wall -Wno-unknown-pragmas "
    "-Wno-unused-function -Wno-unused-variable -Wno-unused-but-set-variable";

// Major 0: the host's cubin cache (src/compile.rs) keys on the version, so
// the emulation's objects never stand in for a real NVRTC's cubins. The
// minor is a hash of what builds them besides the source (the shim, the
// entry points, the compiler and its flags), so the host's cache never
// serves an object built by an older emulation.
extern "C" nvrtcResult nvrtcVersion(int* major, int* minor) {
    uint64_t key = fnv1a(std::string(TS_CXX) + FLAGS);
    for (const char* f : {"/cuda_shim.h", "/driver/module.h"}) {
        key = fnv1a(read(TS_EMULATE_DIR + std::string(f)), key);
    }
    *major = 0;
    *minor = (int)(key % 1000000000);
    return OK;
}

// Runs `command`, its output appended to `log`; true when it succeeded.
static bool sh(const std::string& command, std::string& log) {
    FILE* out = popen((command + " 2>&1").c_str(), "r");
    if (out == nullptr) return false;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, out)) > 0) log.append(buf, n);
    return pclose(out) == 0;
}

// The `extern "C" __global__` functions in the preprocessed text, where
// cuda_shim.h (under TS_FIND_KERNELS) spells __global__ as
// ts_global_marker (macros that stamp out kernels are expanded by then):
// each as its TS_KERNEL line, with its parameter list, which picks the
// kernel where a device function template shares its name.
static std::set<std::string> kernels_in(const std::string& text) {
    std::set<std::string> lines;
    const std::string marker = "ts_global_marker";
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
        const size_t open = text.find('(', at);
        if (open == std::string::npos) break;
        std::istringstream head(text.substr(at + marker.size(), open - at - marker.size()));
        std::string type, name;
        head >> type >> name;  // "void", then the name
        size_t close = open, depth = 0;
        for (; close < text.size(); close++) {
            if (text[close] == '(') depth++;
            if (text[close] == ')' && --depth == 0) break;
        }
        if (type != "void" || name.empty() || close == text.size()) continue;
        std::string params = text.substr(open, close + 1 - open);
        for (char& c : params) c = c == '\n' ? ' ' : c;
        lines.insert("TS_KERNEL(" + name + ", " + params + ")");
    }
    return lines;
}

extern "C" nvrtcResult nvrtcCompileProgram(Program* p, int count, const char* const* options) {
    if (p == nullptr) return INVALID_PROGRAM;
    const std::string dir = TS_BUILD_DIR, cxx = TS_CXX;
    const std::string includes =
        std::string(" -I '") + TS_EMULATE_DIR + "' -I '" + TS_KERNELS_DIR + "'";
    uint64_t key = fnv1a(p->source);
    for (int i = 0; i < count; i++) key = fnv1a(options[i], key);
    for (const char* f : {"/cuda_shim.h", "/driver/module.h"}) {
        key = fnv1a(read(TS_EMULATE_DIR + std::string(f)), key);
    }
    key = fnv1a(cxx + FLAGS, fnv1a(read(TS_KERNELS_DIR + std::string("/common.cuh")), key));
    char stem[32];
    std::snprintf(stem, sizeof stem, "%016llx", (unsigned long long)key);
    const std::string base = dir + "/" + stem, object = base + ".so";
    sh("mkdir -p '" + dir + "'", p->log);

    // One process builds an object; the others wait and then read it.
    const int lock = open((dir + "/lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (lock >= 0) flock(lock, LOCK_EX);
    std::string built = read(object);
    if (built.empty()) {
        const std::string include = "#include \"" + base + ".cu\"\n";
        bool ok = write(base + ".cu", p->source) &&
                  write(base + "-find.cpp", "#include \"cuda_shim.h\"\n" + include);
        ok = ok && sh(cxx + " -std=c++20 -E -DTS_FIND_KERNELS" + includes + " '" + base +
                          "-find.cpp' -o '" + base + ".i'",
                      p->log);
        std::string program = "#include \"cuda_shim.h\"\n" + include +
                              "#include \"driver/module.h\"\n";
        for (const std::string& k : kernels_in(ok ? read(base + ".i") : "")) program += k + "\n";
        // The preprocessed text is large and needed only here; the source
        // and the program stay beside the object, for a build to be read.
        std::remove((base + ".i").c_str());
        std::remove((base + "-find.cpp").c_str());
        ok = ok && write(base + "-module.cpp", program) &&
             sh(cxx + " " + FLAGS + " -shared" + includes + " '" + base + "-module.cpp' -o '" +
                    object + ".tmp' && mv '" + object + ".tmp' '" + object + "'",
                p->log);
        built = ok ? read(object) : "";
    }
    if (lock >= 0) close(lock);
    if (built.empty()) {
        p->log = p->name + ": the emulation's build failed:\n" + p->log;
        return COMPILATION;
    }
    p->object.assign(built.begin(), built.end());
    return OK;
}

extern "C" nvrtcResult nvrtcGetProgramLogSize(Program* p, size_t* n) {
    *n = p->log.size() + 1;
    return OK;
}
extern "C" nvrtcResult nvrtcGetProgramLog(Program* p, char* log) {
    std::memcpy(log, p->log.c_str(), p->log.size() + 1);
    return OK;
}
extern "C" nvrtcResult nvrtcGetCUBINSize(Program* p, size_t* n) {
    *n = p->object.size();
    return OK;
}
extern "C" nvrtcResult nvrtcGetCUBIN(Program* p, char* out) {
    std::memcpy(out, p->object.data(), p->object.size());
    return OK;
}
