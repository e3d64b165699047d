/* A planted umbrella for headers.cmake's self-test: it leaves out a.h and takes in a testing
 * header; both must be reported. */
#ifndef PLANTED_AKV_H
#define PLANTED_AKV_H
#include "akv/testing/t.h"
#endif
