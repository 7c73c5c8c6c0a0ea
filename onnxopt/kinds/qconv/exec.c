/* The qconv kind's executor: each call packs the receptive fields of every panel of 16 output pixels (im2col into
   [k4 / 4][16][4] u8, the tile's vector operand; padding reads the activations' zero point), or in the implicit form
   lays the input out in channel groups [c / 4][h + pads][w + pads][4] and gives the tile each tap's window per
   panel, then runs the tile over output channels x panels in tasks over ORT's pool. Grouped convolutions pack
   each group's panels and run each group's output channels on them; a depthwise one runs its own tile on each
   channel's padded plane (qc_depthwise). */
#define QC_TASK_MIN_OPS 262144.0
#define QC_PANEL 16
#define QC_DW_WIDEST 64 /* the depthwise tile's widest panel: lower.py DW_VECTORS[-1] vectors of 16 lanes */
#define QC_GROUP_BYTES (128 * 1024) /* packed panels a task keeps in L2 while the weights stream past them */

typedef struct {
  const onnxopt_qconv_desc *d;
  const uint8_t *x;
  uint8_t za;
  int64_t n, h, w, oh, ow, pixels, ppi; /* ppi: panels per image */
  int64_t cin_g, cout_g;                 /* channels a group */
  int64_t cin4;                          /* a group's input channels rounded up to 4: k = tap * cin4 + channel */
  /* implicit: the input laid out [n][cin4 / 4][hp][wp][4] with its padding, and output panels along rows */
  uint8_t *grouped;
  int64_t hp, wp, ppr, relayout_tasks; /* ppr: panels per output row */
  uint8_t *packed;
  int32_t *asum;
  int64_t panels, pack_tasks;
  int64_t wide, units; /* panels a task's unit: wide_panels where the wide tiles run (lower.py), else 1; those units */
  /* an NCHW input read at several taps, laid out blocked first ([n][cin4 / 4][h][w][4], layout.py's form), so that
     the panels are packed by words as from a blocked input */
  uint8_t *blocked;
  int x_blocked;
  /* the GEMM */
  qc_tile proto;
  int64_t mblocks, bpg, ptasks, mtasks, group; /* bpg: blocks of output channels a channel group */
  int64_t block; /* output channels a block: 16 x amx_groups on AMX, else mr */
  int amx;       /* the AMX tiles run: the library has them and the CPU and the OS allow them (matrix_engine.c) */
  int64_t out_elems_per_image;
  int64_t ostep; /* the output's elements a pixel: 4 blocked (its group's 4 channels), else 1 */
  int avx512_rows; /* depthwise: the CPU converts a plane's rows with AVX-512 (qc_dw_row16) */
} qc_job;

/* One output row's run of a panel at one tap: the pixels lo..hi - 1 whose window is inside the image, reading a
   channel plane from `at` on (every sw-th byte); the run's others read the zero point. */
typedef struct {
  int seg[QC_PANEL + 1], nseg, valid; /* the panel's pixels in runs along one output row: seg[s] .. seg[s + 1] - 1 */
  int64_t ih0[QC_PANEL], iw0[QC_PANEL];
  int lo[QC_PANEL], hi[QC_PANEL];
  int64_t at[QC_PANEL];
} qc_runs;

static void qc_panel_runs(const qc_job *j, int64_t p0, qc_runs *r) {
  const onnxopt_qconv_desc *d = j->d;
  r->valid = r->nseg = 0;
  /* one division for the panel's first pixel, then steps along the row (pixels past the last repeat it) */
  int64_t q0 = p0 < j->pixels ? p0 : j->pixels - 1, oy = q0 / j->ow, ox = q0 % j->ow;
  for (int t = 0; t < QC_PANEL; t++) {
    if (p0 + t < j->pixels) {
      r->valid++;
      if (t > 0 && ++ox == j->ow) {
        ox = 0;
        oy++;
      }
    }
    r->ih0[t] = oy * d->sh - d->pt;
    r->iw0[t] = ox * d->sw - d->pl;
    if (t < r->valid && (t == 0 || r->ih0[t] != r->ih0[t - 1])) r->seg[r->nseg++] = t;
  }
  r->seg[r->nseg] = r->valid;
}

/* A 1 x 1 convolution of stride 1 without padding, on a panel of 16 pixels inside the image: its pixels are one
   run of each channel plane (no runs to work out). */
static int qc_plain_panel(const qc_job *j, int64_t p0) {
  const onnxopt_qconv_desc *d = j->d;
  return d->kh == 1 && d->kw == 1 && d->sh == 1 && d->sw == 1 && !d->pt && !d->pl && !d->pb && !d->pr &&
         p0 + QC_PANEL <= j->pixels;
}

