#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make check-vllm (issue 27): vLLM's CPU build 0.32.0 serves
# SmolLM2-135M-Instruct on this machine with real requests
# (integrations/vllm/check_vllm.py), first as shipped (the baseline: answers
# checked, prefix cache, preemption, block pool back to empty), then with the
# snapkv_vllm plugin installed (pip, its vllm.general_plugins entry point)
# and its connector on, beside a private snapkvd: compactions through the
# daemon written into vLLM's own blocks, an abort while one runs, the same
# greedy output as the baseline, no block leaked, the daemon's ledger empty.
# The environment (about 6 GB) and the converted model come from
# scripts/vllm-env.sh, cached under ~/.cache/snapkv. Exit 77 when they
# cannot be made (offline); SNAPKV_REQUIRE=vllm makes that a failure.
set -u
BUILD=${BUILD:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/tests/tally.sh"
cd "$here" || exit 1
need_built "$BUILD/snapkvd" "$BUILD/snapkvctl"
ls "$BUILD"/python/snapkv*.so >/dev/null 2>&1 ||
	skip python "$BUILD/python/snapkv*.so not built (python3-dev missing)"
t0=$(date +%s)
env_out=$(scripts/vllm-env.sh) || skip vllm "vLLM's environment or the model cannot be made (offline?)"
venv=$(sed -n 1p <<<"$env_out")
hf=$(sed -n 2p <<<"$env_out")
echo "check-vllm: environment $venv, model $hf ($(($(date +%s) - t0)) s)"

dir=$(mktemp -d /tmp/check-vllm.XXXXXX)
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
# the plugin, installed the way a user installs it, into a directory of its
# own (the cached environment stays as its lock made it)
# (from a copy: setuptools writes build/ and egg-info beside the sources)
cp -r integrations/vllm "$dir/src"
rm -rf "$dir/src/build" "$dir/src"/*.egg-info
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
	--no-build-isolation --target "$dir/plugin" "$dir/src" >"$dir/pip.log" 2>&1 ||
	{ echo "FAIL: pip install integrations/vllm"; cat "$dir/pip.log"; exit 1; }
export PYTHONPATH="$here/$BUILD/python:$dir/plugin"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1}
export VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1
export TQDM_DISABLE=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} PYTHONDONTWRITEBYTECODE=1
py=("$venv/bin/python" -W ignore "$here/integrations/vllm/check_vllm.py" --model "$hf")
fails=0

# the plugin refuses another vLLM version, saying which
out=$("$venv/bin/python" - <<'PY' 2>&1
import vllm, snapkv_vllm
vllm.__version__ = "0.31.0"
try:
    snapkv_vllm.register()
except snapkv_vllm.VersionError as e:
    print("refused:", e)
PY
)
if grep -q "^refused: .*vLLM 0.31.0: refused" <<<"$out"; then
	echo "  ok   another vLLM version refused: ${out#refused: }"
else
	echo "  FAIL another vLLM version not refused: $out"
	fails=$((fails + 1))
fi
out=$("$venv/bin/python" -c 'from importlib.metadata import entry_points as e
print([x.value for x in e(group="vllm.general_plugins")])' 2>&1)
if grep -q "snapkv_vllm:register" <<<"$out"; then
	echo "  ok   vllm.general_plugins entry point: $out"
else
	echo "  FAIL no vllm.general_plugins entry point for snapkv_vllm: $out"
	fails=$((fails + 1))
fi

echo "check-vllm: plugin off (vLLM as shipped)"
t=$(date +%s)
"${py[@]}" --mode off --out "$dir/off.json" || fails=$((fails + 1))
echo "check-vllm: plugin off took $(($(date +%s) - t)) s"

"$BUILD/snapkvd" --socket "$dir/snapkvd.sock" --threads 1 --log-level warning 2>"$dir/daemon.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$dir/snapkvd.sock" ] && break
	sleep 0.05
done
[ -S "$dir/snapkvd.sock" ] || { echo "FAIL: snapkvd did not start"; cat "$dir/daemon.log"; exit 1; }
echo "check-vllm: plugin on (snapkv_vllm's connector, snapkvd at $dir/snapkvd.sock)"
t=$(date +%s)
SNAPKVCTL=$here/$BUILD/snapkvctl "${py[@]}" --mode on --socket "$dir/snapkvd.sock" \
	--out "$dir/on.json" --compare "$dir/off.json" || fails=$((fails + 1))
echo "check-vllm: plugin on took $(($(date +%s) - t)) s"
if [ -s "$dir/daemon.log" ]; then
	echo "check-vllm: the daemon logged:"
	sed 's/^/  /' "$dir/daemon.log" | tail -n 20
fi
echo "check-vllm: $(($(date +%s) - t0)) s in all; $([ $fails -eq 0 ] && echo passed || echo "$fails parts failed")"
[ $fails -eq 0 ]
