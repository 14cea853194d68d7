// Encodes a Sparkplug B payload with Eclipse Tahu's sparkplug-payload (an encoder fieldgate
// did not write): `node encode.js OUT JSON` writes the payload JSON describes to OUT.
const sparkplug = require("sparkplug-payload").get("spBv1.0");
const fs = require("fs");
const [out, json] = process.argv.slice(2);
fs.writeFileSync(out, sparkplug.encodePayload(JSON.parse(json)));
