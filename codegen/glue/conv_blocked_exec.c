/* ---- A convolution whose outputs stay in the blocked layout [N][ceil(OC / L)][OH][OW][L] (L = lanes). ----
 *
 * The tiles (codegen/compute/blocked_tile.py) compute MI pixels of one output row times NI vectors of L output
 * channels; the input is read as broadcasts at each tap's offset, so it can be in either layout: blocked (pixels L
 * floats apart) or NCHW (pixels adjacent; a network's first convolution, with 3 channels, reads its image as it is).
 * A padded convolution reads a zero-padded copy in the input's own layout; an unpadded one reads the input in place.
 * Strides and dilations are just offsets: no stride phases here. A 1x1, stride 1, unpadded convolution walks the
 * whole plane as one run of pixels ("flat"), cut into rows of near-equal length, CB_FLAT_ROW pixels at most, for the
 * split over threads (49 pixels: one row; 784: 9 rows of 88, not 8 of 96 and one of 16).
 *
 * A transposed convolution (ConvTranspose) runs on the same tiles, split into output phases. Output rows
 * oh = ph + q * sh receive only the taps r = t * sh + a with a = (ph + pt) mod sh, from input rows
 * q + base(ph) - t * dh: for each phase that is a stride-1 convolution of the input, with its own tap table, its own
 * block of the packed weights ([ceil(OC / (NI * L))][sh][sw][th][tw][IC][NI * L], the kernel zero-padded to
 * th * sh x tw * sw taps; a phase's real taps come first and its K stops at the last one) and its output pixels sw * L floats apart, rows sh * OW * L apart. No multiply-add is
 * spent on the zeros a strided transposed convolution would insert between input pixels. Each phase is a cb_phase;
 * a convolution has one. */
#define CB_FLAT_ROW 96
#define CB_AMX_GEOMETRY 10 /* amx_conv_tile.py AMX_GEOMETRY */
#define CB_MAX_PHASES 64

typedef struct {
  int64_t rows, row_len, pixels; /* per item: rows of pixels, their length, all pixels (the last row may be short) */
  int64_t in_row, a_ms;          /* floats between input rows and between the row's pixels */
  int64_t out_base, out_row, ldc; /* floats: the output offset of pixel 0, between rows, between pixels */
  const int64_t *aoff;           /* per k: the tap's offset from the pixel's input */
  int64_t w_off;                 /* floats into each group of vectors' weights */
  int64_t K;                     /* the rows up to the phase's last real tap */
} cb_phase;

/* A padded convolution need not copy its whole input into a zero-padded buffer (for an early layer that copy costs
 * as much as a sixth of the convolution): the tiles whose taps stay inside the input read it in place, and only a
 * tile whose window crosses the border copies that window, zero-padded, into a small buffer on its task's stack and
 * reads it there. The window holds, per plane and kernel row, the `span` input pixels under the widest tile:
 * [planes][kh][span][ps]; `koff` gives each tap's offset in it. ct_conv_blocked picks this or the full copy per call
 * (cb_window_pays: a 7x7 output has no interior tile). The window lives on the stack of the thread running the task,
 * CB_WINDOW_MAX_FLOATS at most (64 KB); a larger window means the full copy. */
#define CB_WINDOW_MAX_FLOATS 16384
#define CB_WINDOW_COPY_WEIGHT 4.0

typedef struct {
  int on;
  const int64_t *koff;
  int64_t planes, ps, H, W, kh, dh, sh, sw, pt, pl, span, reach_w; /* reach_w: (kw - 1) * dw */
} cb_window;

static void cb_fill_window(const cb_window *w, float *dst, const float *x_item, int64_t ih0, int64_t iw0) {
  int64_t ps = w->ps, lo = iw0 < 0 ? -iw0 : 0, hi = w->W - iw0 < w->span ? w->W - iw0 : w->span;
  for (int64_t p = 0; p < w->planes; p++)
    for (int64_t r = 0; r < w->kh; r++, dst += w->span * ps) {
      int64_t ih = ih0 + r * w->dh;
      if (ih < 0 || ih >= w->H || hi <= lo) {
        memset(dst, 0, (size_t)(w->span * ps) * sizeof(float));
        continue;
      }
      memset(dst, 0, (size_t)(lo * ps) * sizeof(float));
      memcpy(dst + lo * ps, x_item + ((p * w->H + ih) * w->W + iw0 + lo) * ps, (size_t)((hi - lo) * ps) * sizeof(float));
      memset(dst + hi * ps, 0, (size_t)((w->span - hi) * ps) * sizeof(float));
    }
}