static void qc_tap_runs(const qc_job *j, int64_t tap, qc_runs *r) {
  const onnxopt_qconv_desc *d = j->d;
  int64_t ky = (tap / d->kw) * d->dh, kx = (tap % d->kw) * d->dw;
  for (int sg = 0; sg < r->nseg; sg++) {
    int t0 = r->seg[sg], t1 = r->seg[sg + 1];
    int64_t ih = r->ih0[t0] + ky, iw = r->iw0[t0] + kx;
    r->lo[sg] = r->hi[sg] = t0;
    r->at[sg] = 0;
    if (ih < 0 || ih >= j->h) continue;
    int first = t0, last = t1;
    while (first < t1 && r->iw0[first] + kx < 0) first++;
    while (last > first && r->iw0[last - 1] + kx >= j->w) last--;
    r->lo[sg] = first;
    r->hi[sg] = last;
    r->at[sg] = ih * j->w + iw + (int64_t)(first - t0) * d->sw;
  }
}

/* out[t] = in[2 t] for 16 t (32 bytes read): on x86 two loads, masks and one pack (SSE2, every x86-64 has it). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
static void qc_every_other(uint8_t *out, const uint8_t *in) {
  __m128i lo = _mm_loadu_si128((const __m128i *)in), hi = _mm_loadu_si128((const __m128i *)(in + 16));
  __m128i even = _mm_set1_epi16(0x00ff);
  _mm_storeu_si128((__m128i *)out, _mm_packus_epi16(_mm_and_si128(lo, even), _mm_and_si128(hi, even)));
}
#else
static void qc_every_other(uint8_t *restrict out, const uint8_t *restrict in) {
  for (int t = 0; t < QC_PANEL; t++) out[t] = in[2 * t];
}
#endif

#include "words.h" /* the panels' word copies and sums */

/* The panel's 16 activations of one channel plane at the tap whose runs `r` holds, as 16 bytes in a row: in the
   image itself where they are (returned), else gathered into `col` (32 bytes: a run's copy may write 16 bytes past
   its start; the next run's overwrites them). */
static const uint8_t *qc_gather(const qc_job *j, const qc_runs *r, const uint8_t *plane, const uint8_t *end,
                                uint8_t *col) {
  const onnxopt_qconv_desc *d = j->d;
  for (int sg = 0; sg < r->nseg; sg++) {
    int t0 = r->seg[sg], t1 = r->seg[sg + 1];
    const uint8_t *row = plane + r->at[sg];
    if (r->lo[sg] == t0 && r->hi[sg] == t1 && d->sw == 1 && row + QC_PANEL <= end) {
      memcpy(col + t0, row, QC_PANEL); /* 16 bytes, whatever the run's length: one vector copy */
      continue;
    }
    if (r->lo[sg] == t0 && r->hi[sg] == t1 && d->sw == 2 && row + 2 * QC_PANEL <= end) {
      qc_every_other(col + t0, row); /* likewise: a stride-2 stem's rows */
      continue;
    }
    for (int t = t0; t < r->lo[sg]; t++) col[t] = j->za;
    if (d->sw == 1)
      memcpy(col + r->lo[sg], row, (size_t)(r->hi[sg] - r->lo[sg]));
    else
      for (int t = r->lo[sg]; t < r->hi[sg]; t++) col[t] = row[(t - r->lo[sg]) * d->sw];
    for (int t = r->hi[sg]; t < t1; t++) col[t] = j->za;
  }
  for (int t = r->valid; t < QC_PANEL; t++) col[t] = 0; /* past the image's last pixel */
  return col;
}

/* asum[t] of one packed panel (words.h), when the tile needs it. */
static void qc_panel_asum(const qc_job *j, int64_t grp, int64_t panel) {
  const onnxopt_qconv_desc *d = j->d;
  if (!j->asum) return;
  qc_words_asum(j->asum + (grp * j->panels + panel) * QC_PANEL, j->packed + (grp * j->panels + panel) * d->k4 * QC_PANEL,
                d->k4 / 4, d->packed_signed);
}

/* One panel's receptive fields in channel group `grp`: packed[g][t][q] = the activation at k = 4g + q for pixel
   t, where k = tap * cin4 + channel (find.py's weight order: the 4 k of a group are 4 channels of one tap, so they
   share the window's position), or k = tap for one input channel a group (depthwise); the activations' zero point
   where the window leaves the image, 0 past the channels, the taps or the image's last pixel. asum[t]: their sum
   over k. */
