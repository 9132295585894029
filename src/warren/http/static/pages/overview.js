// Overview: object totals, queued messages and message rates. A sampler polls
// /api/overview every 5 s from login on, on every page, so the charts have a
// history (and catch a short burst of traffic) when the overview is opened.
import { api, hasTag, loggedIn } from "../api.js";
import { lineChart } from "../chart.js";
import { facts, h, replace, section, table } from "../dom.js";
import { compact, num, rate, statRate } from "../format.js";
import { clusterSummary } from "./cluster.js";

const SPAN = 10 * 60 * 1000; // the charts show up to the last ten minutes
const MIN_SPAN = 60 * 1000; // and at least one
const samples = []; // kept across page changes while the app is open

const RATE_SERIES = [
  { key: "publish", label: "Publish", color: "#2d7dd2" },
  { key: "deliver_get", label: "Deliver / get", color: "#3bb273" },
  { key: "ack", label: "Ack", color: "#e1bc29" },
];
const QUEUED_SERIES = [
  { key: "messages", label: "Total", color: "#7768ae", dash: true },
  { key: "messages_ready", label: "Ready", color: "#2d7dd2" },
  { key: "messages_unacknowledged", label: "Unacked", color: "#e15554" },
];

function record(o) {
  const q = o.queue_totals || {};
  const t = Date.now();
  samples.push({
    t,
    values: {
      publish: statRate(o, "publish"),
      deliver_get: statRate(o, "deliver_get"),
      ack: statRate(o, "ack"),
      messages: Number(q.messages) || 0,
      messages_ready: Number(q.messages_ready) || 0,
      messages_unacknowledged: Number(q.messages_unacknowledged) || 0,
    },
  });
  while (samples.length && samples[0].t < t - SPAN) samples.shift();
}

function card(key, label, value) {
  return h("div", { class: "card", "data-total": key }, h("span", null, label), h("b", null, num(value)));
}

/** clustering: the cluster summary line (kept across renders), or null to leave it out. */
function render(o, clustering) {
  const totals = o.object_totals || {};
  const q = o.queue_totals || {};
  const cards = h(
    "div",
    { class: "cards" },
    card("connections", "Connections", totals.connections ?? 0),
    card("channels", "Channels", totals.channels ?? 0),
    card("exchanges", "Exchanges", totals.exchanges ?? 0),
    card("queues", "Queues", totals.queues ?? 0),
    card("consumers", "Consumers", totals.consumers ?? 0),
    card("messages_ready", "Ready", q.messages_ready ?? 0),
    card("messages_unacknowledged", "Unacked", q.messages_unacknowledged ?? 0),
  );
  // The window grows with the history, up to SPAN, so a new session's charts fill their width.
  const span = Math.min(SPAN, Math.max(MIN_SPAN, samples.length ? samples.at(-1).t - samples[0].t : 0));
  const stats = o.message_stats || {};
  const hasRates = Object.keys(stats).some((k) => k.endsWith("_details"));
  const charts = h(
    "div",
    { class: "charts" },
    section("Queued messages", lineChart("queued", QUEUED_SERIES, samples, num, span, compact)),
    section(
      "Message rates",
      lineChart("rates", RATE_SERIES, samples, rate, span),
      hasRates ? null : h("p", { class: "empty", id: "no-rates" }, "The server reports no message rates (yet)."),
    ),
  );
  const listeners = o.listeners || [];
  const node = section(
    "Node",
    facts([
      ["Product", `${o.product_name || "?"} ${o.product_version || ""}`],
      ["Node", o.node || ""],
      ["Cluster", o.cluster_name || ""],
      clustering ? ["Clustering", clustering] : null,
      o.management_version ? ["Management API", o.management_version] : null,
    ]),
    table(
      [
        ["Protocol", (l) => l.protocol],
        ["Bound to", (l) => l.ip_address],
        ["Port", (l) => String(l.port)],
      ],
      listeners,
      { empty: "No listeners reported." },
    ),
  );
  return [cards, charts, node];
}

const PERIOD = 5000;
const subscribers = new Set();
let timer = null;
let lastError = null;

/** Polls the overview now, records a sample and tells the page. */
async function refresh() {
  try {
    const o = await api("GET", "/overview");
    lastError = null;
    record(o);
    for (const fn of subscribers) fn(o, null);
    return o;
  } catch (e) {
    lastError = e;
    for (const fn of subscribers) fn(null, e);
    return null;
  }
}

/** Starts the 5 s sampler (once) while logged in. */
export function startSampler() {
  if (timer !== null) return;
  const tick = async () => {
    if (!loggedIn()) {
      timer = null;
      return;
    }
    await refresh();
    timer = setTimeout(tick, PERIOD);
  };
  timer = setTimeout(tick, PERIOD);
}

/** Stops it and forgets the history (logout). */
export function stopSampler() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  samples.length = 0;
}

/**
 * Warren's GET /api/cluster (monitoring users and administrators) summed up in
 * the node's facts; not asked of other APIs (a RabbitMQ has no such path).
 */
function clusterLine(o, line) {
  if (o.product_name !== "Warren" || !hasTag("administrator", "monitoring")) return null;
  api("GET", "/cluster")
    .then((c) => replace(line, clusterSummary(c)))
    .catch(() => replace(line, "unknown"));
  return line;
}

export async function overview(ctx) {
  const body = h("div", { id: "overview-body" });
  const page = h("div", { class: "page overview" }, h("h1", null, "Overview"), body);
  const line = h("a", { href: "#/cluster", id: "cluster-summary" });
  const show = (o, error) => {
    if (!ctx.alive()) {
      subscribers.delete(show);
      return;
    }
    if (o) replace(body, render(o, clusterLine(o, line)));
    else if (error) ctx.fail(error);
  };
  subscribers.add(show);
  const o = await refresh();
  if (!o && lastError) throw lastError;
  return page;
}
