# Helpers shared by every layer's CMakeLists.txt.

# parsyn_test(NAME <binary> SOURCES <files...> LIBS <targets...> [LABELS <labels...>] [TIMEOUT <s>]
#             [ONE_PROCESS <name> <gtest filter> <labels>])
# One GoogleTest binary per layer (keeps link time and test binaries few); each TEST becomes a CTest test carrying
# the labels (`unit` by default; `integration`, `slow` or `serial` as the layer says: one label each). ONE_PROCESS: the tests matching the filter
# share a fixture too costly to start once per test (CTest runs each test in its own process), e.g. a PostgreSQL
# server: they run together as the one CTest test <binary>.<name>, with its own labels.
function(parsyn_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ONE_PROCESS" ${ARGN})
  if(PARSYN_FUZZ)
    return()
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  set(filter "")
  if(T_ONE_PROCESS)
    list(GET T_ONE_PROCESS 0 group_name)
    list(GET T_ONE_PROCESS 1 group_filter)
    list(GET T_ONE_PROCESS 2 group_labels)
    set(filter TEST_FILTER "-${group_filter}")
    add_test(NAME ${T_NAME}.${group_name} COMMAND ${T_NAME} --gtest_filter=${group_filter}
      WORKING_DIRECTORY "${CMAKE_SOURCE_DIR}")
    set(group_serial FALSE)
    if("serial" IN_LIST group_labels)
      set(group_serial TRUE)
    endif()
    set_tests_properties(${T_NAME}.${group_name} PROPERTIES LABELS "${group_labels}" TIMEOUT ${T_TIMEOUT}
      RUN_SERIAL ${group_serial})
  endif()
  # `./dev test` runs two tests at a time, `slow` ones (real servers, workers and trainers) too: they spend much of
  # their time waiting on timeouts and processes. A `serial` test (one that measures timing or scale) runs alone.
  set(serial FALSE)
  if("serial" IN_LIST T_LABELS)
    set(serial TRUE)
  endif()
  # CTest starts the costliest tests first, by the times of earlier runs; a fresh build folder (CI's clean clone) has
  # none, and would start the slow tests last, behind a thousand quick ones, leaving the last slow one running alone.
  set(cost 0)
  if("slow" IN_LIST T_LABELS)
    set(cost 10)
  endif()
  gtest_discover_tests(${T_NAME}
    ${filter}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} RUN_SERIAL ${serial} COST ${cost}
    DISCOVERY_TIMEOUT 60
    WORKING_DIRECTORY "${CMAKE_SOURCE_DIR}")
endfunction()