static void qc_pack_panel(const qc_job *j, int64_t grp, int64_t panel) {
  const onnxopt_qconv_desc *d = j->d;
  int64_t img = panel / j->ppi, p0 = (panel % j->ppi) * QC_PANEL, plane_size = j->h * j->w;
  const uint8_t *x = j->x + (img * d->cin + grp * j->cin_g) * plane_size, *end = j->x + j->n * d->cin * plane_size;
  uint8_t *dst = j->packed + (grp * j->panels + panel) * d->k4 * QC_PANEL;
  static const uint8_t zeros[QC_PANEL];
  qc_runs r;
  /* A 1 x 1's plain panel needs no runs */
  int plain = j->cin_g > 1 && qc_plain_panel(j, p0);
  if (!plain) qc_panel_runs(j, p0, &r);
  uint32_t *o32 = (uint32_t *)dst;
  if (j->cin_g == 1) { /* k = tap: each group of 4 k is 4 taps of the one channel */
    uint8_t cols[QC_MAX_TAPS][2 * QC_PANEL];
    const uint8_t *src[QC_MAX_TAPS + 4];
    int64_t taps = d->kh * d->kw;
    for (int64_t tap = 0; tap < taps; tap++) {
      qc_tap_runs(j, tap, &r);
      src[tap] = qc_gather(j, &r, x, end, cols[tap]);
    }
    for (int64_t tap = taps; tap < d->k4; tap++) src[tap] = zeros;
    for (int64_t g = 0; g < d->k4; g += 4, o32 += QC_PANEL) {
      qc_interleave(o32, src[g], src[g + 1], src[g + 2], src[g + 3]);
      if (d->flip) { /* s8 <-> u8: a +- 128 flips the top bit; only the real taps' bytes */
        uint32_t flip = 0;
        for (int q = 0; q < 4 && g + q < taps; q++) flip |= 0x80u << (8 * q);
        for (int t = 0; t < QC_PANEL; t++) o32[t] ^= flip;
      }
    }
  } else {
    uint8_t cols[4][2 * QC_PANEL];
    for (int64_t tap = 0; tap < d->kh * d->kw; tap++) {
      if (!plain) qc_tap_runs(j, tap, &r);
      for (int64_t c4 = 0; c4 < j->cin4; c4 += 4, o32 += QC_PANEL) {
        /* The 16 pixels' activations of each of the 4 channels, as 16 bytes in a row, then interleaved into the
           tile's 4-byte groups. */
        const uint8_t *src[4];
        for (int q = 0; q < 4; q++) {
          int64_t c = c4 + q;
          if (c >= j->cin_g)
            src[q] = zeros;
          else if (plain)
            src[q] = x + c * plane_size + p0;
          else
            src[q] = qc_gather(j, &r, x + c * plane_size, end, cols[q]);
        }
        qc_interleave(o32, src[0], src[1], src[2], src[3]);
        if (d->flip) { /* s8 <-> u8: a +- 128 flips the top bit; only the real channels' bytes */
          uint32_t flip = 0;
          for (int q = 0; q < 4 && c4 + q < j->cin_g; q++) flip |= 0x80u << (8 * q);
          for (int t = 0; t < QC_PANEL; t++) o32[t] ^= flip;
        }
      }
    }
  }
  qc_panel_asum(j, grp, panel);
}

/* The channels of a group of 4 that are real (c of them, or all 4) as a mask of their bytes. */
static uint32_t qc_real_lanes(int64_t c) { return c >= 4 ? 0xffffffffu : (1u << (8 * c)) - 1u; }

/* One panel's receptive fields from a blocked input ([n][cin4 / 4][h][w][4], layout.py; one group): a pixel's 4
   channels are one word, copied per tap and channel group in qc_pack_panel's order; the zero point's where the
   window leaves the image, 0 in the channels past cin as there. */
static void qc_pack_panel_blocked(const qc_job *j, int64_t panel) {
  const onnxopt_qconv_desc *d = j->d;
  int64_t img = panel / j->ppi, p0 = (panel % j->ppi) * QC_PANEL, plane = j->h * j->w, groups = j->cin4 / 4;
  const uint32_t *x = (const uint32_t *)j->x + img * groups * plane;
  uint32_t *o32 = (uint32_t *)(j->packed + panel * d->k4 * QC_PANEL);
  qc_runs r;
  int plain = qc_plain_panel(j, p0);
  if (!plain) qc_panel_runs(j, p0, &r);
  for (int64_t tap = 0; tap < d->kh * d->kw; tap++) {
    if (!plain) qc_tap_runs(j, tap, &r);
    for (int64_t g = 0; g < groups; g++, o32 += QC_PANEL) {
      const uint32_t *src = x + g * plane;
      uint32_t real = qc_real_lanes(d->cin - 4 * g), flip = d->flip ? real & 0x80808080u : 0u;
      uint32_t pad = ((0x01010101u * j->za) & real) ^ flip;
      if (plain) {
        qc_copy_words(o32, src + p0, QC_PANEL, 1, flip);
        continue;
      }
      for (int sg = 0; sg < r.nseg; sg++) {
        int t0 = r.seg[sg], t1 = r.seg[sg + 1];
        for (int t = t0; t < r.lo[sg]; t++) o32[t] = pad;
        qc_copy_words(o32 + r.lo[sg], src + r.at[sg], r.hi[sg] - r.lo[sg], d->sw, flip);
        for (int t = r.hi[sg]; t < t1; t++) o32[t] = pad;
      }
      for (int t = r.valid; t < QC_PANEL; t++) o32[t] = 0; /* past the image's last pixel */
    }
  }
  qc_panel_asum(j, 0, panel);
}

