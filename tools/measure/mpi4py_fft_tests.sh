#!/bin/bash
# mpi4py_fft_tests.sh TESTS_DIR [N] [P] [FILES...]: mpi4py-fft's own test files, each N times on
# mpi4py-fft and on zcoll.fft (only the import switched: tools/mpi4py_fft_shim.py), alternating;
# prints pytest's own time of each run ("N passed in S s"), so the editable install's rebuild
# check at import does not count. TESTS_DIR: mpi4py-fft's tests/ (git archive of its repository).
dir=$1; n=${2:-3}; P=${3:-2}; shift 3 2>/dev/null
files=${*:-test_mpifft.py test_pencil.py test_darray.py}
shim=$(cd "$(dirname "$0")/.." && pwd)/mpi4py_fft_shim.py
launch() { mpiexec --allow-run-as-root --oversubscribe -n "$P" python3 "$@" -q -p no:cacheprovider 2>&1 \
  | sed 's/\x1b\[[0-9;]*m//g' | grep -Eo "in [0-9.]+s" | head -1 | tr -d 'ins '; }
cd "$dir" || exit 1
for f in $files; do
  for i in $(seq "$n"); do
    z=$(launch "$shim" -m pytest "$f"); m=$(launch -m pytest "$f")
    echo "$f P=$P round $i: zcoll.fft ${z}s mpi4py-fft ${m}s"
  done
done
