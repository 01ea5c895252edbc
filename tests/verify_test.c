/* verify_test.c: the backend's verify windows, records, folds and commits (KDA.md §3-6) in
 * every commit mode, against the same tokens run one at a time as prefill rows: logits of
 * the accepted positions, the committed state after every fold, snapshots at any position,
 * refusals of misuse (prefill or export over uncommitted records, folds past the records). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kd/backend.h"
#include "tests/testutil.h"
#include "worker/model.h"

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

int main(void) {
    Suite *s = suite_create("verify");
    TCase *tc = tcase_create("verify");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_windows_deferred);
    tcase_add_test(tc, test_windows_eager);
    tcase_add_test(tc, test_windows_store_all);
    tcase_add_test(tc, test_snapshots);
    tcase_add_test(tc, test_misuse);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