typedef struct {
  const onnxopt_ct_desc *d;
  int64_t N, OC, OCB, groups_of_vectors, OH, OW, K, K_all; /* K: rows per phase block; K_all: per group */
  int64_t item_in;                                         /* input floats per batch item */
  int n_phases;
  cb_phase phase[CB_MAX_PHASES];
  int64_t rows; /* per item, all phases */
  int64_t rtasks, gtasks;
  int weights_major;      /* tasks by group of vectors first (cb_split) */
  cb_window win;
  const float *in, *w;
  /* bfloat16 weights (onnxopt/driver/precision.py): the tiles read `in16`, a bfloat16 copy of the blocked input
     (zero-padded), and K, K_all and the tap tables count pairs of adjacent input channels (cb_prepare) */
  const uint16_t *in16;
  int64_t w_group; /* weights elements (floats, or bfloat16 pairs) per group of vectors: K_all * NI * L unless
                      padded (an AMX target pads the channels of bfloat16 weights to 32) */
  /* bfloat16 on AMX tiles (codegen/compute/amx_conv_tile.py, cb_run_amx_task): the tiles read `in32`, the input in
     blocks of 32 channels, zero-padded, [N][ceil(C / 32)][Hp][Wp][32], and the geometry table the program reads */
  int amx;
  const uint16_t *in32;
  int64_t amx_geometry[CB_AMX_GEOMETRY];
  int64_t amx_Wp, amx_item, amx_row; /* padded width; elements an item; virtual pixels a row (stride 1), or 0 */
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
  int64_t extra_count[CT_MAX_EXTRA];
} cb_job;

/* Whether the tile of `mi` pixels whose tap 0 of pixel 0 is input (ih0, iw0) reaches past the input. */
static int cb_window_needed(const cb_window *w, int64_t ih0, int64_t iw0, int64_t mi) {
  return ih0 < 0 || ih0 + (w->kh - 1) * w->dh >= w->H || iw0 < 0 || iw0 + (mi - 1) * w->sw + w->reach_w >= w->W;
}

/* The tile's A at element `at` of the input the tiles read: the input (or its zero-padded copy), or its bfloat16
   copy, whose elements are 2 bytes. */
static inline const float *cb_input_at(const cb_job *job, int64_t at) {
  return job->in16 ? (const float *)(const void *)(job->in16 + at) : job->in + at;
}

/* Task `task`'s rows [r[0], r[1]) (all items) and groups of vectors [g[0], g[1]), as cb_split numbered them. */
static void cb_task_range(const cb_job *job, int64_t task, int64_t r[2], int64_t g[2]) {
  int64_t rt = job->weights_major ? task % job->rtasks : task / job->gtasks;
  int64_t gt = job->weights_major ? task / job->rtasks : task % job->gtasks;
  int64_t all_rows = job->N * job->rows;
  r[0] = rt * all_rows / job->rtasks, r[1] = (rt + 1) * all_rows / job->rtasks;
  g[0] = gt * job->groups_of_vectors / job->gtasks, g[1] = (gt + 1) * job->groups_of_vectors / job->gtasks;
}

