# memprobe — the two commands of the README:
#   make demo   runs the main job on a workload shipped in the repo
#   make test   runs every test in every language
# and the rest: make lib | examples | demo-c | bench | header | clean

CARGO ?= cargo
JOBS ?= 2
CC ?= cc
RELEASE := target/release
BUILD := build
CFLAGS_STRICT := -std=c99 -Wall -Wextra -Werror -pedantic -O2 -g -D_GNU_SOURCE

.PHONY: all lib examples demo demo-c test bench header clean

all: lib examples

# libmemprobe.so (SONAME libmemprobe.so.0.<minor>) and libmemprobe.a
lib:
	$(CARGO) build -j$(JOBS) --release -p memprobe-ffi

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
	$(RELEASE)/memprobe run --plot memprobe-run.svg --json memprobe-run.json -- $(RELEASE)/examples/spiky
	@echo "timeline: memprobe-run.svg, summary and samples: memprobe-run.json"

# The C trainer, measured from inside through the C ABI.
demo-c: $(BUILD)/trainer
	@ln -sf libmemprobe.so $(RELEASE)/$$(objdump -p $(RELEASE)/libmemprobe.so | awk '/SONAME/{print $$2}')
	$(BUILD)/trainer 3 4 256 16

# Every test: Rust unit and integration tests, the C ABI from C (plain, under
# AddressSanitizer and valgrind), the header check, the examples.
test:
	$(CARGO) build -j$(JOBS) -p memprobe-ffi
	$(CARGO) test -j$(JOBS) --workspace --no-fail-fast

bench:
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench overhead
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench spike_catch
	$(CARGO) bench -j$(JOBS) -p memprobe-tests --bench monitor_cpu
	$(CARGO) bench -j$(JOBS) -p memprobe-gpu --bench gpu_read
	$(CARGO) bench -j$(JOBS) -p memprobe-cli --bench overhead
	$(CARGO) bench -j$(JOBS) -p memprobe-metrics --bench scrape

# Regenerates include/memprobe.h from memprobe-ffi (then commit it).
header:
	MEMPROBE_BLESS=1 $(CARGO) test -j$(JOBS) -p memprobe-tests --test header -- header_is_up_to_date

clean:
	$(CARGO) clean
	rm -rf $(BUILD) memprobe-run.svg memprobe-run.json
