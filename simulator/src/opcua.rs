//! OPC UA devices, served with async-opcua's server: one server per device on a free
//! loopback port (or the port of its `endpoint`), one variable per sensor (its
//! `node_id`), values read from the same waveforms as the Modbus devices.
//!
//! Security follows the device file: with `security_policy`/`security_mode` other than
//! `None` the server offers only that endpoint, with its own certificate (created on
//! first start in the device's PKI folder, kept across restarts) and trusting every
//! client certificate; with `username_env` it accepts only that user (from the scenario's
//! `opcua_users`, or the environment variables the file names).
//!
//! Faults: `down` answers BadNotConnected for every node (the server itself stays up);
//! with `exception_rate`, `exception_code = 6` answers BadTooManyOperations and
//! `exception_code = 2` BadNodeIdUnknown; `latency_ms`/`jitter_ms` delay every node's
//! value (a Read of n nodes waits n times; the read callbacks are synchronous, so the
//! delay blocks a worker thread of a multi-thread runtime).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opcua::crypto::SecurityPolicy;
use opcua::server::address_space::VariableBuilder;
use opcua::server::diagnostics::NamespaceMetadata;
use opcua::server::node_manager::memory::{SimpleNodeManager, simple_node_manager};
use opcua::server::{ANONYMOUS_USER_TOKEN_ID, ServerBuilder, ServerEndpoint, ServerUserToken};
use opcua::types::{DataTypeId, DataValue, MessageSecurityMode, NodeId, StatusCode, Variant};
use tokio::net::TcpListener;

use crate::plant::Device;
use crate::wave::{SimValue, UaUser};
use crate::{SimError, State};

pub const NAMESPACE: &str = "urn:fieldgate-sim:plant";

/// A running OPC UA device.
pub struct OpcUaDevice {
    pub device: String,
    pub url: String,
    pub(crate) port: u16,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) handle: opcua::server::ServerHandle,
    /// The server's own certificate (DER), when it is secured.
    pub certificate: Option<PathBuf>,
}

/// How a device's server is set up besides its sensors.
pub(crate) struct Setup {
    /// This device's PKI folder.
    pub pki_dir: PathBuf,
    /// The one user it accepts, when the device file names one.
    pub user: Option<UaUser>,
}

fn variant(kind: DataTypeId, v: &SimValue) -> Variant {
    match (kind, v) {
        (DataTypeId::Boolean, SimValue::Num(n)) => Variant::Boolean(*n >= 0.5),
        (DataTypeId::Boolean, SimValue::Bool(b)) => Variant::Boolean(*b),
        (DataTypeId::String, SimValue::Text(t)) => Variant::from(t.clone()),
        (_, SimValue::Num(n)) => Variant::Double(*n),
        (_, SimValue::Bool(b)) => Variant::Double(f64::from(u8::from(*b))),
        (_, SimValue::Text(t)) => Variant::from(t.clone()),
    }
}

/// The security a device file asks for, in the server's terms.
fn security_of(device: &Device) -> Result<(SecurityPolicy, MessageSecurityMode), SimError> {
    let s = device.opcua.clone().unwrap_or_default();
    let policy = match s.security_policy.as_deref().unwrap_or("None") {
        "None" => SecurityPolicy::None,
        "Basic256Sha256" => SecurityPolicy::Basic256Sha256,
        "Aes128_Sha256_RsaOaep" => SecurityPolicy::Aes128Sha256RsaOaep,
        "Aes256_Sha256_RsaPss" => SecurityPolicy::Aes256Sha256RsaPss,
        other => return Err(SimError::OpcUa(format!("{}: unknown security_policy {other:?}", device.id))),
    };
    let mode = match s.security_mode.as_deref().unwrap_or("None") {
        "None" => MessageSecurityMode::None,
        "Sign" => MessageSecurityMode::Sign,
        "SignAndEncrypt" => MessageSecurityMode::SignAndEncrypt,
        other => return Err(SimError::OpcUa(format!("{}: unknown security_mode {other:?}", device.id))),
    };
    Ok((policy, mode))
}

