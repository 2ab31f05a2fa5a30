"""Versions of the Python package and of the C ABI it speaks."""

#: The package's version; equals the library's (Cargo.toml), checked by a test.
__version__ = "0.1.0"

#: The C ABI this package speaks: (major, minor) of libmemprobe. Before 1.0
#: every minor version may change the ABI (SONAME libmemprobe.so.0.<minor>).
ABI = (0, 1)