static void cb_run_task(const cb_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  int64_t L = d->lanes, NI = d->ni, MI = d->mi, rg[2], gg[2];
  cb_task_range(job, task, rg, gg);
  int64_t r0 = rg[0], r1 = rg[1], g0 = gg[0], g1 = gg[1];
  int64_t plane_out = job->OH * job->OW * L, item_out = job->OCB * plane_out;
  const cb_window *w = &job->win;
  float window[w->on ? CB_WINDOW_MAX_FLOATS : 1] __attribute__((aligned(64)));
  ct_tile t;
  memset(&t, 0, sizeof(t));
  for (int64_t g = g0; g < g1; g++) {
    int64_t vb = g * NI; /* first channel vector of this group */
    int nv = (int)(job->OCB - vb < NI ? job->OCB - vb : NI);
    const float *wg = job->w + g * (job->w_group ? job->w_group : job->K_all * NI * L);
    for (int j = 0; j < nv; j++) {
      int64_t left = job->OC - (vb + j) * L;
      t.voff[j] = j * L;
      t.lanes[j] = left < L ? left : L;
    }
    for (int64_t rr = r0; rr < r1; rr++) {
      int64_t n = rr / job->rows, r = rr % job->rows;
      const cb_phase *ph = job->phase;
      while (r >= ph->rows) r -= (ph++)->rows;
      int64_t len = ph->pixels - r * ph->row_len;
      if (len > ph->row_len) len = ph->row_len;
      t.koff = ph->aoff;
      t.k = ph->K;
      t.b = wg + ph->w_off;
      t.a_ms = ph->a_ms;
      t.ldc = ph->ldc;
      for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + n * item_out;
      for (int e = 0; e < d->n_extra; e++) {
        const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
        if (d->extra_kind[e] == EX_CHANNEL) base += vb * L;
        t.extra[e] = base;
      }
      int64_t in_r = n * job->item_in + r * ph->in_row; /* elements into the input */
      int64_t out_r = ph->out_base + r * ph->out_row;
      /* The row in tiles of near-equal size (7 pixels: 4 + 3, not 6 + 1): a short last tile loads the weight
         vectors for few broadcasts and runs far below the others' rate. Consecutive tiles of one size that read
         the input in place go to one call (the COUNT slot, blocked_tile.py). */
      int64_t tiles = (len + MI - 1) / MI;
      for (int64_t ti = 0, count; ti < tiles; ti += count) {
        int64_t p0 = ti * len / tiles, mi = (ti + 1) * len / tiles - p0;
        count = 1;
        t.a = cb_input_at(job, in_r + p0 * ph->a_ms);
        int in_place = 1;
        if (w->on) { /* a convolution: rows are output rows, pixels output columns */
          int64_t ih0 = r * w->sh - w->pt, iw0 = p0 * w->sw - w->pl;
          const float *x_item = job->in + n * job->item_in;
          if (cb_window_needed(w, ih0, iw0, mi)) {
            cb_fill_window(w, window, x_item, ih0, iw0);
            t.koff = w->koff;
            t.a = window;
            in_place = 0;
          } else {
            t.koff = ph->aoff;
            t.a = cb_input_at(job, n * job->item_in + (ih0 * w->W + iw0) * w->ps);
          }
        }
        while (in_place && ti + count < tiles && (ti + count + 1) * len / tiles - (ti + count) * len / tiles == mi &&
               !(w->on && cb_window_needed(w, r * w->sh - w->pt, (p0 + count * mi) * w->sw - w->pl, mi)))
          count++;
        t.count = count;
        for (int j = 0; j < nv; j++) t.coff[j] = (vb + j) * plane_out + out_r + p0 * ph->ldc;
        d->tiles[(mi - 1) * d->ni + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}


/* A bfloat16 convolution on AMX tiles (codegen/compute/amx_conv_tile.py): per group of output vectors and row,
   calls of 16 or 32 pixels, each over all of K. A stride-1 convolution's rows are runs of amx_row "virtual" pixels
   over the padded width, row after row (v = oh * Wp + ow reads the copy at v + tap offset), so no call is short but
   the last; the pixels in the padding columns (ow >= OW) are computed and dropped (pos -1): 2 of Wp for a 3x3.
   A strided convolution's rows are output rows, its last call of a row short. */
static void cb_run_amx_task(const cb_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  int64_t L = d->lanes, NI = d->ni, G = d->amx_groups, rg[2], gg[2];
  cb_task_range(job, task, rg, gg);
  int64_t r0 = rg[0], r1 = rg[1], g0 = gg[0], g1 = gg[1];
  int64_t plane_out = job->OH * job->OW * L, item_out = job->OCB * plane_out, Wp = job->amx_Wp;
  int64_t sw = d->sw, OW = job->OW, pos[32];
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.geometry = job->amx_geometry;
  t.pos = pos;
  t.a_ms = job->amx_row ? 64 : sw * 64;
  int configured = amx_tiles_configure(); /* the tiles name their registers (amx_conv_tile.py) */
  for (int64_t g = g0; g < g1; g++) {
    int64_t vb = g * NI;
    int nv = (int)(job->OCB - vb < NI ? job->OCB - vb : NI);
    t.b = job->w + g * job->w_group;
    for (int j = 0; j < nv; j++) {
      int64_t left = job->OC - (vb + j) * L;
      t.lanes[j] = left < L ? left : L;
      t.coff[j] = (vb + j) * plane_out;
    }
    for (int64_t rr = r0; rr < r1; rr++) {
      int64_t n = rr / job->rows, r = rr % job->rows;
      for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + n * item_out;
      for (int e = 0; e < d->n_extra; e++) {
        const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
        if (d->extra_kind[e] == EX_CHANNEL) base += vb * L;
        t.extra[e] = base;
      }
      const uint16_t *item = job->in32 + n * job->amx_item;
      int64_t p_begin, p_end; /* virtual pixels (stride 1) or the row's output columns */
      if (job->amx_row) {
        p_begin = r * job->amx_row;
        p_end = p_begin + job->amx_row;
        int64_t last = (job->OH - 1) * Wp + OW; /* one past the last real pixel */
        if (p_end > last) p_end = last;
      } else {
        p_begin = 0;
        p_end = OW;
      }
      for (int64_t p = p_begin; p < p_end;) {
        int64_t left = p_end - p, groups = left > 16 && G > 1 ? 2 : 1, cnt = left < 16 * groups ? left : 16 * groups;
        if (job->amx_row) { /* (oh, ow) of virtual pixel p, then stepped: no division a pixel */
          int64_t oh = p / Wp, ow = p % Wp;
          for (int64_t i = 0; i < cnt; i++) {
            pos[i] = ow < OW ? (oh * OW + ow) * L : -1;
            if (++ow == Wp) ow = 0, oh++;
          }
        } else {
          for (int64_t i = 0; i < cnt; i++) pos[i] = (r * OW + p + i) * L;
        }
        t.count = cnt;
        t.a16 = job->amx_row ? item + p * 32 : item + (r * d->sh * Wp + p * sw) * 32;
        d->amx_tiles[(groups - 1) * NI + (nv - 1)]((const int64_t *)&t);
        p += cnt;
      }
    }
  }
  amx_tiles_release(configured);
}


/* A depthwise convolution reads its blocked input in place whatever its padding, one channel vector per tile
   (codegen/microkernel/depthwise.py): a tile's kernel rows above or below the image are left out (its tap table,
   weights and K start at the first row inside), and a tile that crosses the left or right border runs the tile's
   bounded variant, told which input columns exist. No padded copy, no windows: for a depthwise convolution either
   would cost about as much as its arithmetic. The tap table is (r * dh * W + c * dw) * L, row r's taps from the
   pixel under tap (r, 0). */
/* The tiles of one output row of a depthwise convolution (or, with the ROWS slots set, of a band of rows): `row_in`
   is the input under tap (first kernel row, 0) of the row's pixel 0, pixel p goes to coff_row + p * L. A tile's
   pixel 0 may lie left of the row when the tile starts in the padding, where the bounded tile reads nothing. */
static void cb_depthwise_tiles(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *row_in,
                               int64_t OW, int64_t coff_row) {
  int64_t L = d->lanes, MI = d->mi;
  int64_t tiles = (OW + MI - 1) / MI;
  for (int64_t ti = 0; ti < tiles; ti++) {
    int64_t p0 = ti * OW / tiles, mi = (ti + 1) * OW / tiles - p0;
    int64_t iw0 = p0 * w->sw - w->pl;
    int border = iw0 < 0 || iw0 + (mi - 1) * w->sw + w->reach_w >= w->W;
    t->a = row_in + iw0 * L;
    t->lo = -iw0;       /* the first input column that exists, from the tile's pixel 0 */
    t->hi = w->W - iw0; /* one past the last */
    t->coff[0] = coff_row + p0 * L;
    d->tiles[(mi - 1) * 2 + border]((const int64_t *)t);
  }
}

/* One output row `oh` of one channel vector of a depthwise convolution, all its pixels: `in_plane` is the vector's
   input plane, `wg` its filters, `tab` the tap table; `t` carries the outputs, extras, ldc (L) and a_ms (sw * L).
   Pixel p goes to coff_row + p * L. Also used by AFUSION (afusion_exec.c), which writes rows into a scratch band. */
static void cb_depthwise_row(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *in_plane,
                             const float *wg, const int64_t *tab, int64_t oh, int64_t OW, int64_t coff_row) {
  int64_t L = d->lanes, kw = d->kw;
  int64_t ih0 = oh * w->sh - w->pt;
  int64_t kr0 = ih0 < 0 ? (-ih0 + w->dh - 1) / w->dh : 0;               /* first kernel row inside */
  int64_t kr1 = w->H - ih0 > 0 ? (w->H - ih0 + w->dh - 1) / w->dh : 0; /* one past the last */
  if (kr1 > w->kh) kr1 = w->kh;
  t->k = kr1 > kr0 ? (kr1 - kr0) * kw : 0;
  t->koff = tab;
  t->b = wg + kr0 * kw * L;
  /* The tile's pixel 0 under tap (kr0, 0); may lie left of the row when the tile starts in the padding, where
     the bounded tile reads nothing. */
  cb_depthwise_tiles(d, w, t, in_plane + ((ih0 + kr0 * w->dh) * w->W) * L, OW, coff_row);
}

/* Output rows [oh0, oh1) of one channel vector, as cb_depthwise_row, the first at coff0 and each out_row floats
   below the one before. The rows whose kernel rows all lie inside the input share the tap table, the weights and
   K: per column of tiles, one call computes all of them (the tile's ROWS slots, blocked_tile.py). */
static void cb_depthwise_rows(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *in_plane,
                              const float *wg, const int64_t *tab, int64_t oh0, int64_t oh1, int64_t OW,
                              int64_t coff0, int64_t out_row) {
  int64_t L = d->lanes, kw = d->kw;
  /* Rows lo <= oh < hi read kernel rows 0..kh-1 all inside: oh * sh >= pt and oh * sh - pt + (kh - 1) * dh < H. */
  int64_t lo = (w->pt + w->sh - 1) / w->sh, last = w->H - 1 + w->pt - (w->kh - 1) * w->dh;
  int64_t hi = last < 0 ? 0 : last / w->sh + 1;
  if (lo < oh0) lo = oh0;
  if (hi > oh1) hi = oh1;
  if (hi - lo < 2) lo = hi = oh1; /* no band worth a call of its own */
  for (int64_t oh = oh0; oh < lo; oh++)
    cb_depthwise_row(d, w, t, in_plane, wg, tab, oh, OW, coff0 + (oh - oh0) * out_row);
  if (hi > lo) {
    t->k = w->kh * kw;
    t->koff = tab;
    t->b = wg;
    t->dw_rows = hi - lo;
    t->dw_a_row = w->sh * w->W * L;
    t->dw_c_row = out_row;
    cb_depthwise_tiles(d, w, t, in_plane + ((lo * w->sh - w->pt) * w->W) * L, OW, coff0 + (lo - oh0) * out_row);
    t->dw_rows = t->dw_a_row = t->dw_c_row = 0;
  }
  for (int64_t oh = hi > lo ? hi : oh1; oh < oh1; oh++)
    cb_depthwise_row(d, w, t, in_plane, wg, tab, oh, OW, coff0 + (oh - oh0) * out_row);
}

static void cb_run_depthwise_task(const cb_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  const cb_window *w = &job->win; /* geometry only: H, W, strides, pads */
  int64_t L = d->lanes;
  int64_t rt = task / job->gtasks, gt = task % job->gtasks;
  int64_t all_rows = job->N * job->OH;
  int64_t r0 = rt * all_rows / job->rtasks, r1 = (rt + 1) * all_rows / job->rtasks;
  int64_t g0 = gt * job->OCB / job->gtasks, g1 = (gt + 1) * job->OCB / job->gtasks;
  int64_t plane_out = job->OH * job->OW * L, item_out = job->OCB * plane_out, plane_in = w->H * w->W * L;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  t.a_ms = d->sw * L;
  for (int64_t g = g0; g < g1; g++) {
    int64_t left = job->OC - g * L;
    t.lanes[0] = left < L ? left : L;
    const float *wg = job->w + g * job->K * L;
    for (int64_t rr = r0, next; rr < r1; rr = next) { /* the task's rows of one item at a time */
      int64_t n = rr / job->OH, oh = rr % job->OH;
      next = (n + 1) * job->OH < r1 ? (n + 1) * job->OH : r1;
      for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + n * item_out;
      for (int e = 0; e < d->n_extra; e++) {
        const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
        if (d->extra_kind[e] == EX_CHANNEL) base += g * L;
        t.extra[e] = base;
      }
      cb_depthwise_rows(d, w, &t, job->in + n * job->item_in + g * plane_in, wg, job->phase[0].aoff, oh,
                        oh + (next - rr), job->OW, g * plane_out + oh * job->OW * L, job->OW * L);
    }
  }
}


/* The input, zero-padded, in its own layout: one task per padded row of one plane (a channel, or a vector of
   channels when blocked); a row is Wp pixels of ps floats. */
typedef struct {
  const float *x;
  float *buf;
  int64_t ps, H, W, Hp, Wp, pt, pl;
} cb_copy_job;

static void cb_copy_row(void *usr, size_t index) {
  const cb_copy_job *p = (const cb_copy_job *)usr;
  int64_t ps = p->ps, hp = (int64_t)index % p->Hp, plane = (int64_t)index / p->Hp, h = hp - p->pt;
  float *dst = p->buf + (int64_t)index * p->Wp * ps;
  if (h < 0 || h >= p->H) {
    memset(dst, 0, (size_t)(p->Wp * ps) * sizeof(float));
    return;
  }
  memset(dst, 0, (size_t)(p->pl * ps) * sizeof(float));
  memset(dst + (p->pl + p->W) * ps, 0, (size_t)((p->Wp - p->pl - p->W) * ps) * sizeof(float));
  memcpy(dst + p->pl * ps, p->x + (plane * p->H + h) * p->W * ps, (size_t)(p->W * ps) * sizeof(float));
}

/* The blocked input, zero-padded, as bfloat16 (round to nearest even, as vcvtneps2bf16 and the weights'
   conversion, fusion/layout.py): what a bfloat16 convolution's tiles read, one task per padded row of one vector
   of channels, as cb_copy_row. Half the bytes of the float32 copy; made whether or not the convolution pads. */
typedef struct {
  const float *x;
  uint16_t *buf;
  int64_t ps, H, W, Hp, Wp, pt, pl;
  int64_t nchw_c; /* > 0: the input is NCHW with this many channels, blocked by the copy (16 lanes) */
} cb_copy16_job;

static void cb_copy16_row(void *usr, size_t index) {
  const cb_copy16_job *p = (const cb_copy16_job *)usr;
  int64_t ps = p->ps, hp = (int64_t)index % p->Hp, plane = (int64_t)index / p->Hp, h = hp - p->pt;
  uint16_t *dst = p->buf + (int64_t)index * p->Wp * ps;
  if (h < 0 || h >= p->H) {
    memset(dst, 0, (size_t)(p->Wp * ps) * sizeof(uint16_t));
    return;
  }
  memset(dst, 0, (size_t)(p->pl * ps) * sizeof(uint16_t));
  memset(dst + (p->pl + p->W) * ps, 0, (size_t)((p->Wp - p->pl - p->W) * ps) * sizeof(uint16_t));
  uint16_t *to = dst + p->pl * ps;
  if (p->nchw_c) { /* plane = item * vectors + vector: its 16 channels gathered pixel by pixel */
    int64_t C = p->nchw_c, vectors = (C + 15) / 16, item = plane / vectors, c0 = plane % vectors * 16;
    int64_t lanes = C - c0 < 16 ? C - c0 : 16, HW = p->H * p->W;
    const float *src = p->x + (item * C + c0) * HW + h * p->W;
    for (int64_t w = 0; w < p->W; w++) {
      int64_t l = 0;
      for (; l < lanes; l++) to[w * 16 + l] = glue_bf16(src[l * HW + w]);
      for (; l < 16; l++) to[w * 16 + l] = 0;
    }
    return;
  }
  const float *src = p->x + (plane * p->H + h) * p->W * ps;
  int64_t n = p->W * ps, i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (ps == 16) i = glue_bf16_run16(to, src, n); /* 16-lane blocked tensors exist only on AVX-512 targets */
#endif
  for (; i < n; i++) to[i] = glue_bf16(src[i]);
}

/* NCHW <-> blocked for the kernel that computes in the blocked layout but takes and gives NCHW tensors. One task
   per run of CB_REORDER_RUN pixels of one vector of channels, pixel by pixel: the blocked side is read (written) as
   one stream and the L planes as L streams; on AVX-512, 16 pixels at a time through a register transpose. (One task
   per plane, striding through the blocked buffer L floats at a time, went over the whole buffer once per channel: a
   16-channel depthwise 3x3 /2 to 56x56 with NCHW output took 59-63 us with it, 39-40 now.) */
#define CB_REORDER_RUN 1024
typedef struct {
  float *nchw, *blocked;
  int64_t C, L, HW, runs; /* runs per plane */
  int to_nchw;
} cb_reorder_job;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CB_HAVE_TRANSPOSE16 1
/* 16 pixels x 16 channels -> 16 channels x 16 pixels in registers: pairs interleaved, then quads, then 128-bit
   lanes twice. After the second step u[4g + j] holds, in its 128-bit lane q, channel 4q + j of pixels 4g..4g+3. */
__attribute__((target("avx512f"))) static void cb_transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int k = 0; k < 8; k++) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int g = 0; g < 4; g++) {
    __m512 *a = t + 4 * g, *o = u + 4 * g;
    o[0] = _mm512_shuffle_ps(a[0], a[2], 0x44);
    o[1] = _mm512_shuffle_ps(a[0], a[2], 0xEE);
    o[2] = _mm512_shuffle_ps(a[1], a[3], 0x44);
    o[3] = _mm512_shuffle_ps(a[1], a[3], 0xEE);
  }
  for (int j = 0; j < 4; j++) {
    __m512 v = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), w = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88), w2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_f32x4(v, v2, 0x88);      /* channel j */
    r[4 + j] = _mm512_shuffle_f32x4(w, w2, 0x88);  /* channel 4 + j */
    r[8 + j] = _mm512_shuffle_f32x4(v, v2, 0xDD);  /* channel 8 + j */
    r[12 + j] = _mm512_shuffle_f32x4(w, w2, 0xDD); /* channel 12 + j */
  }
}

