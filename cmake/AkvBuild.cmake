# Warnings and sanitizers, applied per target through akv_target_defaults().
function(akv_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter>
    # no a * b + c contracted into one fused multiply-add where the compiler may (clang by
    # default, gcc outside ISO mode): the host recipes' bits must not depend on the compiler,
    # the flags or which target clone runs (docs/model.md)
    $<$<COMPILE_LANGUAGE:C>:-ffp-contract=off>)
  if(AKV_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:-Werror>)
  endif()
  if(AKV_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:C>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

if(AKV_SANITIZE)
  # Libraries are static; the sanitizer runtime must also be on every final link.
  add_link_options(-fsanitize=address,undefined)
endif()

# akv_add_library(<subsystem> SOURCES ... [DEPS lib ...])
# A static library akv_<subsystem>, installed, listed in activekv.pc (dependents first).
function(akv_add_library name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(akv_${name} STATIC ${L_SOURCES})
  akv_target_defaults(akv_${name})
  target_include_directories(akv_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  if(L_DEPS)
    target_link_libraries(akv_${name} PUBLIC ${L_DEPS})
  endif()
  install(TARGETS akv_${name} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set_property(GLOBAL APPEND PROPERTY AKV_LIBRARIES akv_${name})
endfunction()
