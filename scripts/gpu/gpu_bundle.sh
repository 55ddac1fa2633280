#!/usr/bin/env bash
# Prepare what scripts/gpu/gpu_check.sh needs on a GPU machine that has no network and takes 64 MiB per call
# (working tree + carried paths). Two bundles, one per call, under $GPU_CHECK_DIR (default build/gpu-check,
# ignored by git):
#   bundle1/  call 1: llama-cpp-python's sdist trimmed to what the build needs (.tar.gz), wheels for the Python
#             3.12 (and this interpreter's) dependencies the checks use, the SmolLM2 tokenizer alone
#             (tok.gguf, for scripts/gpu/gpu_model.py), and the first part of the shipped SmolLM2-135M Q4_1 file
#   bundle2/  call 2: the rest of the SmolLM2 file (it is 98 MB: it cannot travel in one call)
#   cpu/      only for a CPU rehearsal here: a numpy wheel for this interpreter (the device has its own numpy)
# Each bundle has a manifest (sha256 per file); the split point is chosen so that each call, with the working
# tree, stays under LIMIT_MIB (default 60, leaving 4 MiB of the 64 for what the tree gains before the call).
#
# usage: scripts/gpu/gpu_bundle.sh [SDIST]   SDIST: llama-cpp-python 0.3.36 sdist, a .tar.gz or its unpacked
#        directory (default /tmp/src/llama_cpp_python-0.3.36 if there, else pip download)
# env:   GPU_CHECK_DIR, LIMIT_MIB, PYVERS (default "3.12 <this interpreter>"), SMOL (path of the SmolLM2 GGUF)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VERSION=0.3.36
DIR=${GPU_CHECK_DIR:-build/gpu-check}
LIMIT_MIB=${LIMIT_MIB:-60}
HERE_PY=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYVERS=${PYVERS:-"3.12 $HERE_PY"}
B1=$DIR/bundle1 B2=$DIR/bundle2 CPU=$DIR/cpu
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**20:.1f}')" "$1"; }
size_of() { du -sb "$@" | awk '{s += $1} END {print s + 0}'; }

rm -rf "$B1" "$B2" "$CPU" "$DIR/stage"
mkdir -p "$B1/wheels" "$B2" "$CPU/wheels" "$DIR/stage"

step "1. llama-cpp-python $VERSION sdist, trimmed"
SDIST=${1:-}
if [ -z "$SDIST" ]; then
  if [ -d "/tmp/src/llama_cpp_python-$VERSION" ]; then SDIST=/tmp/src/llama_cpp_python-$VERSION
  else
    pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$DIR/dl"
    SDIST=$DIR/dl/llama_cpp_python-$VERSION.tar.gz
  fi
fi
S=$DIR/stage/llama_cpp_python-$VERSION
if [ -f "$SDIST" ]; then tar xzf "$SDIST" -C "$DIR/stage"; else cp -a "$SDIST" "$S"; fi
[ -f "$S/vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt" ] || fail "$SDIST is not a llama-cpp-python sdist"
echo "from $SDIST: $(du -sh "$S" | cut -f1)"
# llama-cpp-python: the package, its build files and the vendored llama.cpp; no docs, examples, tests, docker
# and no .git (39 MB of llama.cpp's history: the build then reports build number 0 / commit "unknown")
rm -rf "$S"/{docs,examples,tests,docker,scripts,mkdocs.yml,CHANGELOG.md,CONTRIBUTING.md,Makefile}
find "$S" "$S/vendor/llama.cpp" -mindepth 1 -maxdepth 1 -name '.*' -exec rm -rf {} +
L=$S/vendor/llama.cpp
# llama.cpp: no models (vocab files for its tests: 75 MB), docs, web UI, tests, examples, Python converters
rm -rf "$L"/{models,docs,examples,tests,benches,media,pocs,scripts,gguf-py,conversion,skills,ci,requirements}
rm -rf "$L"/{grammars,app,.devops,.github,flake.nix,requirements.txt,pyproject.toml,mypy.ini,ty.toml}
rm -f "$L"/convert_*.py "$L"/*.sh "$L"/pyrightconfig.json "$L"/poetry.lock
# every tool but llama-bench (the plain-decoding baseline); tools/CMakeLists.txt rewritten to add only it
find "$L/tools" -mindepth 1 -maxdepth 1 ! -name llama-bench ! -name CMakeLists.txt -exec rm -rf {} +
cat > "$L/tools/CMakeLists.txt" <<'EOF'
# trimmed by localspec's scripts/gpu/gpu_bundle.sh: llama-bench only (LLAMA_BUILD_TOOLS=ON builds it)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
EOF
# vendor: miniaudio and stb serve only tools/mtmd (not built: LLAVA_BUILD=OFF)
rm -rf "$L/vendor/miniaudio" "$L/vendor/stb"
sed -i -e '/add_subdirectory(miniaudio)/d' -e '/add_subdirectory(stb)/d' "$L/vendor/CMakeLists.txt"
# ggml: the CPU, CUDA, BLAS and RPC backends only
for d in "$L"/ggml/src/ggml-*/; do
  case $(basename "$d") in ggml-cpu|ggml-cuda|ggml-blas|ggml-rpc) ;; *) rm -rf "$d" ;; esac