/* Blocked (16 lanes) -> NCHW for pixels [i0, i1) of one channel vector, 16 pixels at a time; returns where it
   stopped (the scalar loop does the rest). Only 16-lane blocked tensors exist on AVX-512 targets. */
__attribute__((target("avx512f"))) static int64_t cb_to_nchw16(const float *vec, float *planes, int64_t HW,
                                                               int64_t lanes, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 r[16];
    for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(vec + (i + k) * 16);
    cb_transpose16(r);
    for (int64_t l = 0; l < lanes; l++) _mm512_storeu_ps(planes + l * HW + i, r[l]);
  }
  return i;
}

/* NCHW -> blocked (16 lanes), the same transpose the other way: 16 pixels of each of `lanes` planes (the planes
   past them, padding channels, read as zeros) become 16 pixel vectors. The scalar loop read 16 planes a float at a
   time: NASNet's 7x7 /2 depthwise convolutions reading a 32x111x111 NCHW tensor spent most of their time in it. */
__attribute__((target("avx512f"))) static int64_t cb_from_nchw16(float *vec, const float *planes, int64_t HW,
                                                                 int64_t lanes, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 r[16];
    for (int64_t l = 0; l < 16; l++) r[l] = l < lanes ? _mm512_loadu_ps(planes + l * HW + i) : _mm512_setzero_ps();
    cb_transpose16(r);
    for (int k = 0; k < 16; k++) _mm512_storeu_ps(vec + (i + k) * 16, r[k]);
  }
  return i;
}
#endif

