/* run.h: `kdecode run`, offline generation from a checkpoint without a server. */
#ifndef KD_RUN_H
#define KD_RUN_H

#include <stdint.h>

/* Parses flags (argv[0] is "run"), generates, prints one JSON line. Returns the exit code:
 * 0 ok, 2 bad usage, 1 any other failure. */
int kd_run_main(int argc, char **argv);

/* Strict number parsing shared by the CLIs: whole string, in range. 0 ok, -1 bad. */
int kd_parse_i64(const char *s, long long lo, long long hi, long long *out);
int kd_parse_u64(const char *s, unsigned long long *out);
int kd_parse_f64(const char *s, double lo, double hi, double *out);
/* "1,2,3" -> array (malloc'd); each in [0, hi). Returns count or -1 with *why set. */
long kd_parse_id_list(const char *s, long long hi, int32_t **out, const char **why);

#endif
