/* verify_test.c: the backend's verify windows, records, folds and commits (KDA.md §3-6) in
 * every commit mode, against the same tokens run one at a time as prefill rows: logits of
 * the accepted positions, the committed state after every fold, snapshots at any position,
 * refusals of misuse (prefill or export over uncommitted records, folds past the records). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd/backend.h"
#include "tests/testutil.h"
#include "worker/model.h"
#include "worker/spec.h"

#define TW 8 /* max window */

static kd_model *open_model(const char *name) {
    char path[1024], rel[256];
    kd_err err;
    snprintf(rel, sizeof rel, "%s/model", name);
    ck_assert(kd_test_oracle(path, sizeof path, rel) != NULL);
    kd_model *m = kd_model_open(path, &err);
    ck_assert_msg(m != NULL, "%s", err.msg);
    return m;
}

static kd_backend *open_backend(kd_model *m, kd_commit_mode mode, int32_t slots) {
    kd_err err;
    kd_backend *be = kd_cpu_backend_create(0, &err);
    ck_assert(be != NULL);
    ck_assert_msg(kd_backend_load(be, &m->config, &m->tensors, &err) == 0, "%s", err.msg);
    ck_assert_msg(kd_backend_reserve(be, slots, slots, 64, TW, mode, &err) == 0, "%s", err.msg);
    return be;
}

static void run(kd_backend *be, int32_t slot, int kind, int32_t fold, const int32_t *tok,
                int32_t n, int logits, float *out) {
    kd_err err;
    kd_batch_row row = {.slot = slot, .n_tokens = n, .logits = logits, .kind = kind, .fold = fold};
    kd_batch b = {.n_rows = 1, .rows = &row, .tokens = tok};
    ck_assert_msg(kd_backend_forward(be, &b, out, &err) == 0, "forward: %s", err.msg);
}

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += pow((double)a[i] - b[i], 2), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* One sequence decoded by verify windows of random length with random acceptance; the
 * reference slot runs the accepted tokens one by one. Checks logits at accepted positions,
 * and the committed state after each fold / commit, and snapshots. */
static void windows_case(const char *name, kd_commit_mode mode) {
    kd_model *m = open_model(name);
    kd_backend *ref = open_backend(m, mode, 1), *be = open_backend(m, mode, 2);
    const int32_t V = m->config.vocab;
    const size_t sb = kd_backend_state_bytes(be), ne = sb / sizeof(float);
    float *lg = malloc((size_t)TW * V * sizeof *lg), *rl = malloc((size_t)TW * V * sizeof *rl);
    float *sa = malloc(sb), *sr = malloc(sb);
    kd_test_rng rng;
    kd_test_rng_init(&rng, kd_test_seed() ^ (uint64_t)mode);
    int32_t prompt[5];
    for (int i = 0; i < 5; i++) prompt[i] = (int32_t)(kd_test_rng_u64(&rng) % (uint64_t)V);
    kd_backend_reset_slot(ref, 0, NULL);
    kd_backend_reset_slot(be, 0, NULL);
    run(ref, 0, KD_ROW_PREFILL, 0, prompt, 5, KD_LOGITS_NONE, NULL);
    run(be, 0, KD_ROW_PREFILL, 0, prompt, 5, KD_LOGITS_NONE, NULL);
    int32_t pending = 0;
    kd_err err;
    for (int step = 0; step < 40; step++) {
        const int32_t T = 1 + (int32_t)(kd_test_rng_u64(&rng) % TW);
        int32_t win[TW];
        for (int i = 0; i < T; i++) win[i] = (int32_t)(kd_test_rng_u64(&rng) % (uint64_t)V);
        for (int i = 0; i < T * V; i++) lg[i] = NAN;
        run(be, 0, KD_ROW_VERIFY, pending, win, T, KD_LOGITS_ALL, lg);
        /* the window must not have advanced the committed state: it is still readable only
         * after a commit, and a prefill over it is refused */
        ck_assert(kd_backend_state_read(be, 0, sa, sb, &err) != 0);
        ck_assert(strstr(err.msg, "uncommitted") != NULL);
        /* n tokens of the window are accepted */
        const int32_t n = 1 + (int32_t)(kd_test_rng_u64(&rng) % (uint64_t)T);
        for (int i = 0; i < n; i++) { /* the reference sees exactly those tokens */
            run(ref, 0, KD_ROW_PREFILL, 0, win + i, 1, KD_LOGITS_LAST, rl);
            double e = rel(lg + (size_t)i * V, rl, (size_t)V);
            ck_assert_msg(e < 1e-5, "%s %s step %d pos %d: verify logits rel err %.3e", name,
                          kd_commit_mode_name(mode), step, i, e);
        }
        const int choice = (int)(kd_test_rng_u64(&rng) % 3);
        if (mode == KD_COMMIT_EAGER || choice == 0 || step == 39) {
            /* commit now (snapshots have their own test below) */
            ck_assert_msg(kd_backend_commit(be, 0, n, 0, NULL, &err) == 0, "%s", err.msg);
            pending = 0;
            ck_assert_msg(kd_backend_state_read(be, 0, sa, sb, &err) == 0, "%s", err.msg);
            ck_assert(kd_backend_state_read(ref, 0, sr, sb, NULL) == 0);
            double e = rel(sa, sr, ne);
            ck_assert_msg(e < 1e-5, "%s %s step %d: committed state rel err %.3e", name,
                          kd_commit_mode_name(mode), step, e);
        } else {
            pending = n; /* folded at the start of the next verify */
        }
    }
    free(lg), free(rl), free(sa), free(sr);
    kd_backend_free(ref);
    kd_backend_free(be);
    kd_model_close(m);
}