/* The input, zero-padded, as bfloat16 (float16 for AMX-FP16 tiles) in blocks of 32 channels (a pixel's 32 channels
   are one 64-byte AMX tile row): what a 16-bit convolution's AMX tiles read (cb_run_amx_task), one task per padded
   row of one block, rounded as cb_copy16_row rounds. From a blocked input (16 lanes) a block is two of its
   vectors; from NCHW, 32 planes transposed 16 pixels at a time (a float at a time, this copy was 9% of PP-OCRv4
   det's run). */
typedef struct {
  const float *x;
  uint16_t *buf;
  int64_t C, H, W, Hp, Wp, pt, pl, Q; /* Q: blocks of 32 an item */
  int blocked;                        /* the input is blocked (16 lanes), else NCHW */
  int f16;                            /* float16 (AMX-FP16 tiles, x86 only), else bfloat16 */
} cb_copy32_job;

#ifdef CB_HAVE_TRANSPOSE16
/* 16 floats rounded to bfloat16 as glue_bf16 rounds. */
__attribute__((target("avx512f"))) static inline __m256i cb_bf16_vec(__m512 x) {
  const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), quiet = _mm512_set1_epi32(0x40);
  __m512i u = _mm512_castps_si512(x);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet)));
}

/* 16 floats as float16 (f16: vcvtps2ph, round to nearest even) or bfloat16 (as glue_bf16 rounds). */
__attribute__((target("avx512f"))) static inline __m256i cb_half_vec(__m512 x, int f16) {
  return f16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) : cb_bf16_vec(x);
}