/// The user a device accepts: the scenario's, else the environment variables its file names.
pub(crate) fn user_of(device: &Device, scenario: Option<&UaUser>) -> Result<Option<UaUser>, SimError> {
    let Some(user_env) = device.opcua.as_ref().and_then(|o| o.username_env.as_deref()) else {
        return Ok(None);
    };
    if let Some(u) = scenario {
        return Ok(Some(u.clone()));
    }
    let password_env = device.opcua.as_ref().and_then(|o| o.password_env.as_deref()).unwrap_or("");
    match (std::env::var(user_env), std::env::var(password_env)) {
        (Ok(user), Ok(password)) => Ok(Some(UaUser { user, password })),
        _ => Err(SimError::OpcUa(format!(
            "{}: set {user_env} and {password_env}, or [opcua_users.{}] in the scenario, for the user it accepts",
            device.id, device.id
        ))),
    }
}

/// Waits `d` without stalling the other servers where the runtime allows it.
fn block_for(d: Duration) {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| std::thread::sleep(d)),
        _ => std::thread::sleep(d),
    }
}

/// The path of a device file's `opc.tcp://host:port/path` endpoint ("/" when it has
/// none): the simulator serves the endpoint the file names, so the shipped files work
/// against the standalone simulator unchanged.
pub fn endpoint_path(url: &str) -> String {
    let rest = url.strip_prefix("opc.tcp://").unwrap_or(url);
    match rest.find('/') {
        Some(i) => rest[i..].to_string(),
        None => "/".to_string(),
    }
}

/// Serves `device` on `port` of the loopback interface (0: a free one).
pub(crate) async fn start(
    state: Arc<State>,
    device: &Device,
    port: u16,
    setup: &Setup,
) -> Result<OpcUaDevice, SimError> {
    let addr = format!("127.0.0.1:{port}");
    let bind =
        |e: std::io::Error| SimError::Bind { device: device.id.clone(), addr: addr.clone(), source: e };
    let listener = TcpListener::bind(&addr).await.map_err(bind)?;
    let port = listener.local_addr().map_err(bind)?.port();
    let (policy, mode) = security_of(device)?;
    let secured = policy != SecurityPolicy::None;
    let token_id = match &setup.user {
        Some(_) => "user".to_string(),
        None => ANONYMOUS_USER_TOKEN_ID.to_string(),
    };
    let path = endpoint_path(&device.endpoint);
    let mut builder = ServerBuilder::new()
        .application_name("fieldgate-sim")
        .application_uri("urn:fieldgate-sim")
        .product_uri("urn:fieldgate-sim")
        .discovery_urls(vec![path.clone()])
        .add_endpoint("device", ServerEndpoint::new(&path, policy, mode, std::slice::from_ref(&token_id)))
        .create_sample_keypair(secured)
        .trust_client_certs(true)
        .pki_dir(&setup.pki_dir)
        .host("127.0.0.1")
        .port(port)
        .with_node_manager(simple_node_manager(
            NamespaceMetadata { namespace_uri: NAMESPACE.into(), ..Default::default() },
            "fieldgate-sim",
        ));
    if let Some(u) = &setup.user {
        builder =
            builder.add_user_token("user", ServerUserToken::user_pass(u.user.clone(), u.password.clone()));
    }
    let (server, handle) = builder.build().map_err(SimError::OpcUa)?;
    let manager = handle
        .node_managers()
        .get_of_type::<SimpleNodeManager>()
        .ok_or_else(|| SimError::OpcUa("no node manager".into()))?;
    let ns = handle.get_namespace_index(NAMESPACE).ok_or_else(|| SimError::OpcUa("no namespace".into()))?;
    let folder = NodeId::new(ns, device.id.clone());
    let mut nodes = Vec::new();
    {
        let space = manager.address_space();
        let mut space = space.write();
        space.add_folder(&folder, &device.id, &device.id, &NodeId::objects_folder_id());
        for p in &device.sensors {
            let Some(raw) = &p.node_id else { continue };
            // The device file's identifier, in the namespace this server registered.
            let ident = raw.split_once(";s=").map(|(_, s)| s.to_string()).unwrap_or_else(|| raw.clone());
            let id = NodeId::new(ns, ident.clone());
            let initial = state.wave_of(p).at(state.clock.now());
            let kind = match (&initial, p.kind_name.as_deref()) {
                (SimValue::Text(_), _) => DataTypeId::String,
                (_, Some("status" | "alarm")) => DataTypeId::Boolean,
                _ => DataTypeId::Double,
            };
            let mut var = VariableBuilder::new(&id, &ident, &ident)
                .data_type(kind)
                .value(variant(kind, &initial))
                .organized_by(&folder);
            if let Some(d) = &p.description {
                var = var.description(d.as_str());
            }
            var.insert(&mut *space);
            if let Some(unit) = p.unit.as_deref().filter(|u| !u.is_empty()) {
                add_engineering_units(&mut space, &id, ns, unit);
            }
            nodes.push((id, kind, p.clone()));
        }
    }
    for (id, kind, point) in nodes {
        let (st, dev) = (state.clone(), device.id.clone());
        manager.inner().add_read_callback(id, move |_, _, _| {
            st.opcua_reads.fetch_add(1, Ordering::Relaxed);
            let faults = st.faults(&dev);
            let mut delay = faults.latency_ms;
            if faults.jitter_ms > 0 {
                delay += st.uniform(&dev, faults.jitter_ms + 1);
            }
            if delay > 0 {
                block_for(Duration::from_millis(delay));
            }
            if faults.down {
                return Err(StatusCode::BadNotConnected);
            }
            match faults.exception_code {
                Some(6) if st.chance(&dev, faults.exception_rate) => {
                    return Err(StatusCode::BadTooManyOperations);
                }
                Some(2) if st.chance(&dev, faults.exception_rate) => {
                    return Err(StatusCode::BadNodeIdUnknown);
                }
                _ => {}
            }
            let v = st.wave_of(&point).at(st.clock.now());
            Ok(DataValue::new_now(variant(kind, &v)))
        });
    }
    let task = tokio::spawn(async move {
        if let Err(error) = server.run_with(listener).await {
            tracing::warn!(%error, "OPC UA server stopped");
        }
    });
    Ok(OpcUaDevice {
        device: device.id.clone(),
        url: format!("opc.tcp://127.0.0.1:{port}{path}"),
        port,
        task,
        handle,
        certificate: secured.then(|| own_certificate(&setup.pki_dir)),
    })
}

