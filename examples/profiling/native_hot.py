"""A hot Python function that spends its time in a C extension (hotext.crunch).

    python native_hot.py SECONDS BUILD_DIR
"""

import sys
import time

sys.path.insert(0, sys.argv[2])
import hotext  # noqa: E402  (built into BUILD_DIR by examples/build.sh)


def call_native():
    return hotext.crunch(2_000_000)  # HOT: call_native


def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        call_native()


if __name__ == "__main__":
    main(float(sys.argv[1]))
