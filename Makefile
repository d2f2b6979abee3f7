# smelt build. `make` builds the CPU code always and the CUDA objects when nvcc is
# found (CUDA=0 / CUDA=1 to force). Objects go to build/ (build-sanitize/ with
# SANITIZE=1, build-tsan/ with TSAN=1). `make help` lists the targets.

CC       ?= cc
NVCC     ?= nvcc
PYTHON   ?= python3
SANITIZE ?= 0
TSAN     ?= 0

# CUDA: auto-detect nvcc unless CUDA=0/1 is given.
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(NVCC_PATH),1,0)
endif

# One build folder per configuration, so objects built with other flags never mix:
# build/ (default), build-cpu/ (CUDA=0), build-sanitize[-cpu]/ (SANITIZE=1),
# build-tsan[-cpu]/ (TSAN=1: ThreadSanitizer, which cannot be combined with ASan).
ifeq ($(SANITIZE)$(TSAN),11)
$(error SANITIZE=1 and TSAN=1 cannot be combined: one sanitizer per build)
endif
FUZZ ?= 0
ifeq ($(FUZZ),1)
# The libFuzzer harnesses of tests/fuzz/ (make fuzz, make test-fuzz): clang, every object
# instrumented for coverage, ASan + UBSan; no CUDA.
ifneq ($(SANITIZE)$(TSAN),00)
$(error FUZZ=1 brings its own sanitizers: not with SANITIZE=1 or TSAN=1)
endif
CUDA := 0
CC := clang
CXX := clang++
BUILD ?= build-fuzz
SAN_FLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
# instrumented loops no longer vectorize: clang says so of every `omp simd`
CFLAGS += -Wno-pass-failed
else ifeq ($(SANITIZE),1)
BUILD ?= build-sanitize$(if $(filter 0,$(CUDA)),-cpu)
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else ifeq ($(TSAN),1)
BUILD ?= build-tsan$(if $(filter 0,$(CUDA)),-cpu)
SAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
OPT := -O1
else
BUILD ?= build$(if $(filter 0,$(CUDA)),-cpu)
SAN_FLAGS :=
OPT := -O2
endif
CUDA_HOME ?= $(if $(NVCC_PATH),$(patsubst %/bin/,%,$(dir $(NVCC_PATH))),/usr/local/cuda)
# sm_90: H100/H200 (the GPUs smelt is tuned for); override with CUDA_ARCH=80 etc.
CUDA_ARCH ?= 90

# Test-only packages: the browser test's Chromium, and pip for the Python test tools
# (tests/requirements.txt: pytest, the openai client, pyzmq, selenium), and clang with its
# OpenMP runtime for the libFuzzer harnesses (tests/fuzz/).
TEST_PKGS := chromium chromium-driver python3-pip clang libomp-dev
DEPS_PKGS := build-essential pkg-config libopenblas-dev libopenblas0-openmp libjansson-dev libcriterion-dev \
             libpcre2-dev libutf8proc-dev libzmq3-dev libmicrohttpd-dev libsqlite3-dev \
             libjs-chart.js python3 bubblewrap libcurl4-openssl-dev libgloo-dev \
             protobuf-c-compiler libprotobuf-c-dev

# libcurl (rewards/endpoint_http.c) through pkg-config: Debian's libcurl4-openssl-dev.
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS   := $(or $(shell pkg-config --libs libcurl 2>/dev/null),-lcurl)
CPPFLAGS += -I. -I$(BUILD) -D_GNU_SOURCE $(shell pkg-config --cflags jansson 2>/dev/null) $(CURL_CFLAGS)
CFLAGS   += -std=c11 $(OPT) -g -Wall -Wextra -Werror -fopenmp -MMD -MP $(SAN_FLAGS)
LDFLAGS  += -fopenmp $(SAN_FLAGS)
# C++ only for tests/emu/ (CUDA kernel source compiled for the CPU emulator) and for
# comm/'s Gloo shim (Gloo is a C++ library; the shim gives comm/ a C interface).
CXX      ?= c++
LIB_CXXFLAGS := -std=c++20 $(OPT) -g -Wall -Wextra -Werror -pthread -MMD -MP $(SAN_FLAGS) -I. -D_GNU_SOURCE
CXXFLAGS += $(LIB_CXXFLAGS) -Wno-unknown-pragmas -Itests/emu/include
# OpenBLAS's OpenMP build, so that its GEMMs and smelt's own parallel loops share one
# OpenMP thread pool (two pools on the same cores fight: docs/dependencies.md). Debian
# installs it beside the default pthread build without making it the default, so it is
# linked by path, with an rpath to its folder (without one the loader would silently
# give the pthread build).
OPENBLAS_DIR ?= /usr/lib/$(shell $(CC) -print-multiarch)/openblas-openmp
LDLIBS   += -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -l:libopenblas.so.0 \
            -ljansson -lpcre2-8 -lutf8proc -lzmq -lmicrohttpd -lsqlite3 -lm -lpthread \
            $(CURL_LIBS) -lgloo -lprotobuf-c -lstdc++

