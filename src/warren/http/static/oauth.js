// Logging in through an OpenID Connect provider ([mgmt] oauth_enabled): the
// authorization code flow with PKCE (RFC 7636, S256). The browser goes to the
// provider and comes back to this page with a code; Warren relays the
// discovery document and the code exchange (/api/auth/openid-configuration,
// /api/auth/token), so the page fetches from its own origin only and a client
// secret never reaches it. The access token is then the API's Bearer credential.

// The login under way (state, PKCE verifier, the page to return to): until the
// provider sends the browser back. sessionStorage: this tab only.
const PENDING_KEY = "warren.oauth.pending";
// The ID token, for the provider's logout (id_token_hint).
const ID_TOKEN_KEY = "warren.oauth.id_token";

let settings = { oauth_enabled: false };

/** Reads /api/auth once, at the start; a failure leaves the password form. */
export async function loadSettings() {
  try {
    const resp = await fetch("/api/auth", { credentials: "omit" });
    if (resp.ok) settings = await resp.json();
  } catch {
    // The API did not answer: the login form will say so when it is used.
  }
  return settings;
}

export const oauthEnabled = () => settings.oauth_enabled === true;

/** The password form is offered too (RabbitMQ's oauth_disable_basic_auth = false). */
export const basicAllowed = () => !oauthEnabled() || settings.oauth_disable_basic_auth === false;

function base64url(bytes) {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function randomString() {
  const bytes = new Uint8Array(32);
  crypto.getRandomValues(bytes);
  return base64url(bytes);
}

async function challengeOf(verifier) {
  if (!crypto.subtle) {
    // Browsers give SHA-256 to secure contexts only: HTTPS, or localhost.
    throw new Error("Logging in through the OAuth 2 provider needs the UI served over HTTPS.");
  }
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  return base64url(new Uint8Array(digest));
}

async function reasonOf(resp) {
  const body = await resp.json().catch(() => ({}));
  return body.error_description || body.reason || body.error || `HTTP ${resp.status}`;
}

async function discovery() {
  const resp = await fetch("/api/auth/openid-configuration", { credentials: "omit" });
  if (!resp.ok) throw new Error(`The OAuth 2 provider cannot be reached: ${await reasonOf(resp)}`);
  return resp.json();
}

// Where the provider sends the browser back: this page, without query or hash.
const redirectUri = () => `${location.origin}${location.pathname}`;

/** Goes to the provider's login; returns to the current page (its hash) after. */
export async function startLogin() {
  const doc = await discovery();
  const state = randomString();
  const verifier = randomString();
  const url = new URL(doc.authorization_endpoint);
  const query = {
    response_type: "code",
    client_id: settings.oauth_client_id,
    redirect_uri: redirectUri(),
    scope: settings.oauth_scopes || "openid profile",
    state,
    code_challenge: await challengeOf(verifier),
    code_challenge_method: "S256",
  };
  for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
  sessionStorage.setItem(PENDING_KEY, JSON.stringify({ state, verifier, hash: location.hash }));
  location.assign(url.href);
}

/** When the token stops being valid, in ms since the epoch: its exp, else expires_in. */
function expiryOf(answer) {
  try {
    const part = answer.access_token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(atob(part)).exp;
    if (typeof exp === "number") return exp * 1000;
  } catch {
    // Not a JWT the page can read: the provider's expires_in, if any.
  }
  return typeof answer.expires_in === "number" ? Date.now() + answer.expires_in * 1000 : null;
}

/**
 * The provider's return (?code=...&state=..., or ?error=...): exchanges the code
 * and gives {token, expiresAt}; null when the page was not opened by a return.
 * Throws (the reason as its message) when the login failed.
 */
export async function completeLogin() {
  const params = new URLSearchParams(location.search);
  if (!oauthEnabled() || !params.has("state") || !(params.has("code") || params.has("error"))) return null;
  const pending = JSON.parse(sessionStorage.getItem(PENDING_KEY) || "null");
  sessionStorage.removeItem(PENDING_KEY);
  // The code is good once: off the address bar (and history), back to the page left.
  history.replaceState(null, "", `${location.pathname}${(pending && pending.hash) || ""}`);
  if (params.has("error")) {
    throw new Error(`Login failed: ${params.get("error_description") || params.get("error")}`);
  }
  if (!pending || pending.state !== params.get("state")) {
    throw new Error("Login failed: the provider's answer is not for a login started here.");
  }
  const resp = await fetch("/api/auth/token", {
    method: "POST",
    credentials: "omit",
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      code: params.get("code"),
      redirect_uri: redirectUri(),
      code_verifier: pending.verifier,
    }),
  });
  if (!resp.ok) throw new Error(`Login failed: ${await reasonOf(resp)}`);
  const answer = await resp.json();
  if (typeof answer.access_token !== "string") throw new Error("Login failed: the provider gave no access token.");
  if (answer.id_token) sessionStorage.setItem(ID_TOKEN_KEY, answer.id_token);
  return { token: answer.access_token, expiresAt: expiryOf(answer) };
}

/** The provider's logout (it returns to this page), or null when it has none. */
export async function logoutUrl() {
  const idToken = sessionStorage.getItem(ID_TOKEN_KEY);
  sessionStorage.removeItem(ID_TOKEN_KEY);
  let doc;
  try {
    doc = await discovery();
  } catch {
    return null;
  }
  if (!doc.end_session_endpoint) return null;
  const url = new URL(doc.end_session_endpoint);
  url.searchParams.set("client_id", settings.oauth_client_id);
  url.searchParams.set("post_logout_redirect_uri", redirectUri());
  if (idToken) url.searchParams.set("id_token_hint", idToken);
  return url.href;
}
