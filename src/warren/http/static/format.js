// Formatting numbers, rates and sizes for display.

export function num(v) {
  if (v === undefined || v === null || v === "") return "";
  return typeof v === "number" ? v.toLocaleString("en") : String(v);
}

const COMPACT = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });

/** 1200 -> "1.2K": chart axes. */
export function compact(v) {
  return COMPACT.format(Number(v) || 0);
}

export function rate(v) {
  const n = Number(v) || 0;
  return `${n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2)}/s`;
}

/** message_stats.<key>_details.rate, 0 when missing. */
export function statRate(obj, key) {
  return Number(obj?.message_stats?.[`${key}_details`]?.rate) || 0;
}

export function bytes(v) {
  if (v === undefined || v === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = Number(v);
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function yesno(v) {
  return v ? "yes" : "no";
}

/** A compact rendering of an arguments table or any JSON value. */
export function args(v) {
  if (!v || (typeof v === "object" && !Object.keys(v).length)) return "";
  if (typeof v !== "object") return String(v);
  return Object.entries(v)
    .map(([k, x]) => `${k}: ${typeof x === "object" ? JSON.stringify(x) : x}`)
    .join(", ");
}

export function tags(v) {
  if (Array.isArray(v)) return v.join(", ");
  return v ? String(v) : "";
}

/** Queue/exchange feature letters: D durable, AD auto-delete, Excl exclusive, I internal. */
export function features(o) {
  const f = [];
  if (o.durable) f.push("D");
  if (o.auto_delete) f.push("AD");
  if (o.exclusive) f.push("Excl");
  if (o.internal) f.push("I");
  return f.join(" ");
}

export function vhostLabel(v) {
  return v === "/" ? "/" : v;
}

/**
 * A URI (or a list of them) without its password: "amqp://u:secret@h/v" ->
 * "amqp://u@h/v". Runtime parameters keep the URIs as given.
 */
export function redactUri(uri) {
  if (Array.isArray(uri)) return uri.map(redactUri).join(", ");
  if (uri === undefined || uri === null) return "";
  // The authority's userinfo runs to its last "@" (an "@" in a password is %40).
  return String(uri).replace(
    /^([a-z][a-z0-9+.-]*:\/\/)([^/?#]*)@/i,
    (m, scheme, info) => `${scheme}${info.split(":")[0]}@`,
  );
}
