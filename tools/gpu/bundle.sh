#!/usr/bin/env bash
# Builds what the GPU machine runs (it has CUDA but no Rust toolchain): the
# release CLI with `--features cuda` and the CUDA test binaries, stripped,
# into .device/ at the repository root, with the scripts of this folder.
# Copy .device/ (and tests/fixtures, which the repository carries) to the GPU
# machine and run `.device/suite.sh` from the repository root there.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p turbospark --features cuda
# `--no-run` prints each test binary's path ("Executable ... (path)").
paths=$(cargo test --release -p turbospark-cuda --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
mkdir -p .device
cp target/release/turbospark .device/
for t in parity parity_linear parity_moe sampling fixtures_on_gpu flash_attention kernels_compile; do
    cp "$(grep "/$t-" <<<"$paths" | head -1)" ".device/$t"
done
strip .device/turbospark .device/parity .device/parity_linear .device/parity_moe .device/sampling .device/fixtures_on_gpu \
    .device/flash_attention .device/kernels_compile
cp tools/gpu/suite.sh tools/gpu/ncu_table.py .device/
du -sh .device
