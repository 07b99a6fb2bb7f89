# Registers the fuzz harnesses with ctest (included from tests/CMakeLists.txt;
# README.md, "Fuzzing"). The harnesses build in a project of their own with
# clang (tests/fuzz/CMakeLists.txt), so the GCC build only runs a script:
# fuzz_build configures and builds them into <build>/fuzz-check, then each
# fuzz_<target> replays its committed corpus and fuzzes for 10 s
# (tests/fuzz/run.sh check); any crash, sanitizer report or leak fails it.
# Without clang and libFuzzer one test, fuzz_harnesses, reports a skip.
# Off by default in the LibTorch-only build (SNAPSERVE_BUILD_SERVER=OFF), the
# GPU machine's (scripts/gpu-check.sh): it has neither nlohmann-json installed
# nor minutes to spare, and the parsers are the same on every machine.
set(SNAPSERVE_FUZZ_DIR "${CMAKE_CURRENT_LIST_DIR}")
# Its own folder, built with -O0 to keep `make test` short; `make fuzz` uses
# <build>/fuzz at -O1.
set(SNAPSERVE_FUZZ_BUILD "${CMAKE_BINARY_DIR}/fuzz-check")
option(SNAPSERVE_FUZZ_TESTS "Build and run the libFuzzer harnesses under ctest" ${SNAPSERVE_BUILD_SERVER})
set(_fuzz_probe 1)
set(_fuzz_why "clang++ with libFuzzer (-fsanitize=fuzzer) not found; apt-get install clang libclang-rt-14-dev (scripts/setup.sh installs them)")
if(NOT SNAPSERVE_FUZZ_TESTS)
  set(_fuzz_why "SNAPSERVE_FUZZ_TESTS is OFF in this build")
else()
  execute_process(COMMAND bash "${SNAPSERVE_FUZZ_DIR}/run.sh" probe RESULT_VARIABLE _fuzz_probe
                  OUTPUT_QUIET ERROR_QUIET)
endif()
if(_fuzz_probe EQUAL 0)
  message(STATUS "snapserve: fuzz harnesses run under ctest (clang++ with libFuzzer found)")
  add_test(NAME fuzz_build
           COMMAND bash "${SNAPSERVE_FUZZ_DIR}/run.sh" build "${SNAPSERVE_FUZZ_BUILD}" -O0)
  set_tests_properties(fuzz_build PROPERTIES FIXTURES_SETUP snapserve_fuzz TIMEOUT 900)
  file(GLOB _fuzz_sources CONFIGURE_DEPENDS "${SNAPSERVE_FUZZ_DIR}/*_fuzzer.cc")
  foreach(_source IN LISTS _fuzz_sources)
    get_filename_component(_name "${_source}" NAME_WE)
    string(REGEX REPLACE "_fuzzer$" "" _target "${_name}")
    add_test(NAME fuzz_${_target}
             COMMAND bash "${SNAPSERVE_FUZZ_DIR}/run.sh" check "${SNAPSERVE_FUZZ_BUILD}" ${_target})
    set_tests_properties(fuzz_${_target} PROPERTIES FIXTURES_REQUIRED snapserve_fuzz TIMEOUT 120)
  endforeach()
else()
  message(STATUS "snapserve: fuzz harnesses SKIPPED: ${_fuzz_why}")
  add_test(NAME fuzz_harnesses COMMAND bash -c "echo 'SKIPPED: ${_fuzz_why}' && exit 77")
  set_tests_properties(fuzz_harnesses PROPERTIES SKIP_RETURN_CODE 77)
endif()
