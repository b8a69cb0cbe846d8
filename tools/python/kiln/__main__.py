"""The `kiln` command installed with the package: runs the kiln CLI binary shipped inside it
(prebuild, warm, ls, inspect, verify, prune, stats, bench), with the same arguments and exit code."""
from __future__ import annotations

import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kiln")
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
