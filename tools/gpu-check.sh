#!/usr/bin/env bash
# For a machine with a real GPU: builds, runs the GPU tests and the GPU
# benchmark (W4 on the CPU and on the GPU, in one run), and prints the
# figures. Usage: tools/gpu-check.sh [output-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$out"

# Vulkan loader and driver files carried in .gl/ (see the device notes), if any.
if compgen -G ".gl/*.deb" >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

{
    echo "== machine"; nproc; nvidia-smi -L 2>/dev/null || true
    echo "== build"; cargo build --release --bin streambatch --tests 2>&1 | tail -2
    echo "== adapters"
    CI=true cargo test --release -p streambatch-suite --test gpu_kernels 2>&1 | grep -E "^test |test result" || true
    echo "== W4: CPU then GPU, with the GPU time split"
    "${CARGO_TARGET_DIR:-target}/release/streambatch" bench w4
} 2>&1 | tee "$out/gpu-check.log"