START_TEST(test_windows_deferred) { windows_case("tiny", KD_COMMIT_DEFERRED); windows_case("small", KD_COMMIT_DEFERRED); }
END_TEST
START_TEST(test_windows_eager) { windows_case("tiny", KD_COMMIT_EAGER); }
END_TEST
START_TEST(test_windows_store_all) { windows_case("tiny", KD_COMMIT_STORE_ALL); windows_case("small", KD_COMMIT_STORE_ALL); }
END_TEST

/* A snapshot at position `at` of a commit equals the state after exactly the first `at`
 * accepted tokens, in every mode and for every position of a full window. */
static void snapshot_case(kd_commit_mode mode) {
    kd_model *m = open_model("tiny");
    kd_backend *be = open_backend(m, mode, 3);
    const int32_t V = m->config.vocab;
    const size_t sb = kd_backend_state_bytes(be), ne = sb / sizeof(float);
    float *snap = malloc(sb), *want = malloc(sb);
    kd_test_rng rng;
    kd_test_rng_init(&rng, kd_test_seed() + 77 * (uint64_t)mode);
    int32_t tok[4 + TW];
    for (int i = 0; i < 4 + TW; i++) tok[i] = (int32_t)(kd_test_rng_u64(&rng) % (uint64_t)V);
    kd_err err;
    for (int32_t at = 1; at <= TW; at++) {
        kd_backend_reset_slot(be, 0, NULL);
        run(be, 0, KD_ROW_PREFILL, 0, tok, 3, KD_LOGITS_NONE, NULL);
        /* a previous window folded in, so the snapshot's window starts from a fold */
        run(be, 0, KD_ROW_VERIFY, 0, tok + 3, 2, KD_LOGITS_NONE, NULL);
        run(be, 0, KD_ROW_VERIFY, 1, tok + 4, TW, KD_LOGITS_NONE, NULL);
        ck_assert_msg(kd_backend_commit(be, 0, TW, at, snap, &err) == 0, "%s", err.msg);
        kd_backend_reset_slot(be, 1, NULL);
        run(be, 1, KD_ROW_PREFILL, 0, tok, 4 + at, KD_LOGITS_NONE, NULL);
        kd_backend_state_read(be, 1, want, sb, NULL);
        double e = rel(snap, want, ne);
        ck_assert_msg(e < 1e-5, "%s snapshot at %d: rel err %.3e", kd_commit_mode_name(mode), at, e);
    }
    free(snap), free(want);
    kd_backend_free(be);
    kd_model_close(m);
}

START_TEST(test_snapshots) {
    snapshot_case(KD_COMMIT_DEFERRED);
    snapshot_case(KD_COMMIT_STORE_ALL);
}
END_TEST

