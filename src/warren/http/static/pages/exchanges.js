// Exchanges: list + add, detail with bindings, publishing and deletion.
import { api, exchangePath, seg } from "../api.js";
import { facts, field, filterBox, h, replace, section, select, table } from "../dom.js";
import { args, features, rate, statRate } from "../format.js";
import { argsEditor, bindingForm, bindingsTable, publishForm } from "../forms.js";
import { vhostSelect } from "./queues.js";

const exLink = (e) =>
  h("a", { href: `#/exchanges/${seg(e.vhost)}/${seg(e.name)}` }, e.name || "(AMQP default)");

export async function exchangeList(ctx) {
  const body = h("div");
  const filter = filterBox();
  let last = [];
  const show = () => {
    const list = last.filter((e) => filter.test(e.name));
    replace(
      body,
      table(
        [
          ["Virtual host", (e) => e.vhost],
          ["Name", exLink],
          ["Type", (e) => e.type],
          ["Features", features],
          ["Arguments", (e) => args(e.arguments)],
          ["Rate in", (e) => rate(statRate(e, "publish_in"))],
          ["Rate out", (e) => rate(statRate(e, "publish_out"))],
        ],
        list,
        { empty: "No exchanges." },
      ),
    );
  };
  const load = async () => {
    last = await api("GET", "/exchanges");
    show();
  };
  filter.onChange(show);
  await ctx.poll(load);
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Exchanges"),
    filter.el,
    body,
    section("Add an exchange", await addExchangeForm(ctx, load)),
  );
}

async function addExchangeForm(ctx, reload) {
  const vhost = await vhostSelect();
  const name = h("input", { name: "name", required: true });
  let types = ["direct", "fanout", "topic", "headers"];
  try {
    const o = await api("GET", "/overview");
    if (o.exchange_types?.length) types = o.exchange_types.map((t) => t.name);
  } catch {
    /* keep the standard four */
  }
  const type = select("exchange_type", types, "direct");
  const durable = select("durable", [
    ["true", "Durable"],
    ["false", "Transient"],
  ]);
  const autoDelete = h("input", { type: "checkbox", name: "auto_delete" });
  const internal = h("input", { type: "checkbox", name: "internal" });
  const xargs = argsEditor("exchange arguments");
  const form = h(
    "form",
    { id: "add-exchange" },
    field("Virtual host", vhost),
    field("Name", name),
    field("Type", type),
    field("Durability", durable),
    field("Auto delete", autoDelete),
    field("Internal", internal),
    field("Arguments", xargs),
    h("button", { type: "submit" }, "Add exchange"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await ctx.act(
      () =>
        api("PUT", exchangePath(vhost.value, name.value), {
          type: type.value,
          durable: durable.value === "true",
          auto_delete: autoDelete.checked,
          internal: internal.checked,
          arguments: xargs.value(),
        }),
      `Exchange ${name.value} added.`,
    );
    if (r !== undefined) {
      name.value = "";
      await reload();
    }
  });
  return form;
}

export async function exchangeDetail(ctx) {
  const { vhost, name } = ctx.params;
  const path = exchangePath(vhost, name);
  const info = h("div");
  const bindings = h("div");
  const load = async () => {
    const [e, src, dst] = await Promise.all([
      api("GET", path),
      api("GET", `${path}/bindings/source`),
      api("GET", `${path}/bindings/destination`),
    ]);
    replace(
      info,
      facts([
        ["Virtual host", e.vhost],
        ["Type", e.type],
        ["Features", features(e)],
        ["Arguments", args(e.arguments)],
        ["Policy", e.policy || ""],
        ["Publish in", rate(statRate(e, "publish_in"))],
        ["Publish out", rate(statRate(e, "publish_out"))],
      ]),
    );
    replace(
      bindings,
      h("h3", null, "This exchange routes to"),
      bindingsTable(ctx, src, load),
      h("h3", null, "Routed to this exchange from"),
      bindingsTable(ctx, dst, load),
    );
  };
  await ctx.poll(load);
  const isDefault = name === "" || name === "amq.default";
  const del = h(
    "button",
    {
      type: "button",
      class: "danger",
      id: "delete-exchange",
      onclick: async () => {
        if (!window.confirm(`Delete exchange ${name}?`)) return;
        const r = await ctx.act(() => api("DELETE", path));
        if (r !== undefined) ctx.go("#/exchanges", `Exchange ${name} deleted.`);
      },
    },
    "Delete this exchange",
  );
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Exchange ", h("code", null, name || "(AMQP default)")),
    section("Details", info),
    section(
      "Bindings",
      bindings,
      isDefault ? null : [h("h3", null, "Add a binding from this exchange"), bindingForm(ctx, { vhost, source: name }, load)],
    ),
    section("Publish a message", publishForm(ctx, vhost, name)),
    isDefault ? null : section("Delete", del),
  );
}
