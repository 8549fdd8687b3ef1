/* The per-rating loop of `pmf.pyx`'s `pmf_adagrad_step` (LIBMF's row-wise AdaGrad) and the prediction error that
 * `pmf_gradient` shares with it, written in C because they need three things Cython cannot say.
 *
 * - `restrict`: a rating's user row, item row, their change records and accumulators never overlap, and telling
 *   the compiler so lets it keep a row in vector registers across the three passes.
 * - Four interleaved partial sums per reduction: one running sum is a chain of dependent additions (rank times the
 *   add latency), which bounds the loop more than its loads do.
 * - `target_clones`: GCC compiles the batch loop twice, for AVX2 + FMA and for the x86-64 baseline, and the loader
 *   picks the one the CPU runs, so a portable wheel still uses the wide units.
 *
 * Layout (as in `pmf.pyx`): a row is rank factors then the bias; G holds two accumulators per row.
 */
#ifndef MLLESS_PMF_SGD_H
#define MLLESS_PMF_SGD_H

#include <math.h>
#include <stddef.h>

#define MLLESS_LANES 4
/* How many ratings ahead the loop prefetches its rows: enough to hide a miss to the last-level cache. */
#define MLLESS_AHEAD 8

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MLLESS_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MLLESS_CLONES
#endif

/* U_u·M_i + b_u + b_i + mean − rating for the rows at pu and pi: the prediction error every PMF kernel uses. */
static inline float mlless_pmf_error(const float *restrict pu, const float *restrict pi, int rank, float mean,
                                     float rating) {
    float dot[MLLESS_LANES] = {0};
    int k, l, body = rank - rank % MLLESS_LANES;
    for (k = 0; k < body; k += MLLESS_LANES)
        for (l = 0; l < MLLESS_LANES; l++) dot[l] += pu[k + l] * pi[k + l];
    for (k = body; k < rank; k++) dot[0] += pu[k] * pi[k];
    return (dot[0] + dot[1]) + (dot[2] + dot[3]) + pu[rank] + pi[rank] + mean - rating;
}

/* One rating: update the rows pu and pi in place, add the change to du and di, return the error before it. */
static inline float mlless_pmf_rating(float *restrict pu, float *restrict pi, float *restrict du, float *restrict di,
                                      float *restrict Gu, float *restrict Gi, float *restrict gu, float *restrict gi,
                                      int rank, float mean, float rating, float l2, float lr,
                                      float inv_rank) {
    float nu[MLLESS_LANES] = {0}, ni[MLLESS_LANES] = {0};
    int k, l, body = rank - rank % MLLESS_LANES;
    float e = mlless_pmf_error(pu, pi, rank, mean, rating);
    /* the gradients, kept for the update pass: the user row's uses the item row from before this rating */
    for (k = 0; k < body; k += MLLESS_LANES)
        for (l = 0; l < MLLESS_LANES; l++) {
            float a = e * pi[k + l] + l2 * pu[k + l], b = e * pu[k + l] + l2 * pi[k + l];
            gu[k + l] = a;
            gi[k + l] = b;
            nu[l] += a * a;
            ni[l] += b * b;
        }
    for (k = body; k < rank; k++) {
        float a = e * pi[k] + l2 * pu[k], b = e * pu[k] + l2 * pi[k];
        gu[k] = a;
        gi[k] = b;
        nu[0] += a * a;
        ni[0] += b * b;
    }
    Gu[0] += ((nu[0] + nu[1]) + (nu[2] + nu[3])) * inv_rank;
    Gi[0] += ((ni[0] + ni[1]) + (ni[2] + ni[3])) * inv_rank;
    float ru = -lr / sqrtf(Gu[0]), ri = -lr / sqrtf(Gi[0]);
    for (k = 0; k < rank; k++) {
        float a = ru * gu[k], b = ri * gi[k];
        pu[k] += a;
        du[k] += a;
        pi[k] += b;
        di[k] += b;
    }
    float bu = e + l2 * pu[rank], bi = e + l2 * pi[rank];
    Gu[1] += bu * bu;
    Gi[1] += bi * bi;
    float su = -lr / sqrtf(Gu[1]) * bu, si = -lr / sqrtf(Gi[1]) * bi;
    pu[rank] += su;
    du[rank] += su;
    pi[rank] += si;
    di[rank] += si;
    return e;
}

/* The n ratings in order; item i's row is row n_users + i.  su/si give each rating's slot in the change record D.
 * Returns the progressive sum of squared errors. */
MLLESS_CLONES static double mlless_pmf_adagrad(float *P, float *G, float *D, const int *users, const int *items,
                                               const float *ratings, const int *su, const int *si, ptrdiff_t n,
                                               int n_users, int rank, float mean, float l2, float lr) {
    ptrdiff_t s, width = rank + 1;
    float g[2 * rank], inv_rank = 1.0f / rank;
    double sse = 0.0;
    for (s = 0; s < n; s++) {
        if (s + MLLESS_AHEAD < n) { /* the rows are random across the table: start loading them early */
            const float *pu = P + (ptrdiff_t)users[s + MLLESS_AHEAD] * width;
            const float *pi = P + ((ptrdiff_t)n_users + items[s + MLLESS_AHEAD]) * width;
            __builtin_prefetch(pu);
            __builtin_prefetch(pu + width - 1);
            __builtin_prefetch(pi);
            __builtin_prefetch(pi + width - 1);
            __builtin_prefetch(G + (ptrdiff_t)users[s + MLLESS_AHEAD] * 2);
            __builtin_prefetch(G + ((ptrdiff_t)n_users + items[s + MLLESS_AHEAD]) * 2);
        }
        ptrdiff_t u = users[s], i = (ptrdiff_t)n_users + items[s];
        float e = mlless_pmf_rating(P + u * width, P + i * width, D + (ptrdiff_t)su[s] * width,
                                    D + (ptrdiff_t)si[s] * width, G + u * 2, G + i * 2, g, g + rank, rank, mean,
                                    ratings[s], l2, lr, inv_rank);
        sse += (double)e * e;
    }
    return sse;
}

#endif