/* The W pixels of a row of vectors `a` and `b` (16 floats a pixel; b NULL: zeros) into 32-channel pixels. */
__attribute__((target("avx512f"))) static void cb_half_pixels32(uint16_t *dst, const float *a, const float *b,
                                                                int64_t W, int f16) {
  for (int64_t w = 0; w < W; w++) {
    _mm256_storeu_si256((__m256i *)(dst + w * 32), cb_half_vec(_mm512_loadu_ps(a + w * 16), f16));
    _mm256_storeu_si256((__m256i *)(dst + w * 32 + 16), b ? cb_half_vec(_mm512_loadu_ps(b + w * 16), f16)
                                                          : _mm256_setzero_si256());
  }
}

/* Pixels [0, W) of a row of `lanes` NCHW planes (HW floats apart; the rest of the 32 zeros) into 32-channel pixels,
   16 at a time, the last few by masked loads (a float at a time, the 4 pixels past 16 of a 20-wide row took as long
   as the 16). */
__attribute__((target("avx512f"))) static void cb_nchw_pixels32(uint16_t *dst, const float *src, int64_t HW,
                                                                int64_t lanes, int64_t W, int f16) {
  for (int64_t w = 0; w < W; w += 16) {
    int64_t n = W - w < 16 ? W - w : 16;
    __mmask16 m = (__mmask16)((1u << n) - 1u);
    for (int half = 0; half < 2; half++) {
      __m512 r[16];
      for (int64_t l = 0; l < 16; l++) {
        int64_t c = half * 16 + l;
        r[l] = c < lanes ? _mm512_maskz_loadu_ps(m, src + c * HW + w) : _mm512_setzero_ps();
      }
      cb_transpose16(r);
      for (int64_t k = 0; k < n; k++)
        _mm256_storeu_si256((__m256i *)(dst + (w + k) * 32 + half * 16), cb_half_vec(r[k], f16));
    }
  }
}
#endif