/// Where a server keeps its own certificate in its PKI folder.
fn own_certificate(pki_dir: &Path) -> PathBuf {
    pki_dir.join("own").join("cert.der")
}

/// Gives a variable an `EngineeringUnits` property whose display name is `unit`, as
/// servers that follow the analog-item model do.
fn add_engineering_units(
    space: &mut opcua::server::address_space::AddressSpace,
    variable: &NodeId,
    ns: u16,
    unit: &str,
) {
    use opcua::types::{EUInformation, ExtensionObject, LocalizedText, UAString};
    let Some(ident) = variable.identifier.to_string().strip_prefix("s=").map(str::to_string) else {
        return;
    };
    let id = NodeId::new(ns, format!("{ident}.EngineeringUnits"));
    let info = EUInformation {
        namespace_uri: UAString::from("http://www.opcfoundation.org/UA/units/un/cefact"),
        unit_id: -1,
        display_name: LocalizedText::new("", unit),
        description: LocalizedText::new("", unit),
    };
    VariableBuilder::new(&id, "EngineeringUnits", "EngineeringUnits")
        .data_type(DataTypeId::EUInformation)
        .value(Variant::from(ExtensionObject::from_message(info)))
        .property_of(variable.clone())
        .has_type_definition(opcua::types::VariableTypeId::PropertyType)
        .insert(space);
}

impl OpcUaDevice {
    /// Stops the server: its connections are closed (as when a device reboots) and its
    /// sessions and subscriptions are gone.
    pub(crate) async fn stop(mut self) {
        self.handle.cancel();
        // The server closes its connections on cancel; aborting it first would leave
        // their tasks running, serving reads but no subscriptions.
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_endpoint_path_comes_from_the_device_file() {
        assert_eq!(super::endpoint_path("opc.tcp://127.0.0.1:4840/fieldgate"), "/fieldgate");
        assert_eq!(super::endpoint_path("opc.tcp://127.0.0.1:4840/a/b"), "/a/b");
        assert_eq!(super::endpoint_path("opc.tcp://127.0.0.1:4840"), "/");
        assert_eq!(super::endpoint_path("opc.tcp://127.0.0.1:4840/"), "/");
    }
}
