// An OPC UA server that fieldgate did not write: node-opcua (installed by scripts/test-deps
// into target/opcua-js), serving the variables a test names. `node server.js DIR NODES`:
// DIR for its certificates, NODES a JSON list of {name, type, value, array?, source?, status?} (Int64 and UInt64 as
// [high, low] 32-bit words, as node-opcua takes them). Anonymous, security None, any port:
// it prints `listening opc.tcp://...` once it serves, and stops when its stdin closes.
// PEER_SECURE=1 also offers Basic256Sha256 Sign and SignAndEncrypt (its own certificate
// made on first start in DIR/pki); PEER_PORT=N listens on port N.
// A node may carry `alarm` (OPC UA Alarms & Conditions): {"kind": "exclusive"|"nonexclusive",
// "highHigh"?, "high", "low", "lowLow"?} (a limit alarm) or {"kind": "offnormal", "normal": VALUE};
// the condition is ns=N;s=NAME.Alarm, ConditionName NAME.Alarm, source and input the variable.
// It has the optional ConfirmedState, so an acknowledged alarm stays retained (re-sent by
// ConditionRefresh) while it is active. An acknowledgement prints `acknowledged NAME.Alarm: COMMENT`.
const opcua = require("node-opcua");
const path = require("path");

async function main() {
  const [dir, spec] = process.argv.slice(2);
  const nodes = JSON.parse(spec);
  const serverCertificateManager = new opcua.OPCUACertificateManager({
    rootFolder: path.join(dir, "pki"),
    automaticallyAcceptUnknownCertificate: true,
  });
  const secure = process.env.PEER_SECURE === "1";
  const server = new opcua.OPCUAServer({
    port: Number(process.env.PEER_PORT || 0),
    resourcePath: "/peer",
    serverCertificateManager,
    securityPolicies: secure
      ? [opcua.SecurityPolicy.None, opcua.SecurityPolicy.Basic256Sha256]
      : [opcua.SecurityPolicy.None],
    securityModes: secure
      ? [opcua.MessageSecurityMode.None, opcua.MessageSecurityMode.Sign, opcua.MessageSecurityMode.SignAndEncrypt]
      : [opcua.MessageSecurityMode.None],
    // Its own certificate names the address the tests connect to.
    alternateHostname: ["127.0.0.1"],
    allowAnonymous: true,
  });
  await server.initialize();
  const addressSpace = server.engine.addressSpace;
  // Acknowledge/Confirm and ConditionRefresh bound to node-opcua's implementations.
  addressSpace.installAlarmsAndConditionsService();
  const ns = addressSpace.getOwnNamespace();
  // The folder notifies events (Server -HasNotifier-> Peer): conditions of its variables reach
  // the Server object, and ConditionRefresh finds them by this chain.
  const folder = ns.addFolder(addressSpace.rootFolder.objects, {
    browseName: "Peer",
    eventNotifier: opcua.EventNotifierFlags.SubscribeToEvents,
    notifierOf: addressSpace.rootFolder.objects.server,
  });
  // Values JSON cannot carry: bytes from a string, a date from an ISO instant.
  const valueOf = (n) =>
    n.type === "ByteString" ? Buffer.from(n.value) : n.type === "DateTime" ? new Date(n.value) : n.value;
  for (const n of nodes) {
    const variable = ns.addVariable({
      componentOf: folder,
      // Peer -HasEventSource-> variable: a condition source must be an event source.
      ...(n.alarm ? { eventSourceOf: folder } : {}),
      browseName: n.name,
      nodeId: `s=${n.name}`,
      // "Null": a variable of any type whose value is the Null variant.
      dataType: n.type === "Null" ? "BaseDataType" : n.type,
      // `source`: the value stamped by a clock of the device's own (an ISO instant, or
      // "year-ahead"), as a device with a wrong clock stamps it.
      value: n.status
        ? {
            // `status`: the node's value comes with this status code (e.g. an Uncertain one).
            timestamped_get: () =>
              new opcua.DataValue({
                value: n.type === "Null" ? { dataType: opcua.DataType.Null } : { dataType: opcua.DataType[n.type], value: valueOf(n) },
                statusCode: opcua.StatusCodes[n.status],
              }),
          }
        : n.source
        ? {
            timestamped_get: () =>
              new opcua.DataValue({
                value: { dataType: opcua.DataType[n.type], value: valueOf(n) },
                sourceTimestamp:
                  n.source === "year-ahead" ? new Date(Date.now() + 365 * 86400000) : new Date(n.source),
                serverTimestamp: new Date(),
              }),
          }
        : n.type === "Null"
          ? { dataType: opcua.DataType.Null }
          : {
              dataType: opcua.DataType[n.type],
              arrayType: n.array ? opcua.VariantArrayType.Array : opcua.VariantArrayType.Scalar,
              value: valueOf(n),
            },
    });
    if (n.alarm) {
      const alarm = addAlarm(ns, folder, variable, n);
      alarm.on("acknowledged", (eventId, comment) => console.log(`acknowledged ${n.name}.Alarm: ${comment.text}`));
    }
  }
  await server.start();
  const url = server.getEndpointUrl().replace(/\/\/[^:/]+:/, "//127.0.0.1:");
  console.log(`listening ${url} ns=${ns.index}`);
  // Each line on stdin is a change: {"set": NAME, "type", "value", "array"?} gives the
  // variable NAME that value from now on (a "Null" type: the Null variant).
  const variables = new Map();
  for (const n of nodes) variables.set(n.name, ns.findNode(`ns=${ns.index};s=${n.name}`));
  require("readline")
    .createInterface({ input: process.stdin })
    .on("line", (line) => {
      const c = JSON.parse(line);
      const variant =
        c.type === "Null"
          ? { dataType: opcua.DataType.Null }
          : {
              dataType: opcua.DataType[c.type],
              arrayType: c.array ? opcua.VariantArrayType.Array : opcua.VariantArrayType.Scalar,
              value: valueOf(c),
            };
      variables.get(c.set).setValueFromSource(variant);
      console.log(`set ${c.set}`);
    })
    .on("close", () => server.shutdown(0).then(() => process.exit(0)));
}

