// A small inline-SVG line chart: a few series over the last samples.
import { h, s } from "./dom.js";

const W = 560;
const H = 170;
const PAD = { l: 48, r: 8, t: 10, b: 22 };

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

/**
 * id: a name for the chart (data-chart attribute); series: [{key, label, color, dash}];
 * samples: [{t: ms, values: {key: number}}], oldest first; fmt: value -> text;
 * span: the time window drawn, ms; axisFmt: the y axis labels (default fmt).
 */
export function lineChart(id, series, samples, fmt, span, axisFmt = fmt) {
  const now = samples.length ? samples[samples.length - 1].t : Date.now();
  const t0 = now - span;
  let max = 0;
  for (const p of samples) for (const { key } of series) max = Math.max(max, p.values[key] || 0);
  const top = niceMax(max);
  const x = (t) => PAD.l + ((t - t0) / span) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / top) * (H - PAD.t - PAD.b);

  const grid = [0, 0.5, 1].map((f) => [
    s("line", { x1: PAD.l, x2: W - PAD.r, y1: y(top * f), y2: y(top * f), class: "grid" }),
    s("text", { x: PAD.l - 4, y: y(top * f) + 4, "text-anchor": "end" }, axisFmt(top * f)),
  ]);
  const axis = [
    s("text", { x: PAD.l, y: H - 6 }, span >= 60000 ? `-${Math.round(span / 60000)} min` : `-${Math.round(span / 1000)} s`),
    s("text", { x: W - PAD.r, y: H - 6, "text-anchor": "end" }, "now"),
  ];
  const lines = series.map(({ key, color, dash }) => {
    const pts = samples
      .filter((p) => p.t >= t0)
      .map((p) => `${x(p.t).toFixed(1)},${y(p.values[key] || 0).toFixed(1)}`);
    return s("polyline", {
      points: pts.join(" "),
      stroke: color,
      fill: "none",
      "stroke-width": 2,
      "stroke-dasharray": dash ? "6 4" : null,
    });
  });
  const svg = s(
    "svg",
    { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": id, preserveAspectRatio: "none" },
    grid,
    axis,
    lines.reverse(), // the first series on top
  );
  const last = samples.length ? samples[samples.length - 1].values : {};
  const legend = h(
    "ul",
    { class: "legend" },
    series.map(({ key, label, color }) => {
      const peak = Math.max(0, ...samples.map((p) => p.values[key] || 0));
      return h(
        "li",
        { "data-series": key, "data-current": last[key] || 0, "data-peak": peak },
        h("span", { class: "swatch", style: { background: color } }),
        `${label} `,
        h("b", null, fmt(last[key] || 0)),
      );
    }),
  );
  return h("div", { class: "chart", "data-chart": id }, svg, legend);
}