/* The implicit form's input: image `img`, channel group g as [hp][wp][4] u8 (after the sign flip of s8
   activations), the padding the zero point, so that the window of 16 pixels of one output row at one tap is 64
   contiguous bytes, the tile's operand as it is. */
static void qc_relayout(const qc_job *j, int64_t img, int64_t g) {
  const onnxopt_qconv_desc *d = j->d;
  int64_t plane = j->h * j->w;
  uint32_t za4 = 0x01010101u * (uint8_t)j->proto.azp;
  uint32_t flip = d->flip ? qc_real_lanes(d->cin - 4 * g) & 0x80808080u : 0u; /* the real channels' top bits */
  uint32_t *out = (uint32_t *)(j->grouped + ((img * (j->cin4 / 4) + g) * j->hp * j->wp) * 4);
  /* a blocked input is channel-grouped already: its rows are copied between the padding */
  const uint32_t *words = d->in_blocked ? (const uint32_t *)j->x + (img * (j->cin4 / 4) + g) * plane : NULL;
  static const uint8_t fill[QC_PANEL];
  const uint8_t *src[4];
  for (int q = 0; q < 4; q++) {
    int64_t c = 4 * g + q;
    src[q] = c < d->cin && !words ? j->x + (img * d->cin + c) * plane : NULL;
  }
  for (int64_t r = 0; r < j->hp; r++, out += j->wp) {
    int64_t y = r - d->pt;
    if (y < 0 || y >= j->h) {
      for (int64_t c = 0; c < j->wp; c++) out[c] = za4;
      continue;
    }
    for (int64_t c = 0; c < d->pl; c++) out[c] = za4;
    for (int64_t c = d->pl + j->w; c < j->wp; c++) out[c] = za4;
    uint32_t *o = out + d->pl;
    if (words) {
      for (int64_t c = 0; c < j->w; c++) o[c] = words[y * j->w + c] ^ flip;
      continue;
    }
    const uint8_t *rows[4];
    for (int q = 0; q < 4; q++) rows[q] = src[q] ? src[q] + y * j->w : fill;
    int64_t c = 0;
    for (; c + QC_PANEL <= j->w; c += QC_PANEL)
      qc_interleave(o + c, src[0] ? rows[0] + c : fill, src[1] ? rows[1] + c : fill, src[2] ? rows[2] + c : fill,
                    src[3] ? rows[3] + c : fill);
    for (; c < j->w; c++) {
      uint32_t v = 0;
      for (int q = 0; q < 4; q++)
        if (src[q]) v |= (uint32_t)rows[q][c] << (8 * q);
      o[c] = v;
    }
    if (flip)
      for (c = 0; c < j->w; c++) o[c] ^= flip;
  }
}

static void qc_relayout_task(void *usr, size_t index) {
  const qc_job *j = (const qc_job *)usr;
  int64_t items = j->n * (j->cin4 / 4);
  int64_t i0 = (int64_t)index * items / j->relayout_tasks, i1 = ((int64_t)index + 1) * items / j->relayout_tasks;
  for (int64_t i = i0; i < i1; i++) qc_relayout(j, i / (j->cin4 / 4), i % (j->cin4 / 4));
}

/* Channel group g of image img of an NCHW input as blocked words: 4 channel planes interleaved, channels past cin
   zero (no padding, no sign flip: the blocked packing applies both). */
static void qc_block_input(const qc_job *j, int64_t img, int64_t g) {
  const onnxopt_qconv_desc *d = j->d;
  int64_t plane = j->h * j->w, i = 0;
  uint32_t *out = (uint32_t *)j->blocked + (img * (j->cin4 / 4) + g) * plane;
  static const uint8_t zeros[QC_PANEL];
  const uint8_t *src[4];
  for (int q = 0; q < 4; q++) src[q] = 4 * g + q < d->cin ? j->x + (img * d->cin + 4 * g + q) * plane : NULL;
  for (; i + QC_PANEL <= plane; i += QC_PANEL)
    qc_interleave(out + i, src[0] ? src[0] + i : zeros, src[1] ? src[1] + i : zeros, src[2] ? src[2] + i : zeros,
                  src[3] ? src[3] + i : zeros);
  for (; i < plane; i++) {
    uint32_t v = 0;
    for (int q = 0; q < 4; q++)
      if (src[q]) v |= (uint32_t)src[q][i] << (8 * q);
    out[i] = v;
  }
}

static void qc_block_input_task(void *usr, size_t index) {
  const qc_job *j = (const qc_job *)usr;
  int64_t items = j->n * (j->cin4 / 4);
  int64_t i0 = (int64_t)index * items / j->relayout_tasks, i1 = ((int64_t)index + 1) * items / j->relayout_tasks;
  for (int64_t i = i0; i < i1; i++) qc_block_input(j, i / (j->cin4 / 4), i % (j->cin4 / 4));
}