static void cb_copy32_row(void *usr, size_t index) {
  const cb_copy32_job *p = (const cb_copy32_job *)usr;
  int64_t hp = (int64_t)index % p->Hp, block = (int64_t)index / p->Hp, h = hp - p->pt;
  int64_t item = block / p->Q, q = block % p->Q;
  uint16_t *dst = p->buf + (int64_t)index * p->Wp * 32;
  if (h < 0 || h >= p->H) {
    memset(dst, 0, (size_t)(p->Wp * 32) * sizeof(uint16_t));
    return;
  }
  memset(dst, 0, (size_t)(p->pl * 32) * sizeof(uint16_t));
  memset(dst + (p->pl + p->W) * 32, 0, (size_t)((p->Wp - p->pl - p->W) * 32) * sizeof(uint16_t));
  uint16_t *to = dst + p->pl * 32;
  int64_t HW = p->H * p->W;
  if (p->blocked) {
    int64_t vectors = (p->C + 15) / 16;
    const float *plane = p->x + (item * vectors + 2 * q) * HW * 16 + h * p->W * 16;
    const float *next = 2 * q + 1 < vectors ? plane + HW * 16 : NULL;
#ifdef CB_HAVE_TRANSPOSE16
    cb_half_pixels32(to, plane, next, p->W, p->f16); /* 16-lane blocked tensors exist only on AVX-512 targets */
#else /* no AMX here: bfloat16 only */
    for (int64_t w = 0; w < p->W; w++)
      for (int64_t l = 0; l < 32; l++)
        to[w * 32 + l] = l < 16 ? glue_bf16(plane[w * 16 + l]) : next ? glue_bf16(next[w * 16 + l - 16]) : 0;
#endif
    return;
  }
  int64_t c0 = q * 32, lanes = p->C - c0 < 32 ? p->C - c0 : 32;
  const float *src = p->x + (item * p->C + c0) * HW + h * p->W;
#ifdef CB_HAVE_TRANSPOSE16
  cb_nchw_pixels32(to, src, HW, lanes, p->W, p->f16);
#else
  for (int64_t w = 0; w < p->W; w++) {
    int64_t l = 0;
    for (; l < lanes; l++) to[w * 32 + l] = glue_bf16(src[l * HW + w]);
    for (; l < 32; l++) to[w * 32 + l] = 0;
  }
#endif
}


