"""Two hot functions, hot_a and hot_b, taking about 70% and 30% of the CPU.

    python hot.py SECONDS

Both run the same loop; hot_a does 7 passes for every 3 of hot_b. tests/test_profiling.py
reads the profile of this program back and checks the split and the lines marked HOT below.
"""

import sys
import time


def spin(n):
    total = 0
    for i in range(n):
        total += i * i  # HOT: spin
    return total


def hot_a():
    return spin(70_000)  # HOT: hot_a


def hot_b():
    return spin(30_000)  # HOT: hot_b


def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hot_a()
        hot_b()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