static void qc_pack_task(void *usr, size_t index) {
  const qc_job *j = (const qc_job *)usr;
  int64_t items = j->d->group * j->panels;
  int64_t i0 = (int64_t)index * items / j->pack_tasks, i1 = ((int64_t)index + 1) * items / j->pack_tasks;
  for (int64_t i = i0; i < i1; i++) {
    if (j->d->in_blocked || j->x_blocked)
      qc_pack_panel_blocked(j, i);
    else
      qc_pack_panel(j, i / j->panels, i % j->panels);
  }
}

/* The tiles for a panel of `ncols` pixels: those of one vector where it holds them all (a 7-pixel row computes 8
   columns, not 16). */
static const qconv_tile_fn *qc_tiles_for(const onnxopt_qconv_desc *d, int64_t ncols) {
  return ncols <= d->half_cols ? d->half_tiles : d->tiles;
}

/* The implicit form's tasks: per panel (up to 16 pixels of one output row) its window's start per tap, computed
   once, then every channel block of the task on it (at most 64 channels: their weights stay in L1). */
static void qc_implicit_task(const qc_job *j, int64_t p0, int64_t p1, int64_t b0, int64_t b1) {
  const onnxopt_qconv_desc *d = j->d;
  qc_tile t = j->proto;
  const uint8_t *window[QC_MAX_TAPS];
  t.panel = (const uint8_t *)window;
  for (int64_t p = p0; p < p1; p++) {
    int64_t img = p / (j->oh * j->ppr), row = p % (j->oh * j->ppr) / j->ppr, col = p % j->ppr * QC_PANEL;
    const uint8_t *base = j->grouped + img * (j->cin4 / 4) * j->hp * j->wp * 4;
    for (int64_t tap = 0; tap < d->kh * d->kw; tap++)
      window[tap] = base + ((row + tap / d->kw * d->dh) * j->wp + col + tap % d->kw * d->dw) * 4;
    t.ncols = j->ow - col < QC_PANEL ? j->ow - col : QC_PANEL;
    t.out_off = img * j->out_elems_per_image + (row * j->ow + col) * j->ostep;
    t.chan_base = img * d->cout;
    const qconv_tile_fn *tiles = qc_tiles_for(d, t.ncols);
    for (int64_t mb = b0; mb < b1; mb++) {
      t.m0 = mb * d->mr;
      tiles[(d->cout - t.m0 < d->mr ? d->cout - t.m0 : d->mr) - 1]((const int64_t *)&t);
    }
  }
}

static void qc_gemm_task(void *usr, size_t index) {
  const qc_job *j = (const qc_job *)usr;
  const onnxopt_qconv_desc *d = j->d;
  int64_t pt = (int64_t)index / j->mtasks, mt = (int64_t)index % j->mtasks;
  int64_t p0 = pt * j->units / j->ptasks * j->wide, p1 = (pt + 1) * j->units / j->ptasks * j->wide;
  if (p1 > j->panels) p1 = j->panels;
  int64_t b0 = mt * j->mblocks / j->mtasks, b1 = (mt + 1) * j->mblocks / j->mtasks;
  if (d->implicit) {
    qc_implicit_task(j, p0, p1, b0, b1);
    return;
  }
  qc_tile t = j->proto;
  for (int64_t g0 = p0; g0 < p1; g0 += j->group) { /* panels in L2-sized groups, the weights streamed per group */
    int64_t g1 = g0 + j->group < p1 ? g0 + j->group : p1;
    for (int64_t mb = b0; mb < b1; mb++) {
      int64_t grp = mb / j->bpg, in_group = (mb % j->bpg) * j->block; /* blocks never straddle channel groups */
      int64_t m0 = grp * j->cout_g + in_group;
      int64_t mi = j->cout_g - in_group < j->block ? j->cout_g - in_group : j->block;
      for (int64_t p = g0; p < g1;) {
        int64_t img = p / j->ppi, first = (p % j->ppi) * QC_PANEL;
        /* a wide tile (lower.py wide_shape) takes wide_panels panels of this image's consecutive pixels at once;
           not with AMX, whose blocks are one panel wide */
        int64_t np = d->wide_panels && !j->amx && p + d->wide_panels <= g1 &&
                     (p + d->wide_panels - 1) / j->ppi == img ? d->wide_panels : 1;
        t.panel = j->packed + (grp * j->panels + p) * d->k4 * QC_PANEL;
        t.asum = j->asum ? j->asum + (grp * j->panels + p) * QC_PANEL : NULL;
        t.ncols = j->pixels - first < np * QC_PANEL ? j->pixels - first : np * QC_PANEL;
        t.out_off = img * j->out_elems_per_image + first * j->ostep;
        t.chan_base = img * d->cout;
        p += np;
        if (np > 1) {
          /* a blocked output is written 4 channels a word: its tiles start at multiples of 4 */
          int64_t rows_at_most = d->out_blocked ? 4 : d->wide_rows;
          for (int64_t m = 0; m < mi;) {
            int64_t n = mi - m < rows_at_most ? mi - m : rows_at_most;
            t.m0 = m0 + m;
            d->wide[n - 1]((const int64_t *)&t);
            m += n;
          }
          continue;
        }
        int64_t m = 0;
        if (j->amx && mi >= 16) { /* whole groups of 16 channels on AMX, the rest on the dot-product tiles */
          t.m0 = m0;
          d->amx_tiles[mi / 16 - 1]((const int64_t *)&t);
          m = mi / 16 * 16;
        }
        const qconv_tile_fn *tiles = qc_tiles_for(d, t.ncols);
        for (; m < mi; m += d->mr) {
          t.m0 = m0 + m;
          tiles[(mi - m < d->mr ? mi - m : d->mr) - 1]((const int64_t *)&t);
        }
      }
    }
  }
}

