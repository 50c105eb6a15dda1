"""A registry for the SDK compatibility tests: Debian's docker-registry on loopback with one
image pushed (tests/registry_world.py, tests/image_build.py). Prints {"ref", "digestRef"} as
one JSON line once ready, then runs until its stdin closes, and takes everything down."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import image_build as ib  # noqa: E402
import registry_world as rw  # noqa: E402


def main():
    img = ib.busybox_image()
    with tempfile.TemporaryDirectory(prefix="cove-compat-registry-") as work, \
            rw.running_registry(address="127.77.6.1") as reg:
        name = "team/compat:v1"
        reg.push_image(img, name, work)
        ref = reg.ref(name)
        print(json.dumps({"ref": ref, "digestRef": f"{reg.host}/team/compat@{img.digest}",
                          "greeting": "hello"}), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
