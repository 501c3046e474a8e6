# Helpers shared by every layer's CMakeLists.txt.

# parsyn_test(NAME <binary> SOURCES <files...> LIBS <targets...> [LABELS <labels...>] [TIMEOUT <s>])
# One GoogleTest binary per layer (keeps link time and test binaries few); each TEST becomes a CTest test carrying
# the labels (`unit` by default; `integration`, `slow` as the layer says).
function(parsyn_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
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
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60
    WORKING_DIRECTORY "${CMAKE_SOURCE_DIR}")
endfunction()
