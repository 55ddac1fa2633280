#!/usr/bin/env bash
# End-to-end check of `--rpc` on loopback, from llama-cpp-python's own vendored llama.cpp sources:
#   1. the sdist (SDIST: a .tar.gz or its unpacked directory; default: pip download it into $WORK),
#   2. llama.cpp's ggml-rpc-server, built from SDIST/vendor/llama.cpp (skipped if build/bin/ggml-rpc-server exists),
#   3. llama-cpp-python with GGML_RPC=on from the same sdist (skipped if the installed one has RPC and that version),
#   4. ggml-rpc-server on 127.0.0.1, `localspec run --rpc ... --ngl -1 --verbose`: llama.cpp's log must show the
#      model buffer on the RPC device, and the greedy text must equal a local run's; then the calibrated v(γ)
#      local vs over RPC, and a dead address (one line, exit 2).
# Building takes minutes on a small machine; this is not run in CI (tests/test_rpc.py is, skipped without RPC).
#
# usage: scripts/gpu/rpc_check.sh [SDIST]      env: WORK (default ~/.cache/localspec/rpc-check), MODEL, PORT
set -euo pipefail

VERSION=0.3.36
WORK=${WORK:-$HOME/.cache/localspec/rpc-check}
MODEL=${MODEL:-smollm2-135m}
JOBS=${JOBS:-$(nproc)}
PROMPT="The three primary colors are"
mkdir -p "$WORK"
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "1. llama-cpp-python $VERSION sources"
SDIST=${1:-}
if [ -z "$SDIST" ]; then
  SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
  [ -e "$SDIST" ] || pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$WORK"
fi
if [ -f "$SDIST" ]; then
  SRC="$WORK/$(basename "$SDIST" .tar.gz)"
  [ -d "$SRC" ] || tar xzf "$SDIST" -C "$WORK"
else
  SRC=$(cd "$SDIST" && pwd)
fi
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/tools/rpc/rpc-server.cpp" ] || fail "$LLAMA has no tools/rpc: not a llama-cpp-python sdist?"
echo "$SRC"

step "2. ggml-rpc-server"
BIN="$LLAMA/build/bin"
if [ -x "$BIN/ggml-rpc-server" ]; then
  echo "exists: $BIN/ggml-rpc-server (not rebuilt)"
else
  cmake -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
  cmake --build "$LLAMA/build" -j "$JOBS" --target ggml-rpc-server
fi

step "3. llama-cpp-python with RPC"
if python -c "import llama_cpp, sys; sys.exit(not (llama_cpp.__version__ == '$VERSION' and llama_cpp.llama_supports_rpc()))"; then
  echo "installed $VERSION has RPC (not rebuilt)"
else
  CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-deps --no-cache-dir "$SRC"
fi

step "4. end to end on loopback"
PORT=${PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
EP="127.0.0.1:$PORT"
"$BIN/ggml-rpc-server" -H 127.0.0.1 -p "$PORT" > "$WORK/rpc-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  python -c "from localspec.models.rpc import probe, parse_endpoint; probe(parse_endpoint('$EP'), 1.0)" 2>/dev/null && break
  sleep 0.1
done

SHOW=$(localspec models show --device --rpc "$EP")
echo "$SHOW" | grep -E "device|rpc"
[[ "$SHOW" == *"RPC0 - rpc server $EP"* ]] || fail "RPC0 not listed by models show --device"

# threads pinned: a run-time thread switch may move a near-tie token, which is not what this checks
run() { localspec run --model "$MODEL" --json -n 32 --ctx 1024 --threads 2 "$@" "$PROMPT"; }
run --no-spec > "$WORK/local.json"
run --no-spec --rpc "$EP" --ngl -1 --verbose > "$WORK/rpc.json" 2> "$WORK/rpc.log"
grep -E "model buffer size|KV buffer size|offloaded" "$WORK/rpc.log" || true
grep -q "RPC0\[$EP\] model buffer size" "$WORK/rpc.log" || fail "no RPC model buffer in llama.cpp's log ($WORK/rpc.log)"
grep -q "assigned to device CPU" "$WORK/rpc.log" && fail "a layer stayed on the CPU ($WORK/rpc.log)"
python - "$WORK/local.json" "$WORK/rpc.json" <<'EOF'
import json, sys
local, remote = (json.load(open(p)) for p in sys.argv[1:])
print(f"local: {local['tokens_per_second']:.1f} tok/s   rpc: {remote['tokens_per_second']:.1f} tok/s")
print("text:", repr(local["text"]))
sys.exit(0 if local["text"] == remote["text"] else "FAIL: greedy text differs over RPC:\n" + repr(remote["text"]))
EOF

echo "calibrated v(γ) with prompt lookup (run --json's v):"
for where in local rpc; do
  extra=(); [ "$where" = rpc ] && extra=(--rpc "$EP" --ngl -1)
  run --lookup "${extra[@]}" | python -c "import json,sys; d=json.load(sys.stdin); print('  $where', ' '.join(f'{x:.2f}' for x in d['v']))"
done

DEAD=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
set +e
OUT=$(localspec run --model "$MODEL" -n 4 --rpc "127.0.0.1:$DEAD" "$PROMPT" 2>&1); RC=$?
set -e
echo "dead address: exit $RC: $OUT"
[ "$RC" = 2 ] && [ "$(echo "$OUT" | wc -l)" = 1 ] || fail "a dead address is not one line + exit 2"

step "OK: --rpc places the model on the RPC device and the greedy text is unchanged"
