/* A planted violation for layering.cmake's floors check: the memory layer reaching up to the
 * engine, through its public header and through an internal one. */
#include "akv/engine.h"
#include "engine/engine_impl.h"
int planted;
