/* A planted header that does not compile alone (size_t without <stddef.h>). */
#ifndef AKV_PLANTED_H
#define AKV_PLANTED_H
size_t akv_planted(void);
#endif
