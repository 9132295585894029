#!/bin/sh
# The C and Cython variants under AddressSanitizer and UBSan: builds them
# (the Cython one from build.sh's generated C, so run build.sh first) into a
# scratch directory and runs the hypothesis test against them, with
# PYTHONMALLOC=malloc so that ASan sees the bytes objects' bounds.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
S=${1:-$HERE/build/asan}
rm -rf "$S"; mkdir -p "$S"
INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
SUF=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
CFLAGS="-shared -fPIC -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I$INC"
gcc $CFLAGS "$HERE/fastpath_c.c" -o "$S/fastpath_c$SUF"
gcc $CFLAGS "$HERE/build/fastpath_cy.c" -o "$S/fastpath_cy$SUF" 2>/dev/null
cd "$HERE"
PYTHONMALLOC=malloc FASTPATH_BUILD="$S" FASTPATH_EXAMPLES=${FASTPATH_EXAMPLES:-2000} \
    LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0 "$PY" -m pytest -q -p no:cacheprovider test_fastpath.py
