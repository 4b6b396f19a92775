# Signal frames on thread stacks (altpatch/src/frames.c): test_frames runs
# threads whose signal handlers interrupted a site.
if(TARGET test_frames)
  target_link_libraries(test_frames PRIVATE pthread)
endif()
#   bench_frames         what a full search of an N MiB stack costs (not a
#                        test: `build/tests/bench_frames --mib 8`)
add_executable(bench_frames bench_frames.c)
target_compile_definitions(bench_frames PRIVATE _GNU_SOURCE)
target_link_libraries(bench_frames PRIVATE altpatch_internal pthread)
