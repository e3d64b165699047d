# route_kinds.cmake — fails if a file outside the route's floor names a route kind
# (AKV_ROUTE_RESIDENT, AKV_ROUTE_STAGED): what a kind decides is the route's to say through its
# functions (akv/route.h: plan, need, place); everything else chooses a kind by name
# (akv_route_kind_from_name) and asks, never switches on it. The floor: src/route/,
# include/akv/route.h, and the route's own tests (test_route.c, test_gate.c, route_cells.h,
# gpu/test_route_cuda.c).
#   cmake -DROOT=<dir> -P route_kinds.cmake
set(n_bad 0)
foreach(d src include tools bench tests cuda ref)
  file(GLOB_RECURSE files LIST_DIRECTORIES false "${ROOT}/${d}/*.c" "${ROOT}/${d}/*.h"
       "${ROOT}/${d}/*.cu" "${ROOT}/${d}/*.cuh" "${ROOT}/${d}/*.inc")
  foreach(f IN LISTS files)
    file(RELATIVE_PATH rel "${ROOT}" "${f}")
    if(rel MATCHES "^src/route/|^include/akv/route\\.h$|^tests/test_route\\.c$|^tests/test_gate\\.c$|^tests/route_cells\\.h$|^tests/gpu/test_route_cuda\\.c$|^tests/data/")
      continue()
    endif()
    file(STRINGS "${f}" hits REGEX "AKV_ROUTE_(RESIDENT|STAGED)")
    foreach(h IN LISTS hits)
      message("${rel}: names a route kind outside the route's floor: ${h}")
      math(EXPR n_bad "${n_bad} + 1")
    endforeach()
  endforeach()
endforeach()
if(n_bad GREATER 0)
  message(FATAL_ERROR "route_kinds: ${n_bad} use(s) of a route kind outside src/route/")
endif()
message("route_kinds: no file outside the route's floor names a route kind")
