/* kiln report's plot primitives: inline SVG line and stacked-area plots
 * with axes, "nice" ticks (1, 2, 5 x 10^k), grid, legend and tooltips. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "report.h"

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

const char *rp_color(int i) { return palette[(unsigned)i % (sizeof palette / sizeof palette[0])]; }

void rp_html_escape(kiln_strbuf *out, const char *s) {
    for (const char *p = s ? s : ""; *p; p++) {
        switch (*p) {
        case '&':
            kiln_strbuf_printf(out, "&amp;");
            break;
        case '<':
            kiln_strbuf_printf(out, "&lt;");
            break;
        case '>':
            kiln_strbuf_printf(out, "&gt;");
            break;
        case '"':
            kiln_strbuf_printf(out, "&quot;");
            break;
        case '\'':
            kiln_strbuf_printf(out, "&#39;");
            break;
        default:
            /* Control characters would make the XML of the SVG invalid. */
            if ((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t')
                kiln_strbuf_printf(out, "?");
            else
                kiln_strbuf_printf(out, "%c", *p);
        }
    }
}

void rp_format_number(double v, char *buf, size_t n) {
    double a = fabs(v);
    if (!isfinite(v))
        snprintf(buf, n, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    else if (a >= 1e9)
        snprintf(buf, n, "%.3g", v);
    else if (a >= 1e4 || (a >= 1 && v == floor(v)))
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "%.4g", v);
}

void rp_format_bytes(double v, char *buf, size_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && fabs(v) >= 1024) v /= 1024, u++;
    if (!isfinite(v) || fabs(v) >= 1e6) /* beyond a petabyte: no 300-digit figure */
        snprintf(buf, n, "%.3g %s", v, units[u]);
    else if (u == 0)
        snprintf(buf, n, "%.0f B", v);
    else
        snprintf(buf, n, "%.1f %s", v, units[u]);
}

/* ---- Axes ------------------------------------------------------------------------ */

typedef struct frame {
    double w, h, left, right, top, bottom; /* the SVG and the plot area's margins */
    double x0, x1, y0, y1;                 /* data ranges */
} frame;

/* Values beyond this are left out of plots: ranges stay finite. */
static bool plottable(double v) { return isfinite(v) && fabs(v) <= 1e300; }

static double px(const frame *f, double x) {
    double span = f->x1 > f->x0 ? f->x1 - f->x0 : 1;
    return f->left + (x - f->x0) / span * (f->w - f->left - f->right);
}
static double py(const frame *f, double y) {
    double span = f->y1 > f->y0 ? f->y1 - f->y0 : 1;
    return f->h - f->bottom - (y - f->y0) / span * (f->h - f->top - f->bottom);
}

static double nice_step(double range, int target, bool integer) {
    double raw = range / target;
    if (!(raw > 0) || !isfinite(raw)) return 1;
    double mag = pow(10, floor(log10(raw)));
    double fr = raw / mag;
    double s = (fr < 1.5 ? 1 : fr < 3 ? 2 : fr < 7 ? 5 : 10) * mag;
    return integer && s < 1 ? 1 : s;
}

/* Widen a range that is empty, a point, or not finite, then round it out to
 * whole ticks. */
static void range_fix(double *lo, double *hi, bool integer, bool zero) {
    if (!isfinite(*lo) || !isfinite(*hi)) *lo = 0, *hi = 1;
    if (zero && *lo > 0) *lo = 0;
    if (zero && *hi < 0) *hi = 0;
    if (*hi - *lo <= fmax(fabs(*hi), fabs(*lo)) * 1e-9) { /* a point, or a range below double precision */
        double pad = fmax(fmax(fabs(*hi), fabs(*lo)) * 0.1, integer ? 1 : 1e-9);
        if (*hi == 0 && *lo == 0) pad = 1;
        *lo -= zero && *lo == 0 ? 0 : pad;
        *hi += pad;
    }
    double s = nice_step(*hi - *lo, 5, integer);
    *lo = floor(*lo / s + 1e-9) * s;
    *hi = ceil(*hi / s - 1e-9) * s;
}

static void legend_height(const frame *f, const char *const *names, int n, double *height) {
    double x = f->left, rows = n > 0 ? 1 : 0;
    for (int i = 0; i < n; i++) {
        double wi = 22 + 6.5 * (double)strlen(names[i] ? names[i] : "") + 14;
        if (x + wi > f->w - f->right && x > f->left) x = f->left, rows++;
        x += wi;
    }
    *height = rows * 16;
}

