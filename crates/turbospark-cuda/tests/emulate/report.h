// One line a check for the emulation programs whose checks are a named
// error against a bound, or pass/fail (moe.cpp, small.cpp, sample.cpp).
#pragma once
#include <cstdio>
#include <string>

inline bool report(const std::string& what, bool ok) {
    std::printf("%-70s %s\n", what.c_str(), ok ? "ok" : "FAIL");
    return ok;
}

inline bool report(const std::string& what, double err, double tol) {
    const bool ok = err <= tol;
    std::printf("%-70s max error %.2e %s\n", what.c_str(), err, ok ? "ok" : "FAIL");
    return ok;
}
