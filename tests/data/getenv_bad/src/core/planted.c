/* planted for no_getenv.cmake: library code reading the environment */
#include <stdlib.h>
const char *planted(void) { return getenv("AKV_PLANTED"); }
