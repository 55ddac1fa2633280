#!/usr/bin/env bash
# CUDA offload and speculation's costs on a real GPU, from llama-cpp-python's own vendored llama.cpp, on a
# machine with no network. Prepare the carried files here first with scripts/gpu/gpu_bundle.sh; docs/bench/gpu.md
# says what is measured and how to read it.
#
#   phase 1 (call 1, carry build/gpu-check/bundle1): check the bundle; a venv; llama-cpp-python built from the
#     trimmed sdist with -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 (and llama-bench from the same build tree);
#     localspec installed --no-deps from this tree with the carried wheels; model-free checks (offload support,
#     devices) and tests/test_gpu.py. A rerun resumes the build (ninja, the build tree under $WORK).
#   phase 2 (call 2, carry build/gpu-check/bundle2): SmolLM2 put together from its two parts; random-weight
#     targets of real shapes (scripts/gpu/gpu_model.py); offload placement from llama.cpp's log, CPU vs GPU greedy
#     text, --ngl-draft; v(γ) for γ = 1..16 and c by localspec's calibration; plain tok/s against llama-bench;
#     prompt lookup on the copy-heavy bench tasks with α, γ and the formula's prediction; adaptive vs best fixed γ.
#   Each call writes $OUT/gpu_check.json and $OUT/gpu_check.md (everything measured so far) and $OUT/gpu_check.log.
#
# usage: scripts/gpu/gpu_check.sh [1|2|all|report]    (or GPU_CHECK_PHASE)
# env:   GPU_CHECK_CPU=1   CPU build and checks (the rehearsal; the default where there is no nvcc)
#        GPU_CHECK_DIR     bundles and work dir (default build/gpu-check; $DIR/work holds venv, build, models)
#        OUT               where the reports go (default $DIR/out); JOBS (default 16 with CUDA, else nproc)
#        SHAPES            random targets to make (default "8b 1b" on a GPU, "cpu" on the CPU); CUDA_ARCH (90)
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
PHASE=${1:-${GPU_CHECK_PHASE:-all}}
VERSION=0.3.36
DIR=${GPU_CHECK_DIR:-build/gpu-check}
DIR=$(mkdir -p "$DIR" && cd "$DIR" && pwd)
WORK=$DIR/work
OUT=${OUT:-$DIR/out}
mkdir -p "$OUT" "$WORK/results" "$WORK/models"
LOG=$OUT/gpu_check.log
exec > >(tee -a "$LOG") 2>&1
LIMIT_MIB=${LIMIT_MIB:-60}
if [ -n "${GPU_CHECK_CPU:-}" ] && [ "${GPU_CHECK_CPU}" != 0 ]; then MODE=cpu
elif command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE=cuda
else MODE=cpu; fi
CUDA_ARCH=${CUDA_ARCH:-90}
if [ "$MODE" = cuda ]; then JOBS=${JOBS:-16}; SHAPES=${SHAPES:-"8b 1b"}; else JOBS=${JOBS:-$(nproc)}; SHAPES=${SHAPES:-cpu}; fi
SITE=$WORK/site
W=$DIR/bundle1/wheels
step() { printf '\n== [%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() { echo "FAIL: $*" >&2; report; exit 1; }
report() { [ -n "${PY:-}" ] && "$PY" scripts/gpu/gpu_check.py report --results "$WORK/results" --out "$OUT" || true; }
note() { "$PY" scripts/gpu/gpu_check.py note --results "$WORK/results" "$@"; }  # key=value into results/steps.json

echo "gpu_check: phase $PHASE, mode $MODE, jobs $JOBS, dir $DIR, out $OUT ($(date -u +%FT%TZ))"

check_bundle() {  # bundle N: every file in its manifest, with its sha256; and the size the call carried
  local b=$DIR/bundle$1
  [ -f "$b/manifest.json" ] || { echo "FAIL: $b/manifest.json missing: run scripts/gpu/gpu_bundle.sh here and carry $b" >&2; exit 1; }
  python3 - "$b" <<'EOF'
import hashlib, json, sys
from pathlib import Path
b = Path(sys.argv[1])
m = json.loads((b / "manifest.json").read_text())
bad = [f for f, h in m["files"].items() if not (b / f).is_file() or hashlib.sha256((b / f).read_bytes()).hexdigest() != h]
if bad:
    sys.exit(f"FAIL: {b}: missing or damaged: {', '.join(bad)}")
print(f"{b}: {len(m['files'])} files, sha256 ok")
EOF
  local tree carried
  tree=$( (git ls-files -co --exclude-standard -z 2>/dev/null || true) | (du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
  tree=${tree:-0}  # the device's copy of the tree may not be a git checkout: then only the bundle is counted
  carried=$(du -sb "$b" | cut -f1)
  echo "call $1 carried: tree $((tree / 1048576)) MiB + bundle$1 $((carried / 1048576)) MiB"
  [ $((tree + carried)) -le $((LIMIT_MIB * 1048576)) ] || { echo "FAIL: call $1 is over $LIMIT_MIB MiB" >&2; exit 1; }
}

cuda_libs() {  # cuBLAS and the driver library for the CUDA build: from the toolkit, else the Python packages
  # This workplace's CUDA image assembles /usr/local/cuda from NVIDIA's pip wheels (nvcc, runtime, CCCL; the CPU
  # machine's copy has no cuBLAS and no driver stub), while its python3 holds nvidia-cublas for PyTorch. ggml-cuda
  # links CUDA::cublas and CUDA::cuda_driver, so point CMake at whatever is there (symlinks under $WORK/cuda-extra).
  local top x=$WORK/cuda-extra hdr lib drv
  rm -rf "$x"; mkdir -p "$x/include" "$x/lib"
  echo 'int main() { return 0; }' > "$x/probe.cu"  # nvcc's dry run names the toolkit it uses (TOP)
  top=$(nvcc --dryrun -v -c "$x/probe.cu" -o "$x/probe.o" 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  top=$(cd "${top:-/usr/local/cuda}" 2>/dev/null && pwd || echo /usr/local/cuda)
  echo "CUDA toolkit: $top"
  hdr=$(ls "$top"/include/cublas_v2.h "$top"/targets/*/include/cublas_v2.h 2>/dev/null | head -1 || true)
  lib=$(ls "$top"/lib64/libcublas.so "$top"/targets/*/lib/libcublas.so 2>/dev/null | head -1 || true)
  CUDA_ARGS=""
  if [ -z "$hdr" ] || [ -z "$lib" ]; then
    read -r hdr lib < <("$PYBASE" - <<'EOF'
import sys
from pathlib import Path
h = l = ""
for root in map(Path, sys.path):
    base = root / "nvidia"
    if not base.is_dir():
        continue
    h = h or next((str(p) for p in base.rglob("cublas_v2.h")), "")
    l = l or next((str(p) for p in sorted(base.rglob("libcublas.so*")) if "Lt" not in p.name), "")
print(h or "-", l or "-")
EOF
)
    [ "$hdr" != - ] && [ "$lib" != - ] || fail "no cuBLAS (cublas_v2.h, libcublas.so) in $top or the Python packages"
    for f in "$(dirname "$hdr")"/cublas*.h; do ln -sf "$f" "$x/include/"; done
    for f in "$(dirname "$lib")"/libcublas*.so*; do ln -sf "$f" "$x/lib/"; done
    ln -sf "$(ls "$x"/lib/libcublas.so.* | grep -v Lt | head -1)" "$x/lib/libcublas.so"
    ln -sf "$(ls "$x"/lib/libcublasLt.so.* | head -1)" "$x/lib/libcublasLt.so"
    CUDA_ARGS="-DCUDA_cublas_LIBRARY=$x/lib/libcublas.so -DCUDA_cublasLt_LIBRARY=$x/lib/libcublasLt.so"
    CUDA_ARGS="$CUDA_ARGS -DCMAKE_CUDA_FLAGS=-I$x/include -DCMAKE_CXX_FLAGS=-I$x/include -DCMAKE_C_FLAGS=-I$x/include"
    echo "cuBLAS from the Python packages: $hdr, $lib"
  fi
  if ! ls "$top"/lib64/stubs/libcuda.so "$top"/targets/*/lib/stubs/libcuda.so >/dev/null 2>&1; then
    drv=$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so/ {print $NF}'; ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null) | head -1 || true)
    if [ -n "$drv" ]; then ln -sf "$drv" "$x/lib/libcuda.so"; CUDA_ARGS="$CUDA_ARGS -DCUDA_cuda_driver_LIBRARY=$x/lib/libcuda.so"
    else CUDA_ARGS="$CUDA_ARGS -DGGML_CUDA_NO_VMM=ON"; fi  # no driver library to link: the legacy memory pool
    echo "driver library: ${drv:-none (GGML_CUDA_NO_VMM=ON)}"
  fi
  case ":${LD_LIBRARY_PATH:-}:" in *":$x/lib:"*) ;; *) export LD_LIBRARY_PATH=$x/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
}

python_env() {  # the Python the checks run on, and $SITE (a --target dir) holding everything carried
  # The device's python3 is the image's (Python 3.12, numpy, PyTorch): a venv would not see its numpy, so the
  # carried wheels, llama-cpp-python and localspec go into $SITE on PYTHONPATH. The CPU rehearsal makes a bare
  # venv (no system packages) as that python3, with numpy alone in it, to prove the carried wheels suffice.
  if [ "$MODE" = cpu ]; then
    [ -x "$WORK/venv/bin/python" ] || python3 -m venv "$WORK/venv"
    PYBASE=$WORK/venv/bin/python
    "$PYBASE" -c "import numpy" 2>/dev/null || "$PYBASE" -m pip install --quiet --no-index --find-links "$DIR/cpu/wheels" numpy
  else
    PYBASE=$(command -v python3)
  fi
  export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
  # cuBLAS found in the Python packages (cuda_libs, phase 1): the loader needs it in every later call too
  [ -d "$WORK/cuda-extra/lib" ] && export LD_LIBRARY_PATH=$WORK/cuda-extra/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  PY=$PYBASE
  if "$PY" -m pip --version >/dev/null 2>&1; then PIP=("$PY" -m pip)
  else PIP=("$PY" "$(ls "$W"/pip-*.whl | head -1)/pip"); fi  # a Python without pip: pip run from its wheel
}
pip_t() { "${PIP[@]}" install --quiet --disable-pip-version-check --no-index --no-deps --upgrade --target "$SITE" \
            --find-links "$W" "$@"; }

phase1() {
  step "1.1 bundle 1"
  check_bundle 1
  [ "$MODE" = cuda ] && { nvidia-smi -L; nvcc --version | tail -2; }
  python3 --version; cmake --version | head -1; ninja --version

  step "1.2 Python: $PY, carried wheels -> $SITE"
  "$PY" -c "import numpy; print('numpy', numpy.__version__)" || fail "no numpy in $PY"
  pip_t scikit-build-core packaging pathspec setuptools wheel click jinja2 markupsafe platformdirs diskcache \
        pydantic pydantic-core annotated-types typing-inspection \
        typing-extensions gguf pyyaml tqdm pytest iniconfig pluggy pygments || fail "carried wheels did not install"

  step "1.3 llama-cpp-python $VERSION (${MODE})"
  local tarball src stamp args
  tarball=$(ls "$DIR"/bundle1/llama_cpp_python-*-trimmed.tar.gz)
  src=$WORK/src/llama_cpp_python-$VERSION
  stamp=$(sha256sum "$tarball" | cut -c1-16)
  if [ "$(cat "$WORK/src/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$WORK/src"; mkdir -p "$WORK/src"; tar xzf "$tarball" -C "$WORK/src"; echo "$stamp" > "$WORK/src/.stamp"
  fi
  args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON"  # no mtmd; tools = llama-bench only (trimmed tools/CMakeLists.txt)
  if [ "$MODE" = cuda ]; then cuda_libs; args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH $args $CUDA_ARGS"; fi
  if "$PY" -c "import llama_cpp, sys; sys.exit(not (llama_cpp.__version__ == '$VERSION' and \
       llama_cpp.llama_supports_gpu_offload() == ('$MODE' == 'cuda')))" 2>/dev/null && [ -f "$WORK/build.done" ]; then
    echo "installed $VERSION matches mode $MODE (not rebuilt)"
  else
    local t=$(date +%s)
    echo "CMAKE_ARGS=$args  build dir $WORK/cmake  -j$JOBS"
    if ! CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
         "${PIP[@]}" install -v --disable-pip-version-check --no-index --no-deps --no-build-isolation --upgrade \
         --target "$SITE" -C build-dir="$WORK/cmake" "$src" > "$WORK/build.log" 2>&1; then
      grep -E "error|Error" "$WORK/build.log" | head -20; tail -40 "$WORK/build.log"; cp "$WORK/build.log" "$OUT/"
      fail "llama-cpp-python build failed (log: build.log)"
    fi
    touch "$WORK/build.done"
    note "build_seconds?=$(($(date +%s) - t))" build_seconds_last=$(($(date +%s) - t)) build_jobs=$JOBS build_mode=$MODE "cmake_args=$args"
    grep -E "CUDA Toolkit found|CMAKE_CUDA_ARCHITECTURES|Including CUDA backend|CUDA host compiler" "$WORK/build.log" | sort -u || true
  fi
  "$PY" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.__file__, 'gpu offload:', llama_cpp.llama_supports_gpu_offload())"
  local bench
  bench=$(find "$WORK/cmake" -name llama-bench -type f -perm -u+x | head -1)
  [ -n "$bench" ] || { tail -30 "$WORK/build.log"; fail "llama-bench was not built in $WORK/cmake"; }
  ln -sf "$bench" "$WORK/llama-bench"
  echo "llama-bench: $bench"

  step "1.4 localspec (--no-deps, from this tree)"
  rm -rf "$WORK/localspec-src"; mkdir -p "$WORK/localspec-src"
  cp -a pyproject.toml README.md localspec "$WORK/localspec-src/"
  find "$WORK/localspec-src" -name __pycache__ -prune -exec rm -rf {} +
  pip_t --no-build-isolation "$WORK/localspec-src" || fail "localspec install failed"
  if [ ! -f "$SITE/localspec/models.toml" ]; then
    # a wheel of this tree lacks localspec/models.toml (setuptools leaves package-data "*.toml" out while the
    # .tcss and .jsonl files go in); localspec cannot start without it: put it in and say so in the report
    cp localspec/*.toml "$SITE/localspec/"; note wheel_lacks_models_toml=1
  fi
  (cd "$WORK" && "$PY" -c "import localspec.models.registry as r; assert r.__file__.startswith('$SITE'); r.load_registry()") \
    || fail "the installed localspec cannot read its registry"
  localspec --version
  [ "$(command -v localspec)" = "$SITE/bin/localspec" ] || fail "localspec on PATH is not the installed one"

  step "1.5 model-free checks"
  local lib
  lib=$("$PY" -c "import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'))")
  LD_LIBRARY_PATH=$lib "$WORK/llama-bench" --list-devices > "$WORK/results/llama_bench_devices.txt" 2>&1 || true
  cat "$WORK/results/llama_bench_devices.txt"
  "$PY" scripts/gpu/gpu_check.py env --mode "$MODE" --results "$WORK/results" || fail "model-free checks failed"

  step "1.6 tests/test_gpu.py"
  set +e
  GPU_CHECK_TOKENIZER=$DIR/bundle1/tok.gguf "$PY" -m pytest -q -p no:cacheprovider -o addopts= tests/test_gpu.py \
    > "$WORK/results/pytest.txt" 2>&1
  local rc=$?
  set -e
  tail -15 "$WORK/results/pytest.txt"
  note pytest_rc=$rc
  [ $rc = 0 ] || fail "tests/test_gpu.py failed"
}

phase2() {
  [ -f "$WORK/build.done" ] && [ -d "$SITE/llama_cpp" ] || { echo "FAIL: phase 1 has not run on this machine (a fresh machine: run phase 1 again, then 2)" >&2; exit 1; }
  step "2.1 bundle 2 and SmolLM2"
  check_bundle 2
  SMOL=$("$PY" scripts/gpu/gpu_check.py join --bundles "$DIR" --models "$WORK/models") || fail "SmolLM2 could not be put together"
  echo "$SMOL"

  step "2.2 tests/test_gpu.py with SmolLM2 (the tests phase 1 skipped: router estimate, models show, run)"
  set +e
  GPU_CHECK_TOKENIZER=$DIR/bundle1/tok.gguf GPU_CHECK_SMOLLM2=$SMOL timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    -o addopts= -rxXfE tests/test_gpu.py > "$WORK/results/pytest_smollm2.txt" 2>&1
  local rc=$?
  set -e
  tail -25 "$WORK/results/pytest_smollm2.txt"
  note pytest_smollm2_rc=$rc

  step "2.3 random-weight targets: $SHAPES"
  local targets=()
  for s in $SHAPES; do
    local f=$WORK/models/random-$s-q4_k.gguf
    [ -f "$f" ] || "$PY" scripts/gpu/gpu_model.py make "$f" --shape "$s" --type q4_k --tokenizer "$DIR/bundle1/tok.gguf"
    targets+=("$f")
  done

  step "2.4 measurements"
  "$PY" scripts/gpu/gpu_check.py measure --mode "$MODE" --results "$WORK/results" --smol "$SMOL" \
      --llama-bench "$WORK/llama-bench" --work "$WORK" "${targets[@]}" || fail "measurements failed"
}

python_env
case $PHASE in
  1) phase1 ;;
  2) phase2 ;;
  all) phase1; phase2 ;;
  report) ;;  # only the reports, from what results/ holds
  *) echo "usage: $0 [1|2|all|report]" >&2; exit 2 ;;
esac
report
step "done: phase $PHASE in $(($(date +%s) - T0)) s; reports: $OUT/gpu_check.md, $OUT/gpu_check.json"