static void draw_legend(kiln_strbuf *o, const frame *f, const char *const *names, const int *colors,
                        const bool *dashed, int n) {
    double x = f->left, y = 34;
    for (int i = 0; i < n; i++) {
        double wi = 22 + 6.5 * (double)strlen(names[i] ? names[i] : "") + 14;
        if (x + wi > f->w - f->right && x > f->left) x = f->left, y += 16;
        kiln_strbuf_printf(
            o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"%s/>",
            x, y - 4, x + 16, y - 4, rp_color(colors[i]),
            dashed && dashed[i] ? " stroke-dasharray=\"5 3\"" : "");
        kiln_strbuf_printf(o, "<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">", x + 22, y);
        rp_html_escape(o, names[i]);
        kiln_strbuf_printf(o, "</text>");
        x += wi;
    }
}

static void draw_axes(kiln_strbuf *o, const frame *f, const rp_plot *p) {
    char t[64];
    double sx = nice_step(f->x1 - f->x0, 6, p->x_integer), sy = nice_step(f->y1 - f->y0, 5, false);
    kiln_strbuf_printf(o, "<g class=\"axes\">");
    /* Counted loops: a step below the values' precision cannot spin. */
    for (int k = 0; k <= 40 && f->y0 + k * sy <= f->y1 + sy * 1e-6; k++) {
        double y = f->y0 + k * sy, yy = py(f, y);
        rp_format_number(fabs(y) < sy * 1e-9 ? 0 : y, t, sizeof t);
        kiln_strbuf_printf(o, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>",
                           f->left, yy, f->w - f->right, yy);
        kiln_strbuf_printf(o, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
                           f->left - 6, yy + 4, t);
    }
    double x_first = ceil(f->x0 / sx - 1e-9) * sx;
    for (int k = 0; k <= 40 && x_first + k * sx <= f->x1 + sx * 1e-6; k++) {
        double x = x_first + k * sx, xx = px(f, x);
        rp_format_number(fabs(x) < sx * 1e-9 ? 0 : x, t, sizeof t);
        kiln_strbuf_printf(o, "<line class=\"tickmark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>",
                           xx, f->h - f->bottom, xx, f->h - f->bottom + 5);
        kiln_strbuf_printf(o, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
                           xx, f->h - f->bottom + 18, t);
    }
    kiln_strbuf_printf(o, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", f->left,
                       f->h - f->bottom, f->w - f->right, f->h - f->bottom);
    kiln_strbuf_printf(o, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", f->left,
                       f->top, f->left, f->h - f->bottom);
    kiln_strbuf_printf(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                       (f->left + f->w - f->right) / 2, f->h - 8);
    rp_html_escape(o, p->xlabel);
    kiln_strbuf_printf(o,
                       "</text><text class=\"label\" transform=\"translate(13 %.1f) rotate(-90)\" "
                       "text-anchor=\"middle\">",
                       (f->top + f->h - f->bottom) / 2);
    rp_html_escape(o, p->ylabel);
    kiln_strbuf_printf(o, "</text></g>");
}

static void open_svg(kiln_strbuf *o, const frame *f, const rp_plot *p, const char *cls) {
    kiln_strbuf_printf(o,
                       "<svg class=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" "
                       "width=\"%.0f\" height=\"%.0f\" role=\"img\" aria-label=\"",
                       cls, f->w, f->h, f->w, f->h);
    rp_html_escape(o, p->title);
    kiln_strbuf_printf(o, "\"><title>");
    rp_html_escape(o, p->title);
    kiln_strbuf_printf(o, "</title><text class=\"title\" x=\"%.1f\" y=\"18\">", f->left);
    rp_html_escape(o, p->title);
    kiln_strbuf_printf(o, "</text>");
}

static void draw_mark(kiln_strbuf *o, const frame *f, const rp_plot *p) {
    if (!p->mark || !(p->mark_x >= f->x0 && p->mark_x <= f->x1)) return;
    double xx = px(f, p->mark_x);
    kiln_strbuf_printf(o, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", xx,
                       f->top, xx, f->h - f->bottom);
    bool right = xx > (f->left + f->w - f->right) / 2;
    kiln_strbuf_printf(o, "<text class=\"marklabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">",
                       right ? xx - 4 : xx + 4, f->top + 12, right ? "end" : "start");
    rp_html_escape(o, p->mark_label);
    kiln_strbuf_printf(o, "</text>");
}

/* ---- Line plots ------------------------------------------------------------------- */

void rp_line_plot(kiln_strbuf *o, const rp_plot *p) {
    frame f = {.w = 480, .h = 300, .left = 70, .right = 18, .top = 44, .bottom = 46};
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    const char *names[16] = {0};
    int colors[16] = {0}, n_leg = 0;
    bool dashed[16] = {0};
    for (int s = 0; s < p->n_series; s++) {
        const rp_series *r = &p->series[s];
        for (size_t i = 0; i < r->n; i++) {
            if (!plottable(r->x[i]) || !plottable(r->y[i])) continue;
            x0 = fmin(x0, r->x[i]), x1 = fmax(x1, r->x[i]);
            y0 = fmin(y0, r->y[i]), y1 = fmax(y1, r->y[i]);
        }
        if (r->n && n_leg < 16) names[n_leg] = r->name, colors[n_leg] = s, dashed[n_leg] = r->dashed, n_leg++;
    }
    range_fix(&x0, &x1, p->x_integer, false);
    range_fix(&y0, &y1, false, p->y_from_zero);
    f.x0 = x0, f.x1 = x1, f.y0 = y0, f.y1 = y1;
    double lh;
    legend_height(&f, names, n_leg, &lh);
    f.top = 28 + lh + 6;
    open_svg(o, &f, p, "plot");
    draw_legend(o, &f, names, colors, dashed, n_leg);
    draw_axes(o, &f, p);
    for (int s = 0; s < p->n_series; s++) {
        const rp_series *r = &p->series[s];
        size_t finite = 0;
        for (size_t i = 0; i < r->n; i++) finite += plottable(r->x[i]) && plottable(r->y[i]);
        if (!finite) continue;
        const char *c = rp_color(s);
        if (finite > 1) {
            kiln_strbuf_printf(
                o, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", c,
                r->dashed ? " stroke-dasharray=\"6 4\"" : "");
            for (size_t i = 0; i < r->n; i++)
                if (plottable(r->x[i]) && plottable(r->y[i]))
                    kiln_strbuf_printf(o, "%.1f,%.1f ", px(&f, r->x[i]), py(&f, r->y[i]));
            kiln_strbuf_printf(o, "\"/>");
        }
        /* Dots with tooltips when they can be told apart (always for one point). */
        if (finite <= 60) {
            for (size_t i = 0; i < r->n; i++) {
                if (!plottable(r->x[i]) || !plottable(r->y[i])) continue;
                char xs[32], ys[32];
                rp_format_number(r->x[i], xs, sizeof xs);
                rp_format_number(r->y[i], ys, sizeof ys);
                kiln_strbuf_printf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\"><title>",
                                   px(&f, r->x[i]), py(&f, r->y[i]), finite == 1 ? "4" : "2.5", c);
                rp_html_escape(o, r->name);
                kiln_strbuf_printf(o, ": %s at %s</title></circle>", ys, xs);
            }
        }
    }
    draw_mark(o, &f, p);
    kiln_strbuf_printf(o, "</svg>\n");
}

