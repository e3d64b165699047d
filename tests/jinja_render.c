/* jinja_render.c — a test's helper: renders a Jinja template (akv/jinja.h) with a context.
 *   jinja_render TEMPLATE CONTEXT.json [DATE]
 * writes the rendering to standard output; with AKV_JINJA_SPANS=1, then a line per marked
 * stretch on standard error ("plain OFF LEN"). Exit 0; 1 with the error on standard error
 * (its first word the status: "error EINVAL line N: message"); 2 for bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/jinja.h"
#include "akv/status.h"
#include "akv/tok.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *p = malloc(cap);
    for (size_t k; p && (k = fread(p + len, 1, cap - len, f)) > 0;) {
        len += k;
        if (len == cap) p = realloc(p, cap *= 2);
    }
    fclose(f);
    *n = len;
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: jinja_render TEMPLATE CONTEXT.json [DATE]\n");
        return 2;
    }
    size_t nt, nc;
    char *t = slurp(argv[1], &nt), *c = slurp(argv[2], &nc);
    if (!t || !c) {
        fprintf(stderr, "cannot read %s\n", !t ? argv[1] : argv[2]);
        return 2;
    }
    akv_jinja *j = NULL;
    akv_jinja_error err;
    akv_status st = akv_jinja_compile(t, nt, &j, &err);
    if (st) {
        fprintf(stderr, "error %s line %u: %s\n", akv_status_name(st), err.line, err.msg);
        return 1;
    }
    akv_jinja_render_params p = {.context_json = c, .context_bytes = nc, .date = argc > 3 ? argv[3] : NULL};
    akv_tok_text out = {0};
    akv_tok_spans spans = {0};
    st = akv_jinja_render(j, &p, &out, &spans, &err);
    if (st) {
        fprintf(stderr, "error %s line %u: %s\n", akv_status_name(st), err.line, err.msg);
        akv_jinja_destroy(j);
        return 1;
    }
    fwrite(out.bytes ? out.bytes : "", 1, out.n_bytes, stdout);
    if (getenv("AKV_JINJA_SPANS"))
        for (size_t i = 0; i < spans.n; i++)
            fprintf(stderr, "plain %zu %zu\n", spans.spans[i].off, spans.spans[i].n_bytes);
    akv_tok_text_free(&out);
    akv_tok_spans_free(&spans);
    akv_jinja_destroy(j);
    free(t), free(c);
    return 0;
}
