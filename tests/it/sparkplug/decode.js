// Decodes Sparkplug B payloads with Eclipse Tahu's sparkplug-payload (a decoder fieldgate
// did not write) and prints them as JSON, one line per file given.
const sparkplug = require("sparkplug-payload").get("spBv1.0");
const fs = require("fs");
const plain = (v) => (v && typeof v === "object" && typeof v.toNumber === "function" ? v.toNumber() : v);
function clean(x) {
  if (Array.isArray(x)) return x.map(clean);
  if (x && typeof x === "object" && typeof x.toNumber !== "function") {
    const out = {};
    for (const [k, v] of Object.entries(x)) out[k] = clean(v);
    return out;
  }
  return plain(x);
}
for (const file of process.argv.slice(2)) {
  const decoded = sparkplug.decodePayload(fs.readFileSync(file));
  console.log(JSON.stringify(clean(decoded)));
}
