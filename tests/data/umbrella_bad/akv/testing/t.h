/* planted: test scaffolding the umbrella must not include */
#ifndef PLANTED_T_H
#define PLANTED_T_H
int planted_t(void);
#endif
