#!/usr/bin/env bash
# The offline kit (README, "Offline install"): made here with `localrt kit`, then installed into a fresh venv with no
# package index (install.sh: pip --no-index --find-links), then asked a question as the README's first command
# does, on a private store, data dir and free port. The daemon it started is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
cleanup() {
    "$tmp/venv/bin/localrt" serve --stop >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
start=$(date +%s)
python3 -m cli kit "$tmp/kit"
python3 -m venv "$tmp/venv"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export LOCALRT_HOST="127.0.0.1:$port" LOCALRT_MODELS="$tmp/models" LOCALRT_DATA="$tmp/data"
# no index anywhere: a proxy or index variable of the CI machine must not help the install
env -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PYTHONPATH PIP_NO_INDEX=1 PYTHON="$tmp/venv/bin/python" \
    sh "$tmp/kit/install.sh"
cd "$tmp"  # not the source tree: the installed wheel answers
"$tmp/venv/bin/localrt" run smollm2:135m "Why is the sky blue?" </dev/null >"$tmp/reply.txt" 2>"$tmp/stderr.txt" || {
    echo "--- stderr:"; tail -n 40 "$tmp/stderr.txt"; echo "the offline kit's install did not answer" >&2; exit 1; }
words=$(grep -oE '[[:alpha:]]{2,}' "$tmp/reply.txt" | wc -l)
cat "$tmp/reply.txt"
if [ "$words" -lt 8 ]; then
    echo "the offline kit's install printed no real answer ($words words)" >&2
    exit 1
fi
echo "offline kit: ok ($(( $(date +%s) - start ))s: kit, offline install and first answer; $words words)"
