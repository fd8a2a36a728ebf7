#!/bin/sh
# Runs a Vulkan test program under the Khronos validation layer (Debian's
# vulkan-validationlayers) and fails it when the layer reports an error: a spec violation (a
# descriptor range past maxStorageBufferRange, say) that a lenient driver such as lavapipe would
# run anyway. Without the layer installed the program runs unvalidated, saying so. The exit code
# is the program's (77 still means skipped) unless the layer reported errors.
#
#   tests/vk_validated.sh PROGRAM [ARGS...]
set -u
found=""
for dir in /usr/share/vulkan/explicit_layer.d /etc/vulkan/explicit_layer.d \
    /usr/local/share/vulkan/explicit_layer.d; do
    [ -f "$dir/VkLayer_khronos_validation.json" ] && found=1
done
if [ -z "$found" ]; then
    echo "vk_validated.sh: no Khronos validation layer installed: running unvalidated"
    exec "$@"
fi
log=$(mktemp) || exit 1
VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation "$@" >"$log" 2>&1
rc=$?
cat "$log"
errors=$(grep -c "Validation Error" "$log")
rm -f "$log"
if [ "$errors" -gt 0 ]; then
    echo "vk_validated.sh: the validation layer reported $errors errors (above)"
    exit 1
fi
echo "vk_validated.sh: no validation errors"
exit $rc