/* Depthwise: each channel's plane is padded with the zero point and written as float ([n][c][hp][wp], slack past
   the end for a last panel's loads), then the tile runs the channel's output rows on it; tasks take ranges of
   (image, channel). */
#include "dw_plane.h" /* the planes padded as float */

/* Channel i = image * cout + c of the input, padded, as float, into its plane of j->grouped. */
static void qc_dw_pad(const qc_job *j, int64_t i) {
  const onnxopt_qconv_desc *d = j->d;
  int act_signed = d->flip != d->packed_signed;
  float za = act_signed ? (float)(int8_t)j->za : (float)j->za;
  qc_dw_plane((float *)j->grouped + i * j->hp * j->wp, j->x + i * j->h * j->w, j->x + j->n * d->cin * j->h * j->w,
              j->h, j->w, j->hp, j->wp, d->pt, d->pl, za, act_signed, j->avx512_rows);
}

/* A task's channels, each padded then convolved: one parallel section, and the plane still in cache. */
static void qc_dw_task(void *usr, size_t index) {
  const qc_job *j = (const qc_job *)usr;
  const onnxopt_qconv_desc *d = j->d;
  int64_t items = j->n * d->cout;
  int64_t i0 = (int64_t)index * items / j->ptasks, i1 = ((int64_t)index + 1) * items / j->ptasks;
  qc_tile t = j->proto;
  for (int64_t i = i0; i < i1; i++) {
    int64_t img = i / d->cout;
    qc_dw_pad(j, i);
    t.m0 = i % d->cout;
    t.dw_in = (const uint8_t *)((const float *)j->grouped + i * j->hp * j->wp);
    t.out_off = img * j->out_elems_per_image;
    t.chan_base = img * d->cout;
    d->tiles[0]((const int64_t *)&t);
  }
}

static OrtStatus *qc_depthwise(qc_job *j, OrtKernelContext *ctx) {
  const onnxopt_qconv_desc *d = j->d;
  OrtStatus *st = NULL;
  int act_signed = d->flip != d->packed_signed; /* the input is s8 */
  j->proto.azp = act_signed ? (int64_t)(int8_t)j->za : (int64_t)j->za; /* the tile widens with the sign */
  j->hp = j->h + d->pt + d->pb;
  j->avx512_rows = qc_dw_avx512();
  /* a row long enough for every panel's loads: the last panel reads 16 outputs' windows */
  int64_t need = ((j->ow + QC_PANEL - 1) / QC_PANEL * QC_PANEL - 1) * d->sw + (d->kw - 1) * d->dw + 1;
  j->wp = j->w + d->pl + d->pr;
  if (j->wp < need) j->wp = need;
  if (j->wp < d->pl + (j->w + 15) / 16 * 16) j->wp = d->pl + (j->w + 15) / 16 * 16; /* qc_dw_plane's chunks */
  size_t bytes = (size_t)(j->n * d->cout * j->hp * j->wp) * sizeof(float);
  /* + the last loads past the end: a stride-2 panel's, and a wide panel's (up to QC_DW_WIDEST pixels, where the
     row is padded for QC_PANEL) */
  size_t slack = 256 + (size_t)((QC_DW_WIDEST - QC_PANEL) * d->sw) * sizeof(float);
  j->grouped = (uint8_t *)glue_bytes(bytes + slack);
  if (!j->grouped) return fail(ORT_FAIL, "onnxopt: qconv: out of memory");
  memset(j->grouped + bytes, 0, slack);
  int64_t items = j->n * d->cout;
  j->proto.dw_wp = j->wp;
  j->proto.dw_y0 = 0;
  j->proto.dw_y1 = j->oh;
  j->proto.dw_ow = j->ow;
  double ops = 2.0 * (double)items * (double)j->pixels * (double)(d->kh * d->kw);
  int64_t tasks = (int64_t)(ops / QC_TASK_MIN_OPS);
  if (tasks > d->tasks) tasks = d->tasks;
  if (tasks > items) tasks = items;
  j->ptasks = tasks < 1 ? 1 : tasks;
  if (j->ptasks > 1)
    st = API(KernelContext_ParallelFor)(ctx, qc_dw_task, (size_t)j->ptasks, 0, j);
  else
    qc_dw_task(j, 0);
  glue_release(j->grouped);
  return st;
}

