#!/bin/sh
# The Vulkan backend on a GPU machine: the whole api_check matrix (--full, with the example Lua
# scripts) against the CPU reference, then --bench (full and causal, Vulkan beside CUDA in one
# process). Logs go to $OUT (default ./gpu-logs).
#
#   tests/gpu/run_vulkan.sh [api_check options...]
#
# KPT_GPU_BIN=DIR: where api_check is (default build-gpu/tests/gpu). The Vulkan loader is
# libvulkan.so.1 from the system, else $KPT_VULKAN, else DIR/../../libvulkan.so.1: our H100 image
# has NVIDIA's driver but no loader, so copy Debian's there before sending the build:
#   cp /usr/lib/x86_64-linux-gnu/libvulkan.so.1 build-gpu/
#
# Headless NVIDIA containers: the driver's manifest names libGLX_nvidia.so.0, whose Vulkan entry
# point returns nothing without a display ("Could not get 'vkCreateInstance' via
# 'vk_icdGetInstanceProcAddr'"); the same driver behind libEGL_nvidia.so.0 works. When the default
# manifests give no device, this script writes a manifest for the EGL library and retries.
set -u
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
BIN=${KPT_GPU_BIN:-build-gpu/tests/gpu}
CHECK="$BIN/api_check"
[ -x "$CHECK" ] || { echo "run_vulkan.sh: no $CHECK (build with meson first)" >&2; exit 1; }
if [ -z "${KPT_VULKAN:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
    loader="$(cd "$BIN/../.." && pwd)/libvulkan.so.1"
    [ -f "$loader" ] && export KPT_VULKAN="$loader"
fi
echo "loader: ${KPT_VULKAN:-system libvulkan.so.1}"

"$CHECK" --backend vulkan --filter full >"$OUT/vulkan_probe.log" 2>&1
if [ $? = 77 ] && grep -q 'no Vulkan driver' "$OUT/vulkan_probe.log"; then
    manifest="$OUT/nvidia_egl_icd.json"
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "%s"}}\n' \
        libEGL_nvidia.so.0 1.3.0 >"$manifest"
    export VK_DRIVER_FILES="$manifest" VK_ICD_FILENAMES="$manifest"
    echo "no device through the default driver manifests: trying $manifest"
fi

status=0
"$CHECK" --backend vulkan --full --scripts examples/patterns "$@" >"$OUT/vulkan_check.log" 2>&1
rc=$?
grep -E "^FAIL|api_check:" "$OUT/vulkan_check.log" | head -40
[ $rc = 0 ] || [ $rc = 77 ] || status=1
if [ $rc = 0 ]; then
    "$CHECK" --backend vulkan --bench >"$OUT/vulkan_bench.log" 2>&1 || status=1
    cat "$OUT/vulkan_bench.log"
fi
exit $status