done
TARBALL=llama_cpp_python-$VERSION-trimmed.tar.gz
tar czf "$B1/$TARBALL" -C "$DIR/stage" "llama_cpp_python-$VERSION"
echo "trimmed: $(du -sh "$S" | cut -f1) unpacked, $(mib "$(size_of "$B1/$TARBALL")") MiB as $TARBALL"

step "2. wheels (no network on the device): Python $PYVERS"
# what the checks import (localspec is installed with --no-deps: no server, TUI, plots or hub client), the
# build backend of llama-cpp-python and localspec (both built without isolation), and pytest for tests/test_gpu.py
RUNTIME="click jinja2 markupsafe platformdirs diskcache typing-extensions gguf pyyaml tqdm pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection"
BUILD="scikit-build-core packaging pathspec setuptools wheel pip"  # pip: for a Python without ensurepip
TEST="pytest iniconfig pluggy pygments"
for py in $PYVERS; do
  pip download --quiet --no-deps --only-binary :all: --python-version "$py" --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$B1/wheels" $RUNTIME $BUILD $TEST
done
ls "$B1/wheels"
pip download --quiet --no-deps --only-binary :all: -d "$CPU/wheels" numpy  # the CPU rehearsal's venv only

step "3. SmolLM2 tokenizer (for the random-weight targets) and the split model"
SMOL=${SMOL:-$(python3 -c "from localspec.models.resolve import resolve_model; print(resolve_model(None).path)")}
[ -f "$SMOL" ] || fail "SmolLM2 not found: $SMOL"
python3 scripts/gpu/gpu_model.py tokenizer "$SMOL" "$B1/tok.gguf"
TREE=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
LIMIT=$((LIMIT_MIB * 1024 * 1024))
FIXED=$(size_of "$B1")
SMOL_SIZE=$(stat -c %s "$SMOL")
# split so that both calls carry the same: call 1 = tree + fixed + part1, call 2 = tree + part2
PART1=$(((SMOL_SIZE - FIXED) / 2))
[ "$PART1" -gt 0 ] || fail "bundle 1 without the model ($(mib "$FIXED") MiB) is larger than the model"
head -c "$PART1" "$SMOL" > "$B1/smollm2.part1"
tail -c +$((PART1 + 1)) "$SMOL" > "$B2/smollm2.part2"
python3 - "$B1" "$B2" "$SMOL" <<'EOF'
import hashlib, json, sys
from pathlib import Path
b1, b2, smol = map(Path, sys.argv[1:])
sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
model = {"name": smol.name, "size": smol.stat().st_size, "sha256": sha(smol), "parts": ["smollm2.part1", "smollm2.part2"]}
for b in (b1, b2):
    files = {str(p.relative_to(b)): sha(p) for p in sorted(b.rglob("*")) if p.is_file()}
    (b / "manifest.json").write_text(json.dumps({"files": files, "model": model}, indent=1) + "\n")
EOF

step "4. sizes per call (working tree + carried bundle; limit $LIMIT_MIB MiB)"
ok=1
for n in 1 2; do
  b=$DIR/bundle$n
  total=$((TREE + $(size_of "$b")))
  echo "call $n: tree $(mib "$TREE") + bundle$n $(mib "$(size_of "$b")") = $(mib "$total") MiB"
  [ "$total" -le "$LIMIT" ] || { echo "call $n is over $LIMIT_MIB MiB" >&2; ok=0; }
done
[ "$ok" = 1 ] || fail "a call is over the limit"
rm -rf "$DIR/stage"
echo "carry: call 1 [\"$DIR/bundle1\"], call 2 [\"$DIR/bundle2\"] (a CPU rehearsal also needs $DIR/cpu)"