// A condition on `variable` as `n.alarm` says (the variable must have a plain value, not a
// getter: the alarm watches its "value_changed").
function addAlarm(ns, folder, variable, n) {
  const a = n.alarm;
  const common = {
    optionals: ["ConfirmedState", "Confirm"],
    browseName: `${n.name}.Alarm`,
    nodeId: `s=${n.name}.Alarm`,
    componentOf: folder,
    conditionName: `${n.name}.Alarm`,
    conditionSource: variable,
    inputNode: variable,
  };
  if (a.kind === "offnormal") {
    const normal = ns.addVariable({
      componentOf: folder,
      browseName: `${n.name}.Normal`,
      nodeId: `s=${n.name}.Normal`,
      dataType: n.type,
      value: { dataType: opcua.DataType[n.type], value: a.normal },
    });
    return ns.instantiateOffNormalAlarm({ ...common, normalState: normal });
  }
  const limits = { highLimit: a.high, lowLimit: a.low };
  if (a.highHigh !== undefined) limits.highHighLimit = a.highHigh;
  if (a.lowLow !== undefined) limits.lowLowLimit = a.lowLow;
  return a.kind === "nonexclusive"
    ? ns.instantiateNonExclusiveLimitAlarm("NonExclusiveLimitAlarmType", { ...common, ...limits })
    : ns.instantiateExclusiveLimitAlarm("ExclusiveLimitAlarmType", { ...common, ...limits });
}

main().catch((e) => {
  console.error(`node-opcua server failed: ${e.message}`);
  process.exit(1);
});