static void cb_reorder_run(void *usr, size_t index) {
  const cb_reorder_job *p = (const cb_reorder_job *)usr;
  int64_t L = p->L, cb = (p->C + L - 1) / L;
  int64_t run = (int64_t)index % p->runs, v = (int64_t)index / p->runs; /* v: item * cb + vector */
  int64_t n = v / cb, c0 = v % cb * L, lanes = p->C - c0 < L ? p->C - c0 : L;
  int64_t i0 = run * CB_REORDER_RUN, i1 = i0 + CB_REORDER_RUN < p->HW ? i0 + CB_REORDER_RUN : p->HW;
  float *vec = p->blocked + v * p->HW * L;
  float *planes = p->nchw + (n * p->C + c0) * p->HW;
  if (p->to_nchw) {
#ifdef CB_HAVE_TRANSPOSE16
    if (L == 16) i0 = cb_to_nchw16(vec, planes, p->HW, lanes, i0, i1);
#endif
    for (int64_t i = i0; i < i1; i++)
      for (int64_t l = 0; l < lanes; l++) planes[l * p->HW + i] = vec[i * L + l];
  } else { /* padding channels must be zero */
#ifdef CB_HAVE_TRANSPOSE16
    if (L == 16) i0 = cb_from_nchw16(vec, planes, p->HW, lanes, i0, i1);
#endif
    for (int64_t i = i0; i < i1; i++) {
      int64_t l = 0;
      for (; l < lanes; l++) vec[i * L + l] = planes[l * p->HW + i];
      for (; l < L; l++) vec[i * L + l] = 0.0f;
    }
  }
}

static OrtStatus *cb_reorder(OrtKernelContext *ctx, float *nchw, float *blocked, int64_t N, int64_t C, int64_t L,
                             int64_t HW, int to_nchw) {
  int64_t runs = (HW + CB_REORDER_RUN - 1) / CB_REORDER_RUN, tasks = N * ((C + L - 1) / L) * runs;
  cb_reorder_job j = {nchw, blocked, C, L, HW, runs, to_nchw};
  if (N * ((C + L - 1) / L) * L * HW < (1 << 16)) { /* the blocked side's size: one lane of 16 read is still read */
    for (int64_t i = 0; i < tasks; i++) cb_reorder_run(&j, (size_t)i);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, cb_reorder_run, (size_t)tasks, 0, &j);
}

/* One axis of a transposed convolution, output phase ph (outputs ph, ph + s, ...): the block a of kernel taps it
   uses (taps a, a + s, ...) and the input index its first tap reads for output ph itself; tap t reads dil * t
   before it. ONNX pads are never negative, so ph + pad - a * dil >= 0 and the division is exact. */
/* A channel-vector convolution with NCHW outputs computes into blocked buffers, reordered at the end (cb_reorder),
   and reads its per-pixel epilogue inputs blocked: they are reordered first. Allocates those buffers in one
   `*scratch` (the caller frees it) and points `out` and the POSITION `extra` at them. Nothing when out_blocked. */
static OrtStatus *cb_blocked_scratch(const onnxopt_ct_desc *d, OrtKernelContext *ctx, int64_t N, int64_t pixels,
                                     int64_t block_size, float **out, const float **extra, int64_t *extra_count,
                                     float **scratch, int skip) {
  *scratch = NULL;
  if (d->out_blocked) return NULL;
  int n_pos = 0;
  for (int e = 0; e < d->n_extra; e++) n_pos += d->extra_kind[e] == EX_POSITION && e != skip;
  *scratch = glue_floats((size_t)((d->sig.n_out + n_pos) * N * block_size));
  if (!*scratch) return fail(ORT_FAIL, "onnxopt: out of memory for the convolution's blocked outputs");
  float *next = *scratch;
  for (int o = 0; o < d->sig.n_out; o++, next += N * block_size) out[o] = next;
  for (int e = 0; e < d->n_extra; e++) {
    if (d->extra_kind[e] != EX_POSITION || e == skip) continue;
    int64_t items = d->extra_nstride[e] ? N : 1;
    OrtStatus *rs = cb_reorder(ctx, (float *)extra[e], next, items, d->oc, d->lanes, pixels, 0);
    if (rs) {
      glue_release(*scratch);
      *scratch = NULL;
      return rs;
    }
    extra[e] = next;
    extra_count[e] = block_size;
    next += N * block_size;
  }
  return NULL;
}