/* ---- Stacked areas ------------------------------------------------------------------ */

void rp_stack_plot(kiln_strbuf *o, const rp_plot *p, const double *x, size_t n, const double *const *layers,
                   const char *const *names, int n_layers) {
    frame f = {.w = 960, .h = 400, .left = 72, .right = 18, .top = 44, .bottom = 46};
    double x0 = INFINITY, x1 = -INFINITY, y1 = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (int k = 0; k < n_layers; k++) sum += layers[k][i];
        x0 = fmin(x0, x[i]), x1 = fmax(x1, x[i]), y1 = fmax(y1, sum);
    }
    for (int s = 0; s < p->n_series; s++)
        for (size_t i = 0; i < p->series[s].n; i++) y1 = fmax(y1, p->series[s].y[i]);
    double y0 = 0;
    range_fix(&x0, &x1, p->x_integer, false);
    range_fix(&y0, &y1, false, true);
    f.x0 = x0, f.x1 = x1, f.y0 = y0, f.y1 = y1;
    const char *leg[32] = {0};
    int colors[32] = {0}, n_leg = 0;
    bool dashed[32] = {0};
    for (int k = 0; k < n_layers && n_leg < 32; k++)
        leg[n_leg] = names[k], colors[n_leg] = k, dashed[n_leg++] = false;
    for (int s = 0; s < p->n_series && n_leg < 32; s++)
        leg[n_leg] = p->series[s].name, colors[n_leg] = n_layers + s, dashed[n_leg++] = p->series[s].dashed;
    double lh;
    legend_height(&f, leg, n_leg, &lh);
    f.top = 28 + lh + 6;
    open_svg(o, &f, p, "plot timeline");
    draw_legend(o, &f, leg, colors, dashed, n_leg);
    draw_axes(o, &f, p);
    /* Each layer: its top edge left to right, then its bottom edge back. */
    for (int k = 0; k < n_layers && n > 0; k++) {
        kiln_strbuf_printf(o, "<path class=\"area\" fill=\"%s\" fill-opacity=\"0.85\" stroke=\"none\" d=\"",
                           rp_color(k));
        for (size_t i = 0; i < n; i++) {
            double top = 0;
            for (int j = 0; j <= k; j++) top += layers[j][i];
            kiln_strbuf_printf(o, "%s%.1f %.1f ", i ? "L" : "M", px(&f, x[i]), py(&f, top));
        }
        for (size_t i = n; i-- > 0;) {
            double bot = 0;
            for (int j = 0; j < k; j++) bot += layers[j][i];
            kiln_strbuf_printf(o, "L%.1f %.1f ", px(&f, x[i]), py(&f, bot));
        }
        kiln_strbuf_printf(o, "Z\"><title>");
        rp_html_escape(o, names[k]);
        kiln_strbuf_printf(o, "</title></path>");
    }
    for (int s = 0; s < p->n_series; s++) {
        const rp_series *r = &p->series[s];
        if (r->n == 0) continue;
        kiln_strbuf_printf(
            o, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
            rp_color(n_layers + s), r->dashed ? " stroke-dasharray=\"6 4\"" : "");
        for (size_t i = 0; i < r->n; i++)
            kiln_strbuf_printf(o, "%.1f,%.1f ", px(&f, r->x[i]), py(&f, r->y[i]));
        kiln_strbuf_printf(o, "\"/>");
    }
    draw_mark(o, &f, p);
    kiln_strbuf_printf(o, "</svg>\n");
}
