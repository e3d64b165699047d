/* planted: a public header the umbrella leaves out */
#ifndef PLANTED_A_H
#define PLANTED_A_H
int planted_a(void);
#endif
