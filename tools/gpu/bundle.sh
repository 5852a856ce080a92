#!/usr/bin/env bash
# Builds what the GPU machine runs (it has CUDA but no Rust toolchain): the
# release CLI with `--features cuda` and the CUDA test binaries, stripped and
# gzipped (the device tool carries at most 64 MiB: the tracked tree, ~47 MB,
# plus .device/), into .device/ at the repository root, with the scripts of
# this folder. With OLD_REV=<rev> it also builds that revision's CLI (in a
# git worktree under target/, its own target directory: a first build takes
# ~10 minutes on two cores) as .device/turbospark_old, for ab.sh.
# With PATCHES="a.patch b.patch" (paths) it also builds the CLI with each
# patch applied in place (and taken off again: the tree must be clean
# where they touch it) as .device/turbospark_<patch name>, for
# `BINS=... ab.sh`; each costs an incremental build (~1 minute for a
# kernel-only patch), and with PATCH_TESTS=1 also its TESTS binaries as
# .device/TEST_<patch name> (the device tool carries 64 MiB with the
# ~47 MB tree: three CLIs and three test binaries fit).
# Run `.device/suite.sh` or `.device/ab.sh` from the repository root there
# (carry [".device"]); both unpack the binaries first.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p turbospark --features cuda
# TESTS picks the test binaries (default: all nine). The device tool
# carries at most 64 MiB with the ~47 MB tree: each extra CLI is ~4.5 MB
# gzipped, so with PATCHES keep TESTS to those the call runs.
tests=${TESTS:-parity parity_kv parity_step parity_linear parity_moe sampling fixtures_on_gpu flash_attention memory}
# The tree's CUDA test binaries, built, copied as .device/TEST$1 (`--no-run`
# prints each one's path: "Executable ... (path)").
copy_tests() {
    local paths t
    paths=$(cargo test --release -p turbospark-cuda --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
    for t in $tests; do
        cp "$(grep "/$t-" <<<"$paths" | head -1)" ".device/$t$1" || return 1
    done
}
rm -rf .device
mkdir -p .device
cp target/release/turbospark .device/
# BASE_TESTS=0 leaves this tree's own test binaries out (with PATCH_TESTS,
# when the call tests only the patched ones: room for another CLI).
base_tests=""
[ "${BASE_TESTS:-1}" = 1 ] && { copy_tests ""; base_tests=$tests; }
patched_tests=""
for patch in ${PATCHES:-}; do
    name=$(basename "$patch" .patch)
    git apply "$patch"
    ok=1
    cargo build --release -p turbospark --features cuda || ok=0
    [ "$ok" = 1 ] && cp target/release/turbospark ".device/turbospark_$name"
    # With PATCH_TESTS=1 the test binaries too, as .device/TEST_NAME: the
    # kernels are compiled into each binary, so a patched kernel is tested
    # only by a patched test binary.
    if [ "$ok" = 1 ] && [ "${PATCH_TESTS:-0}" = 1 ]; then
        copy_tests "_$name" || ok=0
        for t in $tests; do patched_tests="$patched_tests ${t}_$name"; done
    fi
    git apply -R "$patch"
    [ "$ok" = 1 ] || { echo "bundle.sh: $patch does not build" >&2; exit 1; }
done
# The tree as it was: the CLI rebuilt so that target/ matches it.
[ -n "${PATCHES:-}" ] && cargo build --release -p turbospark --features cuda
if [ -n "${OLD_REV:-}" ]; then
    wt=target/old-worktree
    git worktree remove --force "$wt" 2>/dev/null || true
    git worktree add --detach "$wt" "$OLD_REV"
    (cd "$wt" && CARGO_TARGET_DIR=../old-target cargo build --release -p turbospark --features cuda)
    cp target/old-target/release/turbospark .device/turbospark_old
    git worktree remove --force "$wt"
fi
bins=(.device/turbospark*)
for t in $base_tests $patched_tests; do bins+=(".device/$t"); done
for b in "${bins[@]}"; do
    strip "$b"
    gzip -9 "$b"
done
cp tools/gpu/common.sh tools/gpu/suite.sh tools/gpu/owed.sh tools/gpu/owed_h200.sh tools/gpu/second_h200.sh tools/gpu/ab.sh tools/gpu/knobs.sh tools/gpu/ncu_table.py tools/gpu/timeline.py tools/gpu/timeline.sh .device/
du -sh .device
