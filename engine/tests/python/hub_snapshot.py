"""Run huggingface_hub's snapshot_download (the real client) and report what it produced.

Usage: python3 hub_snapshot.py '{"repo": "org/name", "cache": DIR, "revision": R?, "allow": [..]?}'
with HF_ENDPOINT naming the server. Prints one JSON line: the snapshot path and the sha256
of every file in it.
"""

import hashlib
import json
import os
import sys

from huggingface_hub import snapshot_download


def main() -> None:
    args = json.loads(sys.argv[1])
    path = snapshot_download(
        repo_id=args["repo"],
        revision=args.get("revision"),
        cache_dir=args["cache"],
        allow_patterns=args.get("allow"),
    )
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({"path": path, "files": files}))


if __name__ == "__main__":
    main()
