/* A planted layering violation: the layering self-test must reject this file. */
#include <cuda_runtime.h>
