/* host.h: what the CPU benchmarks print about the machine and the moment of a run. */
#ifndef KD_BENCH_HOST_H
#define KD_BENCH_HOST_H

#include <stdio.h>
#include <string.h>
#include <time.h>

/* The CPU's model name (/proc/cpuinfo's first, else "unknown CPU") and the date and time (UTC). */
static inline void kd_bench_host(char *cpu, size_t n_cpu, char *date, size_t n_date) {
    char line[512];
    snprintf(cpu, n_cpu, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *p = strchr(line, ':');
            if (p) snprintf(cpu, n_cpu, "%s", p + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    const time_t tt = time(NULL);
    strftime(date, n_date, "%Y-%m-%d %H:%M UTC", gmtime(&tt));
}

/* OUT.json and OUT.md opened for writing; 0, or -1 (the reason printed, nothing left open). */
static inline int kd_bench_open(const char *out, FILE **js, FILE **md) {
    char path[1024];
    snprintf(path, sizeof path, "%s.json", out);
    *js = fopen(path, "w");
    snprintf(path, sizeof path, "%s.md", out);
    *md = fopen(path, "w");
    if (*js && *md) return 0;
    if (*js) fclose(*js);
    if (*md) fclose(*md);
    fprintf(stderr, "cannot write %s.json / .md\n", out);
    return -1;
}

#endif
