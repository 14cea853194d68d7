// Decodes Sparkplug B payloads with Eclipse Tahu's sparkplug-payload (a decoder fieldgate
// did not write) and prints them as JSON: one line per file given, or, with `--lines`, one
// line per base64 payload read from stdin (64-bit integers as decimal strings, exact), or
// {"error": "..."} for a payload Tahu cannot decode.
const sparkplug = require("sparkplug-payload").get("spBv1.0");
const fs = require("fs");
const isLong = (v) => v && typeof v === "object" && typeof v.toNumber === "function";
function clean(x, exact) {
  if (isLong(x)) return exact ? x.toString() : x.toNumber();
  if (Buffer.isBuffer(x) || x instanceof Uint8Array) return Buffer.from(x).toString("base64");
  if (Array.isArray(x)) return x.map((v) => clean(v, exact));
  if (x && typeof x === "object") {
    const out = {};
    for (const [k, v] of Object.entries(x)) out[k] = clean(v, exact);
    return out;
  }
  return x;
}
if (process.argv[2] === "--lines") {
  const rl = require("readline").createInterface({ input: process.stdin });
  rl.on("line", (line) => {
    let out;
    try {
      out = clean(sparkplug.decodePayload(Buffer.from(line, "base64")), true);
    } catch (e) {
      out = { error: String(e && e.message ? e.message : e) };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  });
} else {
  for (const file of process.argv.slice(2)) {
    const decoded = sparkplug.decodePayload(fs.readFileSync(file));
    console.log(JSON.stringify(clean(decoded, false)));
  }
}
