// Cluster: Warren's own GET /api/cluster (docs/clustering.md): this node, the
// leader, the in-sync replicas and each follower's state and lag; on a single
// node the API answers {"enabled": false}.
import { api } from "../api.js";
import { facts, h, replace, section, table } from "../dom.js";
import { num, yesno } from "../format.js";

const DISABLED = "Clustering is disabled: this broker runs as a single node.";

const list = (v) => (Array.isArray(v) ? v.join(", ") : v ?? "");

/** One line for the overview: "disabled (single node)" or who leads and how many follow. */
export function clusterSummary(c) {
  if (!c || !c.enabled) return "disabled (single node)";
  const parts = [`node ${c.node} (${c.role})`];
  if (c.leader?.id && c.leader.id !== c.node) parts.push(`leader ${c.leader.id}`);
  if (Array.isArray(c.in_sync_replicas)) parts.push(`${c.in_sync_replicas.length} in sync`);
  if (Array.isArray(c.followers)) parts.push(`${c.followers.length} follower${c.followers.length === 1 ? "" : "s"} connected`);
  return parts.join(", ");
}

function followers(c) {
  if (!Array.isArray(c.followers)) {
    return h("p", { class: "empty" }, "Only the leader lists its followers.");
  }
  return table(
    [
      ["Node", (f) => f.node],
      ["Address", (f) => f.address ?? ""],
      ["State", (f) => h("span", { "data-field": "state" }, f.state)],
      ["Position on disk", (f) => num(f.acked_position)],
      ["Lag (actions)", (f) => h("span", { "data-field": "lag" }, f.lag_actions == null ? "unknown" : num(f.lag_actions))],
      ["In sync", (f) => h("span", { "data-field": "in_sync" }, yesno(f.in_sync))],
      ["Stream reads", (f) => h("span", { "data-field": "stream_reads" }, f.stream_reads ?? "none")],
      ["Stream protocol reads", (f) => h("span", { "data-field": "stream_protocol_reads" }, f.stream_protocol_reads ?? "none")],
    ],
    c.followers,
    { empty: "No follower is connected.", rowAttrs: (f) => ({ "data-follower": f.node }) },
  );
}

function render(c) {
  if (!c || !c.enabled) {
    return h(
      "div",
      { id: "cluster-disabled" },
      h("p", { class: "notice" }, DISABLED),
      h(
        "p",
        { class: "hint" },
        "Three or more nodes with [clustering] enabled = true and an etcd keep serving " +
          "when one of them dies (docs/clustering.md).",
      ),
    );
  }
  const leader = c.leader || {};
  return [
    section(
      "This node",
      facts([
        ["Node", c.node],
        ["Role", h("span", { "data-field": "role" }, c.role)],
        ["Replication position", num(c.position ?? "")],
        ["etcd", list(c.etcd_endpoints)],
        ["etcd prefix", c.etcd_prefix ?? ""],
      ]),
    ),
    section(
      "Leader",
      facts([
        ["Node", h("span", { "data-field": "leader" }, leader.id ?? "none")],
        leader.amqp ? ["AMQP", leader.amqp] : null,
        leader.http ? ["HTTP", leader.http] : null,
        leader.mqtt ? ["MQTT", leader.mqtt] : null,
        leader.replication ? ["Replication", leader.replication] : null,
        Array.isArray(c.in_sync_replicas)
          ? ["In-sync replicas", h("span", { "data-field": "isr" }, list(c.in_sync_replicas))]
          : null,
      ]),
    ),
    section("Followers", followers(c)),
  ];
}

export async function cluster(ctx) {
  const body = h("div", { id: "cluster-body" });
  await ctx.poll(async () => {
    replace(body, render(await api("GET", "/cluster")));
  });
  return h("div", { class: "page" }, h("h1", null, "Cluster"), body);
}
