#!/usr/bin/env bash
# llama-cpp-python (the version pyproject.toml pins) built with llama.cpp's Vulkan backend into a virtual
# environment of its own, and localspec's GPU test tier (tests/test_gpu.py -m gpu) run on it. On a machine without
# a GPU, Mesa's lavapipe (software Vulkan on the CPU) is the device: 40-50x slower than the CPU backend, so this
# checks placement and correctness, never speed. A tier run by hand, like scripts/gpu/gpu_check.sh; results and build
# times: docs/bench/gpu.md ("Vulkan on lavapipe").
#
#   apt-get install mesa-vulkan-drivers libvulkan-dev glslc vulkan-tools   (Debian 12 / Ubuntu)
#   scripts/gpu/vulkan_build.sh [build|test|all]        (default all)
#
# env: VK_DIR     work dir outside the repo (default ~/.cache/localspec-vulkan): venv/, src/, cmake/ (the build
#                 tree: a rerun resumes it), build.log, test.log
#      VK_SDIST   a llama-cpp-python sdist (.tar.gz) to build from (default: pip download of the pinned version)
#      JOBS       parallel compile jobs (default nproc)
#      GGML_VK_VISIBLE_DEVICES   which Vulkan devices ggml uses; set to 0 here when the only Vulkan device is a
#                 CPU (lavapipe), which ggml skips otherwise
#
# The build: CMAKE_ARGS="-DGGML_VULKAN=on -DLLAVA_BUILD=OFF" pip install from the unpacked sdist. ggml-vulkan.cpp
# in 0.3.36 uses vk::LayerSettingEXT (VK_EXT_layer_settings, Vulkan headers 1.3.272 and later); where the
# installed headers lack it (Debian 12 ships 1.3.239) that block is compiled only #ifdef VK_EXT_layer_settings,
# and the instance is created without layer settings otherwise (they only feed the validation layer, which a
# release build never enables). The venv sees the system's packages (--system-site-packages), so localspec and
# its dependencies come from the normal install; only llama_cpp is the venv's own.
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
ROOT=$PWD
PHASE=${1:-all}
VERSION=$(python3 - <<'EOF'
import re, pathlib
m = re.search(r'llama-cpp-python\s*>=\s*([\d.]+)', pathlib.Path("pyproject.toml").read_text())
print(m.group(1) if m else "0.3.36")
EOF
)
VK_DIR=${VK_DIR:-$HOME/.cache/localspec-vulkan}
mkdir -p "$VK_DIR"
VK_DIR=$(cd "$VK_DIR" && pwd)
VENV=$VK_DIR/venv
PY=$VENV/bin/python
JOBS=${JOBS:-$(nproc)}
T0=$(date +%s)
step() { printf '\n== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { echo "FAIL: $*" >&2; exit 1; }

need_tools() {
  local missing=()
  command -v glslc >/dev/null || missing+=("glslc (package glslc)")
  command -v cmake >/dev/null || missing+=("cmake")
  command -v c++ >/dev/null || missing+=("a C++ compiler (g++)")
  printf '#include <vulkan/vulkan.h>\n' | c++ -x c++ -E - >/dev/null 2>&1 || missing+=("Vulkan headers (libvulkan-dev)")
  [ ${#missing[@]} = 0 ] || die "missing: ${missing[*]}; apt-get install mesa-vulkan-drivers libvulkan-dev glslc vulkan-tools"
}

headers_have_layer_settings() {  # VK_EXT_layer_settings in the installed Vulkan headers?
  printf '#include <vulkan/vulkan_core.h>\n#ifndef VK_EXT_layer_settings\n#error no\n#endif\n' \
    | c++ -x c++ -fsyntax-only - >/dev/null 2>&1
}

guard_layer_settings() {  # $1: ggml-vulkan.cpp; idempotent
  python3 - "$1" <<'EOF'
import re, sys
from pathlib import Path
p = Path(sys.argv[1])
s = p.read_text()
if "localspec: VK_EXT_layer_settings guard" in s:
    sys.exit(0)
block = re.search(r"( *VkBool32 enable_best_practice = layer_settings;\n.*?"
                  r" *vk::InstanceCreateInfo instance_create_info\(([^;]*), &layer_setting_info\);\n)", s, re.S)
if not block:
    sys.exit(f"{p}: the layer-settings block was not found: this llama.cpp needs another patch")
args = block.group(2)
new = ("#ifdef VK_EXT_layer_settings  // localspec: VK_EXT_layer_settings guard (headers older than 1.3.272)\n"
       + block.group(1) + "#else\n"
       + f"    vk::InstanceCreateInfo instance_create_info({args});\n#endif\n")
p.write_text(s.replace(block.group(1), new))
print(f"patched {p.name}: the layer-settings block compiled only #ifdef VK_EXT_layer_settings")
EOF
}

build() {
  need_tools
  step "venv $VENV (system site packages: localspec and its dependencies)"
  [ -x "$PY" ] || python3 -m venv --system-site-packages "$VENV"
  step "sdist: llama-cpp-python $VERSION"
  local sdist=${VK_SDIST:-}
  if [ -z "$sdist" ]; then
    sdist=$(ls "$VK_DIR"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
    # --no-binary for this package only: build dependencies as wheels (":all:" would build cmake from source)
    [ -n "$sdist" ] || { python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
                           "llama-cpp-python==$VERSION" -d "$VK_DIR"; sdist=$VK_DIR/llama_cpp_python-$VERSION.tar.gz; }
  fi
  [ -f "$sdist" ] || die "no sdist at $sdist"
  local src=$VK_DIR/src/llama_cpp_python-$VERSION
  [ -d "$src" ] || { mkdir -p "$VK_DIR/src"; tar xzf "$sdist" -C "$VK_DIR/src"; }
  local vk=$src/vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp
  if headers_have_layer_settings; then echo "Vulkan headers have VK_EXT_layer_settings: no patch"
  else echo "Vulkan headers lack VK_EXT_layer_settings ($(grep -m1 -o 'VK_HEADER_VERSION [0-9]*' \
         /usr/include/vulkan/vulkan_core.h 2>/dev/null || echo 'version unknown'))"; guard_layer_settings "$vk"; fi

  step "build (-j$JOBS; log $VK_DIR/build.log)"
  local t=$(date +%s)
  if ! CMAKE_ARGS="-DGGML_VULKAN=on -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
       "$PY" -m pip install -v --disable-pip-version-check --no-deps --force-reinstall \
       -C build-dir="$VK_DIR/cmake" "$src" > "$VK_DIR/build.log" 2>&1; then
    grep -E "error" "$VK_DIR/build.log" | head -20; tail -30 "$VK_DIR/build.log"
    die "the Vulkan build failed (log: $VK_DIR/build.log)"
  fi
  echo "built in $(($(date +%s) - t)) s at -j$JOBS" | tee "$VK_DIR/build.time"
}

visible_devices() {  # lavapipe alone: ggml skips CPU-type Vulkan devices unless they are named
  if [ -z "${GGML_VK_VISIBLE_DEVICES+x}" ] && command -v vulkaninfo >/dev/null \
     && ! vulkaninfo --summary 2>/dev/null | grep -q "PHYSICAL_DEVICE_TYPE_\(DISCRETE\|INTEGRATED\|VIRTUAL\)_GPU"; then
    export GGML_VK_VISIBLE_DEVICES=0
    echo "only a CPU Vulkan device (lavapipe): GGML_VK_VISIBLE_DEVICES=0"
  fi
}

tier() {
  [ -x "$PY" ] || die "no venv at $VENV: run '$0 build' first"
  visible_devices
  step "devices"
  "$PY" - <<'EOF' || die "llama_cpp in the venv has no GPU offload (not the Vulkan build?)"
import sys, llama_cpp
from localspec.backend.ggml import devices, supports_gpu_offload
print("llama_cpp", llama_cpp.__version__, llama_cpp.__file__)
for d in devices():
    print(f"  {d['name']:10} {d['type']:5} {d['backend']:7} {d['description']}: "
          f"{d['free'] / 2**20:.0f} of {d['total'] / 2**20:.0f} MiB free")
sys.exit(not supports_gpu_offload())
EOF
  step "tests/test_gpu.py (every test; those marked gpu on the device) - log $VK_DIR/test.log"
  set +e
  "$PY" -m pytest -v -p no:cacheprovider -o addopts= tests/test_gpu.py 2>&1 | tee "$VK_DIR/test.log"
  local rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || die "tests/test_gpu.py failed (rc $rc)"
}

echo "vulkan_build: $PHASE, llama-cpp-python $VERSION, dir $VK_DIR ($(date -u +%FT%TZ))"
case $PHASE in
  build) build ;;
  test) tier ;;
  all) build; tier ;;
  *) echo "usage: $0 [build|test|all]" >&2; exit 2 ;;
esac
step "done ($PHASE)"
