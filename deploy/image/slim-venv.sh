#!/bin/sh
# Shrinks the image's virtualenv (the Dockerfile's builder stage runs it on /opt/venv): parts of the
# binary wheels goose-ingest never loads, and the debug symbols of every extension module. What goes
# and why is in docs/operations.md ("What the image is made of"); tests/deploy/test_image.py runs
# every command, the archive's Parquet round trip and the exporters from the result.
set -eu
VENV=${1:-/opt/venv}
SITE=$(echo "$VENV"/lib/python3*/site-packages)
[ -d "$SITE/pyarrow" ] || { echo "slim-venv.sh: no pyarrow in $SITE" >&2; exit 1; }
cd "$SITE/pyarrow"
# Arrow Flight (RPC), Substrait plans' Python side and pyarrow's own S3 filesystem: the archive
# writes and reads Parquet in memory and stores through obstore (services/archive/store.py).
# pyarrow.fs imports _s3fs inside try/except ImportError. libarrow_substrait stays: libarrow_python
# links it.
rm -f libarrow_flight.so* libarrow_python_flight.so* _flight*.so flight.py \
      _substrait*.so substrait.py \
      libarrow_s3.so* _s3fs*.so \
      _pyarrow_cpp_tests*.so
# C++/Cython sources and headers (for building against pyarrow) and pyarrow's test suite
rm -rf include includes src tests benchmark.py
find . -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.cc' | xargs rm -f
# A wheel cannot hold symlinks, so libarrow_python* come as three identical copies; the loader asks
# only for the SONAME (.so.<major>)
for lib in libarrow_python libarrow_python_parquet_encryption; do
  rm -f "$lib.so" "$lib".so.*.*.*
  set -- "$lib".so.[0-9]*
  [ -f "$1" ] || { echo "slim-venv.sh: no $lib.so.<major> left" >&2; exit 1; }
done
cd "$SITE"
# zstandard's CFFI backend: CPython imports its C backend (backend_c) under the default policy
rm -f zstandard/_cffi*.so
# Debug symbols. Not the auditwheel-grafted libraries in *.libs/: strip can corrupt what patchelf rewrote.
find "$SITE" -path '*.libs' -prune -o -type f -name '*.so*' -print | xargs strip --strip-unneeded
# Nothing in the image runs pip (PEP 668 and a read-only root make it useless anyway)
rm -rf "$SITE"/pip "$SITE"/pip-* "$SITE"/setuptools "$SITE"/setuptools-* "$SITE"/wheel "$SITE"/wheel-* \
       "$SITE"/_distutils_hack "$SITE"/distutils-precedence.pth "$VENV"/bin/pip*
