// Admin: users, virtual hosts, permissions, policies, definitions.
import { api, seg } from "../api.js";
import { field, h, replace, section, select, table } from "../dom.js";
import { args, num, tags } from "../format.js";
import { vhostSelect } from "./queues.js";

/** A button that asks, then DELETEs path, flashes done and reloads. */
export function deleteButton(ctx, label, question, path, done, reload) {
  return h(
    "button",
    {
      type: "button",
      class: "small danger",
      onclick: async () => {
        if (!window.confirm(question)) return;
        const r = await ctx.act(() => api("DELETE", path), done);
        if (r !== undefined) reload();
      },
    },
    label,
  );
}

/** Hooks fn to a form's submit: ok is flashed, after(result) runs on success. */
export function submitting(form, ctx, fn, ok, after) {
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await ctx.act(fn, ok);
    if (r !== undefined && after) after(r);
  });
  return form;
}

export async function users(ctx) {
  const body = h("div");
  const load = async () => {
    const list = await api("GET", "/users");
    replace(
      body,
      table(
        [
          ["Name", (u) => u.name],
          ["Tags", (u) => tags(u.tags)],
          ["Can log in with password", (u) => (u.password_hash ? "yes" : "no")],
          ["", (u) => deleteButton(ctx, "Delete", `Delete user ${u.name}?`, `/users/${seg(u.name)}`, `User ${u.name} deleted.`, load)],
        ],
        list,
        { empty: "No users.", rowAttrs: (u) => ({ "data-user": u.name }) },
      ),
    );
  };
  await ctx.poll(load);
  const name = h("input", { name: "username", required: true, autocomplete: "off" });
  const password = h("input", { name: "new_password", type: "password", autocomplete: "new-password" });
  const tagInput = h("input", { name: "tags", placeholder: "administrator, monitoring, management" });
  const form = submitting(
    h(
      "form",
      { id: "add-user" },
      field("Username", name),
      field("Password", password, "Leave empty to keep the password of an existing user."),
      field("Tags", tagInput, "Comma separated"),
      h("button", { type: "submit" }, "Add / update user"),
    ),
    ctx,
    async () => {
      const body = { tags: tagInput.value.split(",").map((t) => t.trim()).filter(Boolean).join(",") };
      if (password.value) {
        body.password = password.value;
      } else {
        // RabbitMQ drops the password of a user PUT without one: send the current hash back.
        // (Looked up in the list: a 404 would be a console error.)
        const current = (await api("GET", "/users")).find((u) => u.name === name.value);
        if (!current) throw new Error("A new user needs a password.");
        body.password_hash = current.password_hash ?? "";
        if (current.hashing_algorithm) body.hashing_algorithm = current.hashing_algorithm;
      }
      return api("PUT", `/users/${seg(name.value)}`, body);
    },
    "User saved.",
    () => {
      password.value = "";
      load();
    },
  );
  return h("div", { class: "page" }, h("h1", null, "Users"), body, section("Add or update a user", form));
}

export async function vhosts(ctx) {
  const body = h("div");
  const load = async () => {
    const list = await api("GET", "/vhosts");
    replace(
      body,
      table(
        [
          ["Name", (v) => v.name],
          ["Description", (v) => v.description || ""],
          ["Messages", (v) => num(v.messages ?? 0)],
          ["Tracing", (v) => (v.tracing ? "on" : "off")],
          ["", (v) => deleteButton(ctx, "Delete", `Delete virtual host ${v.name} and everything in it?`, `/vhosts/${seg(v.name)}`, `Virtual host ${v.name} deleted.`, load)],
        ],
        list,
        { empty: "No virtual hosts.", rowAttrs: (v) => ({ "data-vhost": v.name }) },
      ),
    );
  };
  await ctx.poll(load);
  const name = h("input", { name: "vhost_name", required: true });
  const description = h("input", { name: "description" });
  const form = submitting(
    h("form", { id: "add-vhost" }, field("Name", name), field("Description", description), h("button", { type: "submit" }, "Add virtual host")),
    ctx,
    () => api("PUT", `/vhosts/${seg(name.value)}`, { description: description.value }),
    "Virtual host added.",
    () => {
      name.value = "";
      description.value = "";
      load();
    },
  );
  return h("div", { class: "page" }, h("h1", null, "Virtual hosts"), body, section("Add a virtual host", form));
}

