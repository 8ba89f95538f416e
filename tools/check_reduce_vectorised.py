"""Check that the reduction kernels' loops use packed (vector) instructions.

Disassembles the engine's static library (``libzcoll_core.a`` of a CMake build; the installed
extension is stripped) with ``objdump -d -C`` and, for a few (type, op) folds of
``cpp/zcoll/reduce_kernels.cpp``, reports the packed SSE/AVX instructions found in the
function. Exits 1 if one has none. Usage::

    cmake -S . -B build/dev -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)"
    cmake --build build/dev -j
    python tools/check_reduce_vectorised.py [build/dev/libzcoll_core.a]
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# (the fold's template argument as objdump demangles it, instructions any of which shows a
# vectorised loop)
EXPECTED = {
    "op_sum, double": ("addpd",),
    "op_sum, float": ("addps",),
    "op_sum, long": ("paddq",),
    "op_max, int": ("pcmpgtd", "pmaxsd"),
    "op_min, float": ("cmpleps", "minps"),
    "op_bxor, unsigned char": ("pxor",),
    "op_prod, double": ("mulpd",),
}


def main() -> int:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        found = sorted(Path("build").glob("**/libzcoll_core.a"))
        if not found:
            print("no build/**/libzcoll_core.a: build with CMake first (see the docstring)")
            return 2
        path = str(found[0])
    text = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", path], capture_output=True, text=True
    ).stdout
    functions = re.split(r"\n(?=[0-9a-f]+ <)", text)
    failed = 0
    for args, wanted in EXPECTED.items():
        name = f"fold<zcoll::(anonymous namespace)::typed<zcoll::(anonymous namespace)::{args}> >"
        bodies = [f for f in functions if name in f.split("\n", 1)[0]]
        found = sorted({m for f in bodies for m in re.findall(r"\t(v?[a-z0-9]+)\s", f)})
        packed = [i for i in found if i.lstrip("v") in wanted]
        print(f"{args:28} {'ok' if packed else 'NOT VECTORISED'}: {', '.join(packed) or '-'}")
        failed += not packed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