/* Panels x channel blocks in tasks (runtime.c grid_split): the weights are read once per panel range, the packed
   panels once per channel range; a task walks its panels in L2-sized groups. */
static void qc_plan(qc_job *j) {
  const onnxopt_qconv_desc *d = j->d;
  double panel_bytes = QC_PANEL * (double)d->k4;
  /* tasks take whole groups of the wide tiles' panels (with 19 panels in 16 tasks, no task would have 4) */
  j->wide = d->wide_panels > 0 && !j->amx && !d->implicit ? d->wide_panels : 1;
  j->units = (j->panels + j->wide - 1) / j->wide;
  grid_split(2.0 * (double)j->panels * panel_bytes * (double)d->cout, QC_TASK_MIN_OPS, d->tasks, j->units,
             j->mblocks, (double)d->cout * (double)d->k4, (double)j->panels * panel_bytes, &j->ptasks, &j->mtasks);
  j->group = QC_GROUP_BYTES / (d->k4 * QC_PANEL);
  j->group = j->group / j->wide * j->wide; /* whole groups of the wide tiles' panels */
  if (j->group < j->wide) j->group = j->wide;
}

/* `task` over the input's images x channel groups (qc_relayout_task, qc_block_input_task), in parallel. */
static OrtStatus *qc_per_channel_group(qc_job *j, OrtKernelContext *ctx, void (*task)(void *, size_t)) {
  int64_t items = j->n * (j->cin4 / 4);
  j->relayout_tasks = items < j->d->tasks ? items : j->d->tasks;
  if (j->relayout_tasks > 1) return API(KernelContext_ParallelFor)(ctx, task, (size_t)j->relayout_tasks, 0, j);
  task(j, 0);
  return NULL;
}

