/*
 * replay.c — runs a libFuzzer target's LLVMFuzzerTestOneInput over files, without libFuzzer:
 * every argument is a file or a directory (its regular files, in name order). Built in every
 * build (tests/fuzz/CMakeLists.txt), so the corpus (the generated seeds and tests/fuzz/regress,
 * every input that ever failed) is replayed by ctest under whatever sanitizers the build has.
 * Prints each input before running it, so a crash names the file. Exit 0 when every input ran.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 0;
    }
    size_t cap = 1 << 16, n = 0, k;
    uint8_t *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            uint8_t *grown = realloc(buf, cap * 2);
            if (!grown) free(buf);
            buf = grown, cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return 0;
    }
    printf("replay %s (%zu bytes)\n", path, n);
    fflush(stdout);
    /* an exact-size copy, so a sanitizer sees any read past the end */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    if (!exact) return 0;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 1;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    size_t n_run = 0;
    int ok = 1;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            ok = 0;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            ok &= replay_file(argv[i]), n_run++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || e->d_name[0] == '.') continue;
            if (n == cap) {
                char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
                if (!grown) abort();
                names = grown;
            }
            names[n] = malloc(strlen(path) + 1);
            if (!names[n]) abort();
            strcpy(names[n++], path);
        }
        if (d) closedir(d);
        if (n) qsort(names, n, sizeof *names, by_name);
        for (size_t j = 0; j < n; j++) {
            ok &= replay_file(names[j]), n_run++;
            free(names[j]);
        }
        free(names);
    }
    printf("replay: %zu inputs\n", n_run);
    return ok && n_run > 0 ? 0 : 1;
}
