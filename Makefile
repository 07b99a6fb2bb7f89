# snapserve front door. `make run` and `make test` install what is missing
# (scripts/setup.sh, idempotent), build, then serve or test.
SHELL      := /bin/bash
ROOT       := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
BUILD_DIR  ?= $(ROOT)/build
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= $(shell nproc)
PY         := $(ROOT)/.venv/bin/python
MODEL      ?= $(ROOT)/models/SmolLM2-135M-Instruct.Q4_1.gguf
CMAKE_ARGS ?=
RUN_ARGS   ?=
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_BUILD_DIR ?= $(BUILD_DIR)/fuzz
FUZZ_TARGETS ?= $(patsubst $(ROOT)/tests/fuzz/%_fuzzer.cc,%,$(wildcard $(ROOT)/tests/fuzz/*_fuzzer.cc))

.PHONY: all setup configure build run test readme-flags test-unit test-python model bench fuzz image image-test test-sanitize format lint clean help

all: build

help:
	@echo "make run      install what is missing, build, fetch the model, serve it (gRPC :50051, metrics :9464)"
	@echo "make test     install what is missing, build, run GoogleTest (ctest) and pytest"
	@echo "make build    configure and build into $(BUILD_DIR)"
	@echo "make model    fetch the default model into models/"
	@echo "make bench    run the benchmarks (JSON under bench/results/)"
	@echo "make fuzz     build the libFuzzer harnesses (clang) and run each for FUZZ_SECONDS (60)"
	@echo "make test-sanitize  the server built with ASan+UBSan under the end-to-end tests"
	@echo "make image   build the container image with buildah on a Debian base (IMAGE_BASE=cuda: NVIDIA's)"
	@echo "make image-test  run the image with podman; probe health, one Generate and /metrics"
	@echo "make readme-flags  regenerate README.md's flag table from snapserve --help=markdown"
	@echo "make format   clang-format every C++ source"
	@echo "make lint     clang-tidy every C++ source"
	@echo "make clean    remove the build directory"

setup:
	@bash scripts/setup.sh all

$(BUILD_DIR)/build.ninja:
	cmake -S $(ROOT) -B $(BUILD_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DTorch_DIR="$$($(PY) -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch" \
	  -DCMAKE_PREFIX_PATH="$(ROOT)/.deps/prometheus-cpp/usr" \
	  -DPython3_EXECUTABLE=$(PY) $(CMAKE_ARGS)

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

model:
	@bash scripts/setup.sh model

run: build
	$(BUILD_DIR)/server/snapserve --model=$(MODEL) $(RUN_ARGS)

test: build
	@bash scripts/setup.sh kvpress
	$(MAKE) --no-print-directory test-unit test-python

# README.md's flag table from the binary (scripts/readme_flags.py;
# tests/python/test_readme_flags.py fails while they differ).
readme-flags: build
	$(PY) scripts/readme_flags.py --write --binary $(BUILD_DIR)/server/snapserve

# ctest writes JUnit XML; scripts/ctest-skips.py lists the tests skipped for
# a missing CPU feature and fails the target on any other skip.
test-unit:
	@rc=0; rm -f $(BUILD_DIR)/ctest-junit.xml; cd $(BUILD_DIR) && \
	  { ctest --output-on-failure -j $(JOBS) --output-junit $(BUILD_DIR)/ctest-junit.xml || rc=$$?; }; \
	  python3 $(ROOT)/scripts/ctest-skips.py $(BUILD_DIR)/ctest-junit.xml || rc=1; \
	  exit $$rc

test-python:
	SNAPSERVE_BUILD_DIR=$(BUILD_DIR) SNAPSERVE_MODEL=$(MODEL) \
	  $(PY) -m pytest -v -rs tests/python $(PYTEST_ARGS)

# The parsers' libFuzzer harnesses (tests/fuzz/, README.md "Fuzzing"): built
# with clang into $(FUZZ_BUILD_DIR), each run for FUZZ_SECONDS; new inputs
# stay in $(FUZZ_BUILD_DIR)/corpus, crashes in $(FUZZ_BUILD_DIR)/artifacts.
fuzz:
	@bash scripts/setup.sh system
	bash tests/fuzz/run.sh build $(FUZZ_BUILD_DIR)
	@for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  bash tests/fuzz/run.sh fuzz $(FUZZ_BUILD_DIR) $$t $(FUZZ_SECONDS) || exit 1; \
	done

# The server under ASan + UBSan, through the end-to-end tests
# (scripts/sanitize-e2e.sh, README "Sanitizers"); too slow for `make test`.
test-sanitize: setup
	bash scripts/sanitize-e2e.sh $(PYTEST_ARGS)

# The container image without a Docker daemon (scripts/image.sh, README
# "Container image"); too slow for `make test`.
image:
	bash scripts/image.sh build

image-test:
	bash scripts/image.sh test

bench: build
	@bash bench/run.sh $(BUILD_DIR)

CXX_SOURCES = $(shell git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

format:
	clang-format -i $(CXX_SOURCES)

lint: build
	$(PY) scripts/lint-compile-db.py $(BUILD_DIR) $(BUILD_DIR)/lint
	clang-tidy -p $(BUILD_DIR)/lint --quiet $(filter %.cc,$(CXX_SOURCES))

clean:
	rm -rf $(BUILD_DIR)
