// The management HTTP API client: the Authorization header (basic-auth
// credentials, or an OAuth 2 access token as Bearer) in sessionStorage, sent on
// every call; a 401 clears it and sends the user back to the login.

const AUTH_KEY = "warren.auth";
const USER_KEY = "warren.user";
const TAGS_KEY = "warren.tags";
// An access token's expiry (ms since the epoch): the login comes back then.
const EXPIRES_KEY = "warren.expires";

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason || `HTTP ${status}`);
    this.status = status;
  }
}

function encodeBasic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

export function loggedIn() {
  return sessionStorage.getItem(AUTH_KEY) !== null;
}

export function currentUser() {
  return sessionStorage.getItem(USER_KEY) || "";
}

/** The logged-in user's tags (whoami), e.g. ["administrator"]. */
export function currentTags() {
  return (sessionStorage.getItem(TAGS_KEY) || "").split(",").filter(Boolean);
}

/** When the session's access token expires (ms since the epoch); null: no token. */
export function expiresAt() {
  const at = Number(sessionStorage.getItem(EXPIRES_KEY));
  return at > 0 ? at : null;
}

/** Logged in with an access token (the provider's logout applies). */
export const tokenLogin = () => (sessionStorage.getItem(AUTH_KEY) || "").startsWith("Bearer ");

export function logout() {
  sessionStorage.removeItem(AUTH_KEY);
  sessionStorage.removeItem(USER_KEY);
  sessionStorage.removeItem(TAGS_KEY);
  sessionStorage.removeItem(EXPIRES_KEY);
}

/** Checks the credentials against /api/whoami and keeps them when they work. */
export async function login(user, password) {
  return check(`Basic ${encodeBasic(user, password)}`, user, "Login failed: wrong user name or password.");
}

/** The same with an access token from the OAuth 2 provider, kept until expires (ms). */
export async function loginWithToken(token, expires) {
  const me = await check(`Bearer ${token}`, "", "Login failed: the broker refused the access token.");
  if (expires) sessionStorage.setItem(EXPIRES_KEY, String(expires));
  return me;
}

async function check(auth, user, refused) {
  const resp = await fetch("/api/whoami", {
    credentials: "omit",
    headers: { Authorization: auth, "X-Requested-With": "XMLHttpRequest" },
  });
  if (resp.status === 401) {
    // "Login failed" (wrong name or password), or why this user may not log in here.
    const reason = await reasonOf(resp);
    throw new ApiError(
      401,
      /^login failed$/i.test(reason) ? refused : `Login failed: ${reason}`,
    );
  }
  if (!resp.ok) throw new ApiError(resp.status, await reasonOf(resp));
  const me = await resp.json();
  sessionStorage.setItem(AUTH_KEY, auth);
  sessionStorage.setItem(USER_KEY, me.name || user);
  const tags = Array.isArray(me.tags) ? me.tags : String(me.tags || "").split(",");
  sessionStorage.setItem(TAGS_KEY, tags.map((x) => x.trim()).filter(Boolean).join(","));
  return me;
}

/** The logged-in user has one of these tags. */
export function hasTag(...wanted) {
  const tags = currentTags();
  return wanted.some((t) => tags.includes(t));
}

const ENTITIES = { "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&amp;": "&" };

/**
 * RabbitMQ (and Warren) HTML-escape a refused parameter's reason
 * (got &lt;&lt;"x"&gt;&gt;); the UI shows reasons as text, so it unescapes them.
 */
function unescapeHtml(text) {
  return text.replace(/&(lt|gt|quot|#39|amp);/g, (m) => ENTITIES[m]);
}

/** An error answer's {error, reason}. */
async function errorOf(resp) {
  const text = await resp.text();
  try {
    const body = JSON.parse(text);
    const reason = body.reason || body.error || text;
    return {
      error: body.error,
      reason: typeof reason === "string" ? unescapeHtml(reason) : JSON.stringify(reason),
    };
  } catch {
    return { error: undefined, reason: text || `${resp.status} ${resp.statusText}` };
  }
}

async function reasonOf(resp) {
  return (await errorOf(resp)).reason;
}

/**
 * api("GET", "/queues") -> parsed JSON (or null for an empty body).
 * body: an object (sent as JSON) or a string; headers: extra request headers.
 */
export async function api(method, path, body, headers = {}) {
  // credentials "omit": the Authorization header still goes, but a 401 with
  // WWW-Authenticate never opens the browser's own login dialog.
  const init = {
    method,
    credentials: "omit",
    headers: {
      Authorization: sessionStorage.getItem(AUTH_KEY) || "",
      "X-Requested-With": "XMLHttpRequest",
      ...headers,
    },
  };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(`/api${path}`, init);
  if (resp.status === 401) {
    const { error, reason } = await errorOf(resp);
    // RabbitMQ (and Warren) answer 401 "not_authorised" to a user whose
    // credentials are fine but whose tags do not allow this: not a logout.
    if (error === "not_authorised") throw new ApiError(403, reason);
    logout();
    window.dispatchEvent(new Event("warren:unauthorized"));
    throw new ApiError(401, "Not logged in.");
  }
  if (!resp.ok) throw new ApiError(resp.status, await reasonOf(resp));
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/** A URL path segment: vhost "/" -> "%2F". */
export const seg = (s) => encodeURIComponent(s);

/** The API's name for an exchange ("" is the default exchange, amq.default). */
export const exchangePath = (vhost, name) => `/exchanges/${seg(vhost)}/${seg(name || "amq.default")}`;

/** A runtime parameter's path: parameterPath("shovel", "/", "s1") -> "/parameters/shovel/%2F/s1". */
export const parameterPath = (component, vhost, name) => `/parameters/${component}/${seg(vhost)}/${seg(name)}`;

/** Sets a runtime parameter (as RabbitMQ's UI sends it: the value and where it goes). */
export const putParameter = (component, vhost, name, value) =>
  api("PUT", parameterPath(component, vhost, name), { vhost, component, name, value });