ifeq ($(CUDA),1)
CPPFLAGS  += -DSMELT_CUDA -I$(CUDA_HOME)/include
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
             -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -I. -DSMELT_CUDA -MMD -MP
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++
endif

# NCCL (comm/nccl.c, the collectives on device buffers): in CUDA builds when nccl.h is
# found (NCCL=0 / NCCL=1 to force; NCCL_HOME when it is not beside CUDA or in /usr).
# Without it the NCCL backend is refused by name, as in CPU builds.
NCCL_HOME ?= $(CUDA_HOME)
ifneq ($(CUDA),1)
override NCCL := 0
endif
ifeq ($(origin NCCL),undefined)
NCCL := $(if $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h),1,0)
endif
ifeq ($(NCCL),1)
CPPFLAGS  += -DSMELT_NCCL -I$(NCCL_HOME)/include
LDLIBS    += -L$(NCCL_HOME)/lib64 -lnccl
endif

# Library code: every .c in these folders except program entry points (*_main.c).
LIB_DIRS := common kernels kernels/cpu tokenizer model lora comm trainer rollout weightsync rewards datasets server tinker
NCCL_SRCS := comm/nccl.c
LIB_SRCS := $(filter-out %_main.c $(if $(filter 1,$(NCCL)),,$(NCCL_SRCS)),$(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
# The Tinker SDK's protobuf schema (server/tinker.proto): C generated by protoc-c into the
# build folder at build time (never committed), included as "server/tinker.pb-c.h".
PROTO_SRCS := server/tinker.proto
PROTO_C    := $(PROTO_SRCS:%.proto=$(BUILD)/%.pb-c.c)
PROTO_H    := $(PROTO_C:.c=.h)
LIB_OBJS   += $(PROTO_C:.c=.o)
# Gloo (libgloo-dev: no pkg-config file, the library in /usr/lib) through comm/'s shim.
LIB_CXX_SRCS := $(wildcard comm/*.cpp)
LIB_OBJS += $(LIB_CXX_SRCS:%.cpp=$(BUILD)/%.o)
CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
ifeq ($(CUDA),1)
LIB_OBJS += $(CUDA_SRCS:%.cu=$(BUILD)/%.cu.o)
endif
LIB := $(BUILD)/libsmelt.a

# Programs: dir/NAME_main.c becomes $(BUILD)/NAME with '_' as '-' (smelt_generate_main.c
# -> smelt-generate).
MAIN_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*_main.c))
bin_path = $(BUILD)/$(subst _,-,$(patsubst %_main.c,%,$(notdir $(1))))
BINS := $(foreach s,$(MAIN_SRCS),$(call bin_path,$(s)))

UNIT_SRCS ?= $(wildcard tests/unit/*.c)
GPU_TEST_SRCS := $(wildcard tests/gpu/*.c)
UNIT_BIN  := $(BUILD)/tests/unit_tests
GPU_TEST_BIN := $(BUILD)/tests/gpu_tests
EMU_SRCS := $(wildcard tests/emu/*.cpp)
EMU_TEST_BIN := $(BUILD)/tests/emu_tests
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
# GPU benchmarks (bench/gpu/run.sh runs them on a lent GPU); built by cuda-check.
BENCH_GPU_SRCS := $(wildcard bench/gpu/*.c)
BENCH_GPU_BINS := $(BENCH_GPU_SRCS:bench/gpu/%.c=$(BUILD)/bench/gpu/%)

.PHONY: all deps deps-test install-pkgs nccl-status test test-unit test-emu test-tools test-integration test-e2e test-fuzz fuzz fuzz-bins fuzz-regress fuzz-run test-parity test-gpu test-cookbook run bench \
        clean help cuda-check

all: $(LIB) $(BINS) $(BENCH_BINS)

help:
	@echo "make            build (CPU; CUDA too when nvcc is found)"
	@echo "make deps       install missing Debian packages (sudo when not root)"
	@echo "make test       install what is missing, build, run every test"
	@echo "make test-emu   run the CUDA kernels' logic on the CPU (tests/emu/)"
	@echo "make test-gpu   compare every CUDA op with the CPU backend (skips without a GPU)"
	@echo "make bench      run the CPU benchmarks (bench/)"
	@echo "make fuzz       run every libFuzzer harness (tests/fuzz/) for FUZZ_SECONDS (default 60) each"
	@echo "make test-fuzz  run every harness once over its seed corpus (part of make test)"
	@echo "make test-parity  smelt-saved models and adapters against transformers/PEFT (needs torch, transformers, peft)"
	@echo "make test-cookbook  tinker-cookbook's SL and RL loops against smeltd (installs the cookbook, torch, transformers)"
	@echo "make test-api-fuzz  schemathesis against smeltd and /v1/openapi.json for API_FUZZ_SECONDS (default 900), random seed"
	@echo "make run        install what is missing, build, start the service"
	@echo "options: SANITIZE=1 (ASan+UBSan), TSAN=1 (ThreadSanitizer; make test leaves out the browser test), CUDA=0|1, CUDA_ARCH=90"

# Installs only the packages that are missing; apt-get with sudo when not root.
deps:
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(DEPS_PKGS)"

# What the tests need beyond the build: Chromium + chromedriver, and the Python test tools.
deps-test: deps
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(TEST_PKGS)"
	@$(PYTHON) -c "import pytest, openai, zmq, selenium, tinker, schemathesis, mypy, wheel" 2>/dev/null || \
	  $(PYTHON) -m pip install -q --disable-pip-version-check -r tests/requirements.txt || \
	  $(PYTHON) -m pip install -q --disable-pip-version-check --break-system-packages -r tests/requirements.txt

install-pkgs:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

$(BUILD)/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.pb-c.c $(BUILD)/%.pb-c.h: %.proto
	@mkdir -p $(dir $@)
	protoc-c --c_out=$(BUILD) $<

# Kept (not intermediate); protoc-c's initializer macros lack inner braces.
.SECONDARY: $(PROTO_C) $(PROTO_H)
$(BUILD)/%.pb-c.o: $(BUILD)/%.pb-c.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-braces -c $< -o $@

$(BUILD)/comm/%.o: comm/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(LIB_CXXFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# Under TSAN=1 the unit and emulator tests run with tests/tsan/runner.c instead of
# libcriterion's runner, which cannot start under ThreadSanitizer (the file says why).
UNIT_RUNNER := $(if $(filter 1,$(TSAN)),$(BUILD)/tests/tsan/runner.o)
$(UNIT_BIN): $(UNIT_SRCS:%.c=$(BUILD)/%.o) $(UNIT_RUNNER) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(if $(UNIT_RUNNER),,-lcriterion) $(LDLIBS)

define BIN_RULE
$(call bin_path,$(1)): $(BUILD)/$(1:.c=.o) $(LIB)
	$$(CC) $$(LDFLAGS) $$^ -o $$@ $$(LDLIBS)
endef
$(foreach s,$(MAIN_SRCS),$(eval $(call BIN_RULE,$(s))))

$(BUILD)/bench/gpu/%: $(BUILD)/bench/gpu/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# With TSAN=1 every test program writes its ThreadSanitizer reports (smeltd, agents and
# workers included, whoever reads their stderr) to $(BUILD)/tsan/report.PID, and a suite
# fails when one exists. OpenMP runs one thread (OMP_THREAD_LIMIT=1 also caps the tests
# that ask for more): libgomp is not instrumented, so its barriers would look like races.
# tests/tsan.supp lists what is suppressed and why.
# The browser test is left out: Chromium driving a page against smeltd is slow, and the
# integration tests already drive the same smeltd code over HTTP. Even so the run takes
# about 8.5 minutes on 2 cores (objects built), so .ci/run does not make it.
ifeq ($(TSAN),1)
TSAN_DIR   := $(CURDIR)/$(BUILD)/tsan
TEST_ENV   := TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp log_path=$(TSAN_DIR)/report" OMP_THREAD_LIMIT=1
TEST_OMP   := 1
TEST_SUITES := test-unit test-emu test-tools test-integration
tsan_begin  = @rm -rf $(TSAN_DIR) && mkdir -p $(TSAN_DIR)
tsan_end    = @if [ -n "$$(ls -A $(TSAN_DIR))" ]; then cat $(TSAN_DIR)/*; \
                echo "ThreadSanitizer reported (see $(TSAN_DIR))"; exit 1; fi
else
TEST_ENV   :=
TEST_OMP   := 2
TEST_SUITES := test-unit test-emu test-tools test-fuzz test-integration test-e2e
endif

test: deps-test
	$(MAKE) $(TEST_SUITES)

# Criterion prints "Synthesis: Tested: N | Passing: N | Failing: 0 | Crashing: 0"; run_criterion.sh
# repeats the failures after it (CI keeps the tail of the output).
# OpenMP threads (OpenBLAS runs in the same pool) are capped so parallel test workers do
# not oversubscribe.
test-unit: $(UNIT_BIN) $(BUILD)/smelt-rollout
	$(tsan_begin)
	$(TEST_ENV) OMP_NUM_THREADS=$(TEST_OMP) ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  tests/tools/run_criterion.sh $(UNIT_BIN) --jobs 2
	$(tsan_end)

# The CUDA kernels' logic on the CPU (tests/emu/README.md): no GPU needed.
$(EMU_TEST_BIN): $(EMU_SRCS:%.cpp=$(BUILD)/%.o) $(UNIT_RUNNER) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -pthread $^ -o $@ $(if $(UNIT_RUNNER),,-lcriterion) $(LDLIBS)

test-emu: $(EMU_TEST_BIN)
	$(tsan_begin)
	$(TEST_ENV) OMP_NUM_THREADS=$(TEST_OMP) tests/tools/run_criterion.sh $(EMU_TEST_BIN) --jobs 2
	$(tsan_end)

$(GPU_TEST_BIN): $(GPU_TEST_SRCS:%.c=$(BUILD)/%.o) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lcriterion $(LDLIBS)

# Every CUDA op against the CPU backend. Without a GPU (or without CUDA in the build)
# each test reports itself skipped.
test-gpu: deps
	$(MAKE) $(GPU_TEST_BIN)
	sh tests/gpu/run.sh $(GPU_TEST_BIN)

# Compiles every .cu file (and comm/nccl.c when NCCL is found) and links the library
# with them: CI's check on machines without a GPU.
cuda-check:
	$(MAKE) CUDA=1 $(LIB) $(GPU_TEST_BIN) $(BENCH_GPU_BINS)
	@$(MAKE) -s --no-print-directory CUDA=1 nccl-status

nccl-status:
	@echo "NCCL backend (comm/nccl.c): $(if $(filter 1,$(NCCL)),built,not built: no nccl.h in $(NCCL_HOME)/include or /usr/include)"

# Starts the service on http://127.0.0.1:8700 with its data in ./var (the admin key is
# written to var/admin_key at the first start). The example model is offered as "tiny".
run: deps all
	@mkdir -p var/models
	@[ -e var/models/tiny ] || cp -r examples/tiny var/models/tiny
	exec $(BUILD)/smeltd --data var

# Needs torch + transformers (not installed by deps): a model smelt saves loads in
# transformers with the same logits. Fixtures: python3 tests/parity/make_fixtures.py.
test-parity: $(BINS)
	$(PYTHON) tests/parity/check_saved_model.py $(BUILD)
	$(PYTHON) tests/parity/check_saved_adapter.py $(BUILD)
	$(PYTHON) tests/parity/check_reward_model.py $(BUILD)

# The programs end to end: generation is deterministic, bad flags are refused.
test-tools: $(BINS) $(BENCH_BINS)
	$(tsan_begin)
	$(TEST_ENV) BUILD=$(BUILD) sh tests/tools/run.sh
	$(tsan_end)

# Real smeltd + embedded agent + smelt-trainer workers on loopback (pytest), and the
# rollout worker over ZeroMQ.
test-integration: $(BINS)
	$(tsan_begin)
	$(TEST_ENV) SMELT_BUILD=$(BUILD) OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration
	$(tsan_end)

# schemathesis against a real smeltd and the document it serves (tests/integration/test_schemathesis.py,
# tests/schemathesis.toml), as `make test` runs it but for API_FUZZ_SECONDS of schemathesis's budget
# (default 900) with a random seed, which the output names (SMELT_API_FUZZ_SEED=N reruns one).
API_FUZZ_SECONDS ?= 900
API_FUZZ_SEED ?= random
.PHONY: test-api-fuzz
test-api-fuzz: deps-test $(BINS)
	SMELT_BUILD=$(BUILD) OMP_NUM_THREADS=1 SMELT_API_FUZZ_SECONDS=$(API_FUZZ_SECONDS) SMELT_API_FUZZ_SEED=$(API_FUZZ_SEED) \
	  $(PYTHON) -m pytest -q -s -p no:cacheprovider tests/integration/test_schemathesis.py

# tinker-cookbook's own supervised and RL loops through the official SDK against a real
# smeltd (tests/cookbook/run_cookbook.py; not part of `make test`: it pulls torch and
# transformers). The cookbook goes in without its dependencies: they come from
# requirements.txt, which leaves out a pin the package index cannot satisfy (see there).
test-cookbook: $(BINS)
	@$(PYTHON) -c "import tinker_cookbook, chz, blobfile, tiktoken" 2>/dev/null || { \
	  { $(PYTHON) -m pip install -q --disable-pip-version-check -r tests/cookbook/requirements.txt || \
	    $(PYTHON) -m pip install -q --disable-pip-version-check --break-system-packages \
	      -r tests/cookbook/requirements.txt; } && \
	  { $(PYTHON) -m pip install -q --disable-pip-version-check --no-deps -r tests/cookbook/requirements-nodeps.txt || \
	    $(PYTHON) -m pip install -q --disable-pip-version-check --break-system-packages --no-deps \
	      -r tests/cookbook/requirements-nodeps.txt; }; }
	SMELT_BUILD=$(BUILD) OMP_NUM_THREADS=1 $(PYTHON) tests/cookbook/run_cookbook.py

# The web page in headless Chromium (selenium); saves tests/e2e/artifacts/page.png.
test-e2e: $(BINS)
	SMELT_BUILD=$(BUILD) OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -p no:cacheprovider tests/e2e

# libFuzzer harnesses (tests/fuzz/README.md), built with FUZZ=1 into build-fuzz/.
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_SRCS:tests/fuzz/fuzz_%.c=%)
FUZZ_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_SECONDS ?= 60
# Linked by clang++: a harness that reaches comm/ links the Gloo shim, whose UBSan checks
# (vptr) need the C++ half of UBSan's runtime, which the C driver leaves out.
$(BUILD)/fuzz/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)
fuzz-bins: $(FUZZ_BINS)
# Kept (not intermediate): make would delete them after linking, and relink every harness
# at the next make test-fuzz.
.SECONDARY: $(FUZZ_NAMES:%=$(BUILD)/tests/fuzz/fuzz_%.o)

# The regression run: each harness once over every seed of tests/fuzz/corpus/NAME/
# (and the crashes found earlier, kept there), failing on any crash, leak or UB.
test-fuzz: deps-test
	@$(MAKE) --no-print-directory FUZZ=1 SANITIZE=0 TSAN=0 fuzz-regress

fuzz-regress: fuzz-bins
	@for n in $(FUZZ_NAMES); do \
	  $(BUILD)/fuzz/fuzz_$$n -runs=0 tests/fuzz/corpus/$$n > $(BUILD)/fuzz/$$n.log 2>&1 || \
	    { tail -40 $(BUILD)/fuzz/$$n.log; echo "fuzz: fuzz_$$n failed on its corpus"; exit 1; }; \
	  echo "fuzz_$$n: $$(ls tests/fuzz/corpus/$$n | wc -l) seeds ok"; \
	done

# Each harness for FUZZ_SECONDS, from its seeds; new inputs go to build-fuzz/corpus/NAME
# (tests/fuzz/README.md says how a crash becomes a seed).
fuzz: deps-test
	@$(MAKE) --no-print-directory FUZZ=1 SANITIZE=0 TSAN=0 fuzz-run

fuzz-run: fuzz-bins
	@for n in $(FUZZ_NAMES); do mkdir -p $(BUILD)/corpus/$$n; \
	  $(BUILD)/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/$$n- $(BUILD)/corpus/$$n tests/fuzz/corpus/$$n \
	    > $(BUILD)/fuzz/$$n.log 2>&1 || { tail -40 $(BUILD)/fuzz/$$n.log; exit 1; }; \
	  echo "fuzz_$$n: $$(grep -o 'stat::number_of_executed_units: *[0-9]*' $(BUILD)/fuzz/$$n.log | grep -o '[0-9]*$$') runs"; \
	done

bench: $(BENCH_BINS)
	@for b in $(BENCH_BINS); do echo "== $$b"; $$b || exit 1; done

clean:
	rm -rf build build-cpu build-sanitize build-sanitize-cpu build-tsan build-tsan-cpu build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
