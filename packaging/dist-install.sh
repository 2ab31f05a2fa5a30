#!/bin/sh
# Installs this memprobe release under PREFIX (default /usr/local):
#   sh install.sh [PREFIX]
# bin/, include/, lib/ and share/ are copied as they are (the library's links
# included); the pkg-config and CMake files locate everything relative to
# themselves, so nothing is rewritten.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-${PREFIX:-/usr/local}}
for d in bin include lib; do
    [ -d "$here/$d" ] || { echo "install.sh: $here/$d is missing: unpack the whole tarball" >&2; exit 1; }
done
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
[ "$prefix" != "$here" ] || { echo "install.sh: $prefix is this directory already" >&2; exit 1; }
cp -R -P "$here/bin" "$here/include" "$here/lib" "$prefix/"
# share/memprobe: the Grafana dashboard and Prometheus rules (docs/metrics.md).
[ ! -d "$here/share" ] || cp -R -P "$here/share" "$prefix/"
echo "memprobe installed under $prefix: $prefix/bin/memprobe"
echo "  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig   CMake: CMAKE_PREFIX_PATH=$prefix"
case "$prefix" in
    /usr|/usr/local) command -v ldconfig >/dev/null && [ "$(id -u)" = 0 ] && ldconfig || true ;;
    *) echo "  programs built through pkg-config or CMake find $prefix/lib by their run path; others: LD_LIBRARY_PATH=$prefix/lib" ;;
esac