static OrtStatus *qconv_execute(const onnxopt_qconv_desc *d, OrtKernelContext *ctx) {
  int64_t dims[MAX_RANK], other[MAX_RANK];
  size_t rank, other_rank;
  const void *data;
  qc_job j;
  memset(&j, 0, sizeof j);
  j.d = d;
  int in = 0;
  CHECK(glue_input(ctx, in++, dims, &rank, &data));
  if (d->in_blocked ? rank != 5 || dims[1] != (d->cin + 3) / 4 || dims[4] != 4 : rank != 4 || dims[1] != d->cin)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: qconv: the input is not N x C x H x W (blocked: N x C/4 x H x W x 4) "
                                      "with the C it was built for");
  if ((d->in_blocked || d->out_blocked) && (d->group != 1 || d->depthwise || (d->in_blocked && d->cin == 1)))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: qconv: a blocked layout needs a one-group convolution; rebuild it");
  j.x = (const uint8_t *)data;
  j.n = dims[0];
  j.h = dims[2];
  j.w = dims[3];
  CHECK(glue_input(ctx, in++, other, &other_rank, &data));
  j.za = *(const uint8_t *)data; /* the zero point's byte, as the input's bytes are stored */
  uint8_t packed_za = d->flip ? (uint8_t)(j.za ^ 0x80u) : j.za;
  j.proto.azp = d->packed_signed ? (int64_t)(int8_t)packed_za : (int64_t)packed_za;
  CHECK(glue_input(ctx, in++, other, &other_rank, &data));
  j.proto.w = (const int8_t *)data;
  CHECK(glue_input(ctx, in++, other, &other_rank, &data));
  j.proto.vsum = (const int32_t *)data;
  if (d->depthwise) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.dw_w = (const int32_t *)data;
  }
  if (d->has_asum) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.dvec = (const int32_t *)data;
  }
  if (d->has_fix) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.fix_offsets = (const int32_t *)data;
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.fix_entries = (const int32_t *)data;
    in += 2; /* the fallback's ScatterND tables */
  }
  if (d->mode == 0 && d->int_bias) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.bias = (const int32_t *)data;
  }
  if (d->mode == 1) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.bias = (const int32_t *)data;
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.scale = (const float *)data;
    if (d->bias_rest) {
      CHECK(glue_input(ctx, in++, other, &other_rank, &data));
      j.proto.bias_rest = (const float *)data;
    }
    if (d->lut) {
      CHECK(glue_input(ctx, in++, other, &other_rank, &data));
      j.proto.lut = (const uint8_t *)data;
    }
  }
  j.oh = (j.h + d->pt + d->pb - (d->dh * (d->kh - 1) + 1)) / d->sh + 1;
  j.ow = (j.w + d->pl + d->pr - (d->dw * (d->kw - 1) + 1)) / d->sw + 1;
  if (j.oh < 1 || j.ow < 1) return fail(ORT_INVALID_ARGUMENT, "onnxopt: qconv: the input is smaller than the kernel");
  j.pixels = j.oh * j.ow;
  j.ostep = d->out_blocked ? 4 : 1;
  j.out_elems_per_image = d->out_blocked ? (d->cout + 3) / 4 * 4 * j.pixels : d->cout * j.pixels;
  for (int e = 0; e < d->n_extra; e++) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.extra[e] = (const float *)data;
    int64_t count = 1;
    for (size_t i = 0; i < other_rank; i++) count *= other[i];
    int kind = d->extra_kind[e];
    int64_t whole = kind == 0 ? j.n * j.out_elems_per_image : j.n * d->cout;
    if (kind != 3 && (count == 0 || whole % count))
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: qconv: an epilogue input does not broadcast over the output");
    j.proto.extra_count[e] = count;
  }
  int64_t odims[5] = {j.n, d->out_blocked ? (d->cout + 3) / 4 : d->cout, j.oh, j.ow, 4};
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *out;
    CHECK(API(KernelContext_GetOutput)(ctx, o, odims, d->out_blocked ? 5 : 4, &out));
    CHECK(API(GetTensorMutableData)(out, &j.proto.out[o]));
  }
  if (j.n == 0 || d->cout == 0) return NULL;
  j.cin_g = d->cin / d->group;
  j.cout_g = d->cout / d->group;
  j.cin4 = (j.cin_g + 3) / 4 * 4;
  j.proto.k4q = d->k4 / 4;
  j.proto.ohw = j.pixels * j.ostep;
  OrtStatus *st = NULL;
  if (d->depthwise) return qc_depthwise(&j, ctx);
  if (d->implicit) {
    j.hp = j.h + d->pt + d->pb;
    j.wp = j.w + d->pl + d->pr;
    j.ppr = (j.ow + QC_PANEL - 1) / QC_PANEL;
    j.panels = j.n * j.oh * j.ppr;
    j.proto.taps = d->kh * d->kw;
    j.proto.plane4 = j.hp * j.wp * 4;
    j.proto.cin4q = j.cin4 / 4;
    /* + 64: a partial panel's last loads pass its row's end */
    j.grouped = (uint8_t *)glue_bytes((size_t)(j.n * (j.cin4 / 4) * j.proto.plane4 + 64));
    if (!j.grouped) return fail(ORT_FAIL, "onnxopt: qconv: out of memory");
    memset(j.grouped + j.n * (j.cin4 / 4) * j.proto.plane4, 0, 64);
    if ((st = qc_per_channel_group(&j, ctx, qc_relayout_task))) goto done;
  } else {
    j.ppi = (j.pixels + QC_PANEL - 1) / QC_PANEL;
    j.panels = j.n * j.ppi;
    j.packed = (uint8_t *)glue_bytes((size_t)(d->group * j.panels * d->k4 * QC_PANEL));
    j.asum = d->has_asum ? (int32_t *)glue_bytes((size_t)(d->group * j.panels * QC_PANEL) * sizeof(int32_t)) : NULL;
    if (!j.packed || (d->has_asum && !j.asum)) {
      st = fail(ORT_FAIL, "onnxopt: qconv: out of memory");
      goto done;
    }
    /* Several taps gather each input byte several times: from NCHW that is 4 channel planes interleaved byte by
       byte per tap; laid out blocked once, a tap copies one word per pixel. Not for a 1x1 of stride 2, which would
       lay out four times the pixels it reads (docs/decisions.md). */
    if (!d->in_blocked && d->group == 1 && j.cin_g > 1 && d->kh * d->kw > 1) {
      j.blocked = (uint8_t *)glue_bytes((size_t)(j.n * (j.cin4 / 4) * j.h * j.w * 4));
      if (!j.blocked) {
        st = fail(ORT_FAIL, "onnxopt: qconv: out of memory");
        goto done;
      }
      if ((st = qc_per_channel_group(&j, ctx, qc_block_input_task))) goto done;
      j.x = j.blocked;
      j.x_blocked = 1;
    }
    j.pack_tasks = d->group * j.panels < d->tasks ? d->group * j.panels : d->tasks;
    if (j.pack_tasks > 1)
      st = API(KernelContext_ParallelFor)(ctx, qc_pack_task, (size_t)j.pack_tasks, 0, &j);
    else
      qc_pack_task(&j, 0);
    if (st) goto done;
  }
  j.amx = d->amx_groups > 0 && amx_ok(AMX_INT8);
  j.block = j.amx ? 16 * (int64_t)d->amx_groups : d->mr;
  j.bpg = (j.cout_g + j.block - 1) / j.block;
  j.mblocks = d->group * j.bpg;
  qc_plan(&j);
  int64_t tasks = j.ptasks * j.mtasks;
  if (tasks == 1)
    qc_gemm_task(&j, 0);
  else
    st = API(KernelContext_ParallelFor)(ctx, qc_gemm_task, (size_t)tasks, 0, &j);
done:
  glue_release(j.grouped);
  glue_release(j.blocked);
  glue_release(j.packed);
  glue_release(j.asum);
  return st;
}