/* Misuse is refused and changes nothing. */
START_TEST(test_misuse) {
    kd_model *m = open_model("tiny");
    kd_backend *be = open_backend(m, KD_COMMIT_DEFERRED, 2);
    kd_err err;
    int32_t tok[TW + 1] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kd_backend_reset_slot(be, 0, NULL);
    kd_batch_row row = {.slot = 0, .n_tokens = TW + 1, .logits = 0, .kind = KD_ROW_VERIFY};
    kd_batch b = {.n_rows = 1, .rows = &row, .tokens = tok};
    ck_assert(kd_backend_forward(be, &b, NULL, &err) != 0); /* window too long */
    row.n_tokens = 3, row.fold = 1;
    ck_assert(kd_backend_forward(be, &b, NULL, &err) != 0); /* fold without records */
    row.fold = 0;
    ck_assert_msg(kd_backend_forward(be, &b, NULL, &err) == 0, "%s", err.msg);
    row.fold = 4;
    ck_assert(kd_backend_forward(be, &b, NULL, &err) != 0); /* fold past the records */
    row.fold = 0;
    ck_assert(kd_backend_forward(be, &b, NULL, &err) != 0); /* records would be lost */
    row.kind = KD_ROW_PREFILL;
    ck_assert(kd_backend_forward(be, &b, NULL, &err) != 0); /* prefill over records */
    ck_assert(kd_backend_state_copy(be, 1, 0, &err) != 0);  /* export over records */
    ck_assert(kd_backend_commit(be, 0, 4, 0, NULL, &err) != 0);
    ck_assert(kd_backend_commit(be, 0, 2, 3, NULL, &err) != 0);
    ck_assert(kd_backend_commit(be, 0, 2, 1, NULL, &err) != 0); /* snapshot without a buffer */
    ck_assert_msg(kd_backend_commit(be, 0, 2, 0, NULL, &err) == 0, "%s", err.msg);
    ck_assert(kd_backend_commit(be, 0, 1, 0, NULL, &err) != 0); /* nothing left */
    ck_assert_msg(kd_backend_forward(be, &b, NULL, &err) == 0, "%s", err.msg);
    kd_backend_free(be);
    kd_model_close(m);
}
END_TEST


/* forward_sample on the CPU (the reference of the device-side sampling): two backends in the
 * same state, one running forward + kd_spec_accept per row with each request's generator
 * (what the engine did before), the other forward_sample with the generator's uniforms
 * peeked: the same tokens, accepted counts, uniforms used, and afterwards the same states. */
