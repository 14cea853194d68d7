//! OPC UA devices, served with async-opcua's server: one server per device on a free
//! loopback port, one variable per sensor (its `node_id`), values read from the same
//! waveforms as the Modbus devices. Faults, with `exception_rate`: `exception_code = 6`
//! answers BadTooManyOperations, `exception_code = 2` BadNodeIdUnknown; `down` answers
//! BadNotConnected for every node (the server itself stays up).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use opcua::server::ServerBuilder;
use opcua::server::address_space::VariableBuilder;
use opcua::server::diagnostics::NamespaceMetadata;
use opcua::server::node_manager::memory::{SimpleNodeManager, simple_node_manager};
use opcua::types::{DataTypeId, DataValue, NodeId, StatusCode, Variant};
use tokio::net::TcpListener;

use crate::plant::Device;
use crate::wave::SimValue;
use crate::{SimError, State};

pub const NAMESPACE: &str = "urn:fieldgate-sim:plant";

/// A running OPC UA device.
pub struct OpcUaDevice {
    pub device: String,
    pub url: String,
    pub(crate) port: u16,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) handle: opcua::server::ServerHandle,
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

/// Serves `device` on `port` of the loopback interface (0: a free one).
pub(crate) async fn start(state: Arc<State>, device: &Device, port: u16) -> Result<OpcUaDevice, SimError> {
    let addr = format!("127.0.0.1:{port}");
    let bind =
        |e: std::io::Error| SimError::Bind { device: device.id.clone(), addr: addr.clone(), source: e };
    let listener = TcpListener::bind(&addr).await.map_err(bind)?;
    let port = listener.local_addr().map_err(bind)?.port();
    let (server, handle) = ServerBuilder::new_anonymous("fieldgate-sim")
        .application_uri("urn:fieldgate-sim")
        .product_uri("urn:fieldgate-sim")
        // Security policy None only: no certificates, but keep the PKI folders it creates
        // out of the working directory.
        .pki_dir(std::env::temp_dir().join("fieldgate-sim-pki"))
        .host("127.0.0.1")
        .port(port)
        .with_node_manager(simple_node_manager(
            NamespaceMetadata { namespace_uri: NAMESPACE.into(), ..Default::default() },
            "fieldgate-sim",
        ))
        .build()
        .map_err(SimError::OpcUa)?;
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
            VariableBuilder::new(&id, &ident, &ident)
                .data_type(kind)
                .value(variant(kind, &initial))
                .organized_by(&folder)
                .insert(&mut *space);
            nodes.push((id, kind, p.clone()));
        }
    }
    for (id, kind, point) in nodes {
        let (st, dev) = (state.clone(), device.id.clone());
        manager.inner().add_read_callback(id, move |_, _, _| {
            st.opcua_reads.fetch_add(1, Ordering::Relaxed);
            let faults = st.faults(&dev);
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
        url: format!("opc.tcp://127.0.0.1:{port}/"),
        port,
        task,
        handle,
    })
}

impl OpcUaDevice {
    /// Stops the server: its sessions and connections end.
    pub(crate) async fn stop(self) {
        self.handle.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}
