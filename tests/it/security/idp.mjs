// An OpenID provider fieldgate did not write: `oidc-provider` (OpenID-certified; installed
// by scripts/test-deps into target/oidc-js), issuing JWT access tokens by the client
// credentials grant with resource indicators (RFC 8707).
//
// `node idp.mjs KEYS RESOURCE [PORT]`: KEYS is a JSON file of private JWKs (made with an
// ES256 and an RS256 key when missing; replace it and restart for a key rotation),
// RESOURCE the default audience (fieldgate's public URL + "/mcp"), PORT 0 for any. It
// prints `listening <issuer>` once it serves and stops when its stdin closes.
//
// Clients (secret = id + "-secret-0123456789"):
//   agent     fieldgate.read fieldgate.work_orders.write, ES256
//   agent-rs  the same, RS256
//   reader    fieldgate.read only
//   operator  every scope
// Test tooling beside the provider (for tokens no honest provider issues):
//   POST /test/sign {claims, alg?, typ?, foreign?} signs `claims` with the provider's own key
//   of that alg (or, foreign: true, with a key not in its set), typed `typ` (at+jwt).
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.OIDC_MODULES;
const { default: Provider } = await import(pathToFileURL(path.join(modules, "oidc-provider/lib/index.js")));
const jose = await import(pathToFileURL(path.join(modules, "jose/dist/webapi/index.js")));

const [keysFile, resource, port] = process.argv.slice(2);

async function makeKeys() {
  const out = [];
  for (const [alg, kid] of [["ES256", `es-${Date.now()}`], ["RS256", `rs-${Date.now()}`]]) {
    const { privateKey } = await jose.generateKeyPair(alg, { extractable: true, modulusLength: 2048 });
    const jwk = await jose.exportJWK(privateKey);
    out.push({ ...jwk, kid, alg, use: "sig" });
  }
  return { keys: out };
}

if (!fs.existsSync(keysFile)) fs.writeFileSync(keysFile, JSON.stringify(await makeKeys()));
const jwks = JSON.parse(fs.readFileSync(keysFile, "utf8"));

const server = http.createServer();
await new Promise((ok) => server.listen(Number(port || 0), "127.0.0.1", ok));
const issuer = `http://127.0.0.1:${server.address().port}`;

const SCOPES = ["fieldgate.read", "fieldgate.work_orders.write", "fieldgate.operator"];
const client = (id, scope) => ({
  client_id: id,
  client_secret: `${id}-secret-0123456789`,
  grant_types: ["client_credentials"],
  redirect_uris: [],
  response_types: [],
  token_endpoint_auth_method: "client_secret_basic",
  scope,
});
const provider = new Provider(issuer, {
  clients: [
    client("agent", "fieldgate.read fieldgate.work_orders.write"),
    client("agent-rs", "fieldgate.read fieldgate.work_orders.write"),
    client("reader", "fieldgate.read"),
    client("operator", SCOPES.join(" ")),
  ],
  clientAuthMethods: ["client_secret_post", "client_secret_basic"],
  jwks,
  scopes: SCOPES,
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator, c) => ({
        scope: c.scope,
        audience: indicator,
        accessTokenTTL: 300,
        accessTokenFormat: "jwt",
        jwt: { sign: { alg: c.clientId === "agent-rs" ? "RS256" : "ES256" } },
      }),
    },
  },
});
const callback = provider.callback();

let foreign;
server.on("request", async (req, res) => {
  if (req.method === "POST" && req.url === "/test/sign") {
    let body = "";
    for await (const chunk of req) body += chunk;
    const { claims, alg = "ES256", typ = "at+jwt", foreign: other } = JSON.parse(body);
    let key;
    let kid;
    if (other) {
      foreign ??= (await jose.generateKeyPair(alg)).privateKey;
      key = foreign;
      kid = jwks.keys.find((k) => k.alg === alg).kid;
    } else {
      const jwk = jwks.keys.find((k) => k.alg === alg);
      key = await jose.importJWK(jwk, alg);
      kid = jwk.kid;
    }
    const token = await new jose.SignJWT(claims).setProtectedHeader({ alg, kid, typ }).sign(key);
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(token);
    return;
  }
  callback(req, res);
});

console.log(`listening ${issuer}`);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
