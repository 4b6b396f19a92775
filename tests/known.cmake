# The table of the primitives' templates (altpatch/src/known_plans.c) is
# printed by known_plans_gen; test_known checks it against the planner.
add_executable(known_plans_gen ${CMAKE_CURRENT_SOURCE_DIR}/known_plans_gen.c)
target_compile_definitions(known_plans_gen PRIVATE _GNU_SOURCE)
target_link_libraries(known_plans_gen PRIVATE altpatch_internal)