START_TEST(test_forward_sample) {
    kd_model *m = open_model("tiny");
    kd_backend *a = open_backend(m, KD_COMMIT_DEFERRED, 5), *b = open_backend(m, KD_COMMIT_DEFERRED, 5);
    const int32_t V = m->config.vocab;
    kd_err err;
    kd_test_rng tr;
    kd_test_rng_init(&tr, kd_test_seed() ^ 0x5a3);
    static const kd_sampling samp[4] = {{0, 0, 1, 1}, {0.8, 0, 1, 2}, {1.3, 5, 1, 3}, {0.6, 0, 0.7, 4}};
    kd_rng rng[4];
    for (int i = 0; i < 4; i++) kd_rng_seed(&rng[i], samp[i].seed);
    float *lg = malloc((size_t)4 * TW * V * sizeof *lg);
    double *probs = malloc((size_t)V * sizeof *probs);
    int32_t *order = malloc((size_t)V * sizeof *order);
    int32_t prefill[4][5], last[4], recorded[4] = {0};
    for (int32_t s = 0; s < 4; s++)
        for (int i = 0; i < 5; i++) prefill[s][i] = (int32_t)(kd_test_rng_u64(&tr) % (uint64_t)V);
    for (int32_t s = 0; s < 4; s++) {
        run(a, s, KD_ROW_PREFILL, 0, prefill[s], 5, KD_LOGITS_NONE, NULL);
        run(b, s, KD_ROW_PREFILL, 0, prefill[s], 5, KD_LOGITS_NONE, NULL);
        last[s] = prefill[s][4];
    }
    int64_t accepted_total = 0, sampled_rows = 0;
    for (int step = 0; step < 12; step++) {
        kd_batch_row rows[5];
        int32_t tok[5 * TW], n = 0, nr = 0;
        kd_sample_params sp[5];
        double u[5 * TW];
        for (int32_t s = 0; s < 4; s++) {
            const int32_t w = 1 + (int32_t)(kd_test_rng_u64(&tr) % TW);
            rows[nr] = (kd_batch_row){.slot = s, .n_tokens = w, .logits = KD_LOGITS_ALL, .kind = KD_ROW_VERIFY,
                                      .fold = recorded[s]};
            tok[n] = last[s];
            /* drafts: the greedy choice of the previous step's logits is unknown here, so
             * draw them at random, some repeated tokens among them */
            for (int32_t i = 1; i < w; i++)
                tok[n + i] = kd_test_rng_u64(&tr) % 3 ? (int32_t)(kd_test_rng_u64(&tr) % (uint64_t)V) : tok[n + i - 1];
            sp[nr] = (kd_sample_params){.temperature = samp[s].temperature, .top_p = samp[s].top_p,
                                        .top_k = samp[s].top_k};
            kd_rng peek = rng[s];
            for (int32_t i = 0; i < TW; i++) u[nr * TW + i] = kd_rng_uniform(&peek);
            n += w, nr++;
        }
        if (step % 3 == 1) { /* a scratch row and a prefill-free LAST row are ignored / drawn */
            rows[nr] = (kd_batch_row){.slot = 5, .n_tokens = 2, .logits = KD_LOGITS_NONE, .kind = KD_ROW_VERIFY};
            tok[n] = tok[n + 1] = 1;
            sp[nr] = (kd_sample_params){.top_p = 1};
            n += 2, nr++;
        }
        kd_batch batch = {.n_rows = nr, .rows = rows, .tokens = tok};
        ck_assert_msg(kd_backend_forward(a, &batch, lg, &err) == 0, "%s", err.msg);
        int32_t stok[5 * TW], sacc[5], sused[5];
        ck_assert_msg(kd_backend_forward_sample(b, &batch, sp, u, stok, sacc, sused, &err) == 0, "%s", err.msg);
        const float *l = lg;
        int64_t t0 = 0;
        for (int32_t r = 0; r < nr; r++) {
            if (rows[r].logits == KD_LOGITS_NONE) {
                ck_assert_int_eq(sacc[r], 0);
                ck_assert_int_eq(sused[r], 0);
                t0 += rows[r].n_tokens;
                continue;
            }
            const int32_t s = rows[r].slot, w = rows[r].n_tokens;
            int32_t out[TW];
            kd_rng before = rng[s];
            const int32_t acc = kd_spec_accept(l, V, tok + t0 + 1, w - 1, &samp[s], &rng[s], probs, order, out);
            ck_assert_int_eq(sacc[r], acc);
            for (int32_t i = 0; i <= acc; i++) ck_assert_int_eq(stok[r * TW + i], out[i]);
            for (int32_t i = 0; i < sused[r]; i++) kd_rng_uniform(&before);
            ck_assert_msg(!memcmp(&before, &rng[s], sizeof before), "row %d: uniforms used %d", r, sused[r]);
            ck_assert_int_eq(sused[r], samp[s].temperature > 0 ? (acc < w - 1 ? acc + 2 : w) : 0);
            accepted_total += acc, sampled_rows += samp[s].temperature > 0;
            recorded[s] = 1 + acc;
            last[s] = out[acc];
            l += (size_t)w * V;
            t0 += w;
        }
    }
    ck_assert(sampled_rows > 0);
    /* the same states on both after the last folds */
    const size_t sb = kd_backend_state_bytes(a);
    float *sa = malloc(sb), *sbuf = malloc(sb);
    for (int32_t s = 0; s < 4; s++) {
        ck_assert(kd_backend_commit(a, s, recorded[s], 0, NULL, &err) == 0);
        ck_assert(kd_backend_commit(b, s, recorded[s], 0, NULL, &err) == 0);
        ck_assert(kd_backend_state_read(a, s, sa, sb, &err) == 0 && kd_backend_state_read(b, s, sbuf, sb, &err) == 0);
        ck_assert(!memcmp(sa, sbuf, sb));
    }
    /* refusals: a window longer than max_window to sample, bad parameters, bad uniforms */
    {
        kd_batch_row row = {.slot = 0, .n_tokens = 2, .logits = KD_LOGITS_LAST, .kind = KD_ROW_VERIFY};
        int32_t t2[2] = {1, 2}, st[TW], sa1, su1;
        kd_batch one = {.n_rows = 1, .rows = &row, .tokens = t2};
        kd_sample_params bad = {.temperature = 1, .top_p = 0};
        double uu[TW] = {0.5, 0.5};
        ck_assert(kd_backend_forward_sample(b, &one, &bad, uu, st, &sa1, &su1, &err) != 0);
        kd_sample_params ok = {.temperature = 1, .top_p = 1};
        uu[0] = 1.0;
        ck_assert(kd_backend_forward_sample(b, &one, &ok, uu, st, &sa1, &su1, &err) != 0);
        ck_assert(kd_backend_forward_sample(b, &one, &ok, NULL, st, &sa1, &su1, &err) != 0);
        uu[0] = 0.25;
        ck_assert_msg(kd_backend_forward_sample(b, &one, &ok, uu, st, &sa1, &su1, &err) == 0, "%s", err.msg);
        ck_assert_int_eq(sa1, 0);
        ck_assert_int_eq(su1, 1);
        ck_assert(st[0] >= 0 && st[0] < V);
    }
    (void)accepted_total;
    free(sa), free(sbuf), free(lg), free(probs), free(order);
    kd_backend_free(a), kd_backend_free(b);
    kd_model_close(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("verify");
    TCase *tc = tcase_create("verify");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_windows_deferred);
    tcase_add_test(tc, test_windows_eager);
    tcase_add_test(tc, test_windows_store_all);
    tcase_add_test(tc, test_snapshots);
    tcase_add_test(tc, test_misuse);
    tcase_add_test(tc, test_forward_sample);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
