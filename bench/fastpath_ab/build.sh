#!/bin/sh
# Builds the four compiled variants into a scratch directory (default
# bench/fastpath_ab/build, or $1) and prints each one's build time and size.
# Needs: gcc and the Python headers (all), mypy (mypyc), Cython (cython),
# cargo/rustc, maturin and the PyO3 crates (rust: see README.md).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
B=${1:-$HERE/build}
PY=${PYTHON:-python3}
rm -rf "$B"; mkdir -p "$B"  # a clean build each time: the times are of full builds
B=$(cd "$B" && pwd)
cp "$HERE/fastpath_py.py" "$B/fastpath_py.py"
cp "$HERE/fastpath_py.py" "$B/fastpath_mypyc.py"
cp "$HERE/fastpath_py_idx.py" "$B/fastpath_mypyc_idx.py"
cp "$HERE/fastpath_c.c" "$HERE/fastpath_cy.pyx" "$HERE/setup_variants.py" "$B/"

now() { date +%s.%N; }
report() { # variant start file
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import os, sys, time, zipfile, io
variant, start, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    z.write(path, os.path.basename(path))
print(f"{variant:8} build {time.time() - start:6.1f} s   {os.path.basename(path)}: "
      f"{os.path.getsize(path) / 1024:7.1f} KiB, {len(buf.getvalue()) / 1024:7.1f} KiB deflated")
PYEOF
}

for variant in mypyc mypyc_idx c cython; do
    t=$(now)
    (cd "$B" && FASTPATH_VARIANT=$variant "$PY" setup_variants.py -q build_ext --inplace \
        --build-temp "$B/tmp-$variant" > "$B/build-$variant.log" 2>&1) || {
        echo "$variant: build failed, see $B/build-$variant.log"; continue; }
    case $variant in
        mypyc) so=$(ls "$B"/fastpath_mypyc.*.so) ;;
        mypyc_idx) so=$(ls "$B"/fastpath_mypyc_idx.*.so) ;;
        c) so=$(ls "$B"/fastpath_c.*.so) ;;
        cython) so=$(ls "$B"/fastpath_cy.*.so) ;;
    esac
    report "$variant" "$t" "$so"
done

t=$(now)
rm -rf "$B/wheels"
if (cd "$HERE/rust" && CARGO_TARGET_DIR="$B/cargo-target" \
        "$PY" -m maturin build --release --interpreter "$PY" -o "$B/wheels" > "$B/build-rust.log" 2>&1); then
    whl=$(ls "$B"/wheels/*.whl)
    (cd "$B" && "$PY" -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [open(n.split('/')[-1], 'wb').write(z.read(n)) for n in z.namelist() if n.endswith('.so')]" "$whl")
    report rust "$t" "$(ls "$B"/fastpath_rs*.so)"
    echo "rust     wheel $(basename "$whl"): $(( $(stat -c %s "$whl") / 1024 )) KiB"
else
    echo "rust: build failed, see $B/build-rust.log"
fi
