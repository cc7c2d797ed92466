#!/usr/bin/env bash
# The README's first command, exactly as written there, on a fresh venv with no extras: install, then ask the
# built-in SmolLM2 a question through a daemon that `localrt run` starts. A private store, data dir and free
# port keep it apart from anything else on the machine; the daemon it started is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
cmd=$(python3 - <<'PY'
import re, sys
text = open("README.md", encoding="utf-8").read()
setup = text.split("## Set up", 1)[1]
print(re.search(r"```bash\n(.*?)\n```", setup, re.S).group(1).strip())
PY
)
tmp=$(mktemp -d)
cleanup() {
    pkill -f "$tmp/venv/bin/localrt serve" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
python3 -m venv "$tmp/venv"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "first command: $cmd"
start=$(date +%s)
set +e
env -u PYTHONPATH PATH="$tmp/venv/bin:$PATH" VIRTUAL_ENV="$tmp/venv" HOME="$tmp/home" \
    LOCALRT_HOST="127.0.0.1:$port" LOCALRT_MODELS="$tmp/models" LOCALRT_DATA="$tmp/data" \
    bash -c "cd '$repo' && $cmd" >"$tmp/answer.txt" 2>"$tmp/stderr.txt" </dev/null
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
# what `localrt run` printed, without pip's lines before it
grep -vE '^(Looking in|Obtaining|Collecting|Downloading|Installing|Successfully|Building|Created wheel|Stored in|Requirement already|Preparing|Checking|Getting|Using cached|Processing|Attempting|Found existing|Uninstalling|WARNING|  )' \
    "$tmp/answer.txt" >"$tmp/reply.txt" || true
echo "--- answer (exit $rc, ${elapsed}s from a clean venv):"
cat "$tmp/reply.txt"
if [ "$rc" -ne 0 ]; then
    echo "--- stderr:"; tail -n 40 "$tmp/stderr.txt"
    echo "--- daemon log:"; tail -n 40 "$tmp/data/logs/server.log" 2>/dev/null || true
    echo "the README's first command failed" >&2
    exit 1
fi
words=$(grep -oE '[[:alpha:]]{2,}' "$tmp/reply.txt" | wc -l)
if [ "$words" -lt 8 ]; then
    echo "the README's first command printed no real answer ($words words)" >&2
    exit 1
fi
if ! pgrep -f "$tmp/venv/bin/localrt serve" >/dev/null; then
    echo "no daemon reads 'localrt serve' in the process list" >&2
    exit 1
fi
# issue 46's goal, a first answer within 60 s of the install: the daemon's log, from its first line (started by
# `localrt run` once pip is done) to the reply's access-log line (kernels compiled cold for this CPU in between)
after_install=$(python3 - "$tmp/data/logs/server.log" <<'PY' || echo "?"
import re, sys
from datetime import datetime
stamps = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), line)
          for line in open(sys.argv[1], encoding="utf-8", errors="replace")
          if (m := re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)", line))]
done = [t for t, line in stamps if "POST /api/" in line and " 200 " in line]
print(round((done[-1] - stamps[0][0]).total_seconds()) if stamps and done else "?")
PY
)
echo "first command: ok (${elapsed}s, $words words; first answer ${after_install}s after the install, from the daemon's start)"
