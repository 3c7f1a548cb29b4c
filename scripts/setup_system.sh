#!/usr/bin/env bash
# Install the system packages the Vulkan backend and the report tests need, if they are missing.
# As root: apt-get installs them. Otherwise: print the exact command (the Vulkan tests then skip, loudly).
set -u
need=()
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || need+=(libvulkan1)
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
command -v glslc >/dev/null 2>&1 || need+=(glslc)
ls /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json >/dev/null 2>&1 || need+=(vulkan-validationlayers)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
cmd="apt-get install -y --no-install-recommends ${need[*]}"
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && $cmd -qq) >/tmp/workbench-apt.log 2>&1 || {
    echo "setup: WARNING: apt-get failed (see /tmp/workbench-apt.log); Vulkan/report tests will be skipped" >&2
    exit 0
  }
else
  echo "setup: WARNING: missing system packages: ${need[*]}" >&2
  echo "setup: run as root:  sudo $cmd" >&2
  echo "setup: until then the Vulkan backend is unavailable and its tests are skipped" >&2
fi
exit 0