export async function permissions(ctx) {
  const body = h("div");
  const load = async () => {
    const list = await api("GET", "/permissions");
    replace(
      body,
      table(
        [
          ["User", (p) => p.user],
          ["Virtual host", (p) => p.vhost],
          ["Configure", (p) => p.configure],
          ["Write", (p) => p.write],
          ["Read", (p) => p.read],
          ["", (p) => deleteButton(ctx, "Clear", `Clear the permissions of ${p.user} on ${p.vhost}?`, `/permissions/${seg(p.vhost)}/${seg(p.user)}`, "Permissions cleared.", load)],
        ],
        list,
        { empty: "No permissions." },
      ),
    );
  };
  await ctx.poll(load);
  let userNames = [];
  try {
    userNames = (await api("GET", "/users")).map((u) => u.name);
  } catch (e) {
    ctx.fail(e);
  }
  const user = select("user", userNames);
  const vhost = await vhostSelect();
  const configure = h("input", { name: "configure", value: ".*" });
  const write = h("input", { name: "write", value: ".*" });
  const read = h("input", { name: "read", value: ".*" });
  const form = submitting(
    h(
      "form",
      { id: "set-permission" },
      field("User", user),
      field("Virtual host", vhost),
      field("Configure regexp", configure),
      field("Write regexp", write),
      field("Read regexp", read),
      h("button", { type: "submit" }, "Set permission"),
    ),
    ctx,
    () =>
      api("PUT", `/permissions/${seg(vhost.value)}/${seg(user.value)}`, {
        configure: configure.value,
        write: write.value,
        read: read.value,
      }),
    "Permission set.",
    load,
  );
  return h("div", { class: "page" }, h("h1", null, "Permissions"), body, section("Set a permission", form));
}

export async function policies(ctx) {
  const body = h("div");
  const load = async () => {
    const list = await api("GET", "/policies");
    replace(
      body,
      table(
        [
          ["Virtual host", (p) => p.vhost],
          ["Name", (p) => p.name],
          ["Pattern", (p) => p.pattern],
          ["Apply to", (p) => p["apply-to"]],
          ["Definition", (p) => args(p.definition)],
          ["Priority", (p) => num(p.priority)],
          ["", (p) => deleteButton(ctx, "Delete", `Delete policy ${p.name}?`, `/policies/${seg(p.vhost)}/${seg(p.name)}`, `Policy ${p.name} deleted.`, load)],
        ],
        list,
        { empty: "No policies." },
      ),
    );
  };
  await ctx.poll(load);
  const vhost = await vhostSelect();
  const name = h("input", { name: "policy_name", required: true });
  const pattern = h("input", { name: "pattern", required: true, placeholder: "^amq\\." });
  const applyTo = select("apply-to", [
    ["all", "Exchanges and queues"],
    ["queues", "Queues"],
    ["exchanges", "Exchanges"],
    ["classic_queues", "Classic queues"],
    ["quorum_queues", "Quorum queues"],
    ["streams", "Streams"],
  ]);
  const priority = h("input", { name: "priority", type: "number", value: "0" });
  const definition = h("textarea", { name: "definition", rows: 3, cols: 50, placeholder: '{"max-length": 1000}' });
  const form = submitting(
    h(
      "form",
      { id: "add-policy" },
      field("Virtual host", vhost),
      field("Name", name),
      field("Pattern", pattern),
      field("Apply to", applyTo),
      field("Priority", priority),
      field("Definition (JSON object)", definition),
      h("button", { type: "submit" }, "Add / update policy"),
    ),
    ctx,
    () => {
      let def;
      try {
        def = JSON.parse(definition.value || "{}");
      } catch {
        throw new Error("The definition is not valid JSON.");
      }
      return api("PUT", `/policies/${seg(vhost.value)}/${seg(name.value)}`, {
        pattern: pattern.value,
        "apply-to": applyTo.value,
        priority: Number(priority.value) || 0,
        definition: def,
      });
    },
    "Policy saved.",
    load,
  );
  return h("div", { class: "page" }, h("h1", null, "Policies"), body, section("Add or update a policy", form));
}

export async function definitions(ctx) {
  const download = h(
    "button",
    {
      type: "button",
      id: "download-definitions",
      onclick: async () => {
        const defs = await ctx.act(() => api("GET", "/definitions"));
        if (defs === undefined) return;
        const blob = new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" });
        const url = URL.createObjectURL(blob);
        const stamp = new Date().toISOString().slice(0, 10);
        const a = h("a", { href: url, download: `warren-definitions-${stamp}.json` });
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 1000);
      },
    },
    "Download broker definitions",
  );
  const file = h("input", { type: "file", name: "file", accept: ".json,application/json", required: true });
  const form = submitting(
    h("form", { id: "upload-definitions" }, field("Definitions file", file), h("button", { type: "submit" }, "Upload definitions")),
    ctx,
    async () => {
      const f = file.files[0];
      if (!f) throw new Error("Choose a file first.");
      const text = await f.text();
      try {
        JSON.parse(text);
      } catch {
        throw new Error(`${f.name} is not valid JSON.`);
      }
      return api("POST", "/definitions", text);
    },
    "Definitions imported.",
  );
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Definitions"),
    section("Export", h("p", null, "Users, virtual hosts, permissions, policies, exchanges, queues and bindings as JSON."), download),
    section("Import", h("p", null, "Adds to the broker the objects of a definitions file (RabbitMQ format)."), form),
  );
}
