# ctest driver of a <target>_run fuzz test (fuzz/CMakeLists.txt): seeds a corpus in the build dir
# and fuzzes it for SECONDS. Inputs: FUZZER, SEEDS, WORK, SECONDS.
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(COPY ${SEEDS}/ DESTINATION ${WORK}/corpus)
# -timeout: an input that takes 10 s is a hang; -rss_limit_mb: one that needs 2 GB is a bomb.
execute_process(COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
                        -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the input is in ${WORK}/artifacts/. Fix the parser, "
                      "then add the input to fuzz/regressions/ under the target's name.")
endif()
