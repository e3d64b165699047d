# no_getenv.cmake — fails if library code (src/, include/, cuda/, ref/ under ROOT) reads the
# environment (getenv, secure_getenv, environ): the library's settings are params, resolved
# by whoever creates the object; tools/, bench/ and tests/ may read variables and pass them.
#   cmake -DROOT=<dir> -P no_getenv.cmake
set(n_bad 0)
foreach(d src include cuda ref)
  file(GLOB_RECURSE files LIST_DIRECTORIES false "${ROOT}/${d}/*.c" "${ROOT}/${d}/*.h"
       "${ROOT}/${d}/*.cu" "${ROOT}/${d}/*.cuh" "${ROOT}/${d}/*.inc")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" hits REGEX "(^|[^A-Za-z0-9_])(secure_getenv|getenv|environ)[ \t]*[(;]")
    foreach(h IN LISTS hits)
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      message("${rel}: reads the environment: ${h}")
      math(EXPR n_bad "${n_bad} + 1")
    endforeach()
  endforeach()
endforeach()
if(n_bad GREATER 0)
  message(FATAL_ERROR "no_getenv: ${n_bad} read(s) of the environment in library code")
endif()
message("no_getenv: the library reads no environment variable")
