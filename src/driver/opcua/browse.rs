//! `fieldgate discover opcua`: browses a server's address space down from the Objects
//! folder and writes a device file with one numbered sensor per variable, for a person to
//! edit.
//!
//! Variables are found through hierarchical references (Organizes, HasComponent, ...);
//! properties (HasProperty) are not sensors but metadata: a variable's `EngineeringUnits`
//! property fills in its unit. The server's own diagnostics (namespace 0) are skipped.
//! Text from the server (descriptions, units) is written only as escaped TOML strings,
//! trimmed to printable characters. Discovery connects with security `None`.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use opcua::client::Session;
use opcua::types::{
    AttributeId, BrowseDescription, BrowseDirection, BrowseResultMask, DataTypeId, EUInformation, NodeClass,
    NodeClassMask, NodeId, ObjectId, ReadValueId, ReferenceTypeId, TimestampsToReturn, Variant,
};

use super::Target;
use super::security::{Pki, Security};
use crate::driver::discover::{DiscoverError, MAX_SENSORS, check_names, toml_string};

/// What to browse.
#[derive(Debug, Clone)]
pub struct UaProbe {
    pub url: String,
    pub plant: String,
    pub zone: String,
    pub timeout: Duration,
    /// Levels below the Objects folder to descend.
    pub max_depth: usize,
}

/// A variable found while browsing.
struct Found {
    node: NodeId,
    name: String,
    units: Option<NodeId>,
}

/// Browses the server and returns the device file text.
pub async fn discover_opcua(p: &UaProbe) -> Result<String, DiscoverError> {
    let mut bad = check_names(&p.plant, &p.zone);
    if !p.url.starts_with("opc.tcp://") {
        bad.push(format!("--endpoint: must look like opc.tcp://host:4840/path, found {:?}", p.url));
    }
    if !bad.is_empty() {
        return Err(DiscoverError::Invalid(bad.join("; ")));
    }
    let target = Target {
        url: p.url.clone(),
        security: Security::of(None),
        pki: Pki::new(std::env::temp_dir().join("fieldgate-opcua-none")),
        request_timeout: p.timeout,
        clock: std::sync::Arc::new(crate::driver::clock::Clock::new("discovery", None)),
    };
    let unreachable = || DiscoverError::Connect(p.url.clone());
    let conn = match tokio::time::timeout(p.timeout * 5, target.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(crate::driver::DriverError::Refused(r))) => {
            return Err(DiscoverError::Refused(format!(
                "{r} (discovery connects with security None, anonymously)"
            )));
        }
        Ok(Err(_)) | Err(_) => return Err(unreachable()),
    };
    let session = conn.session.clone();
    let found = tokio::time::timeout(p.timeout * 60, walk(&session, p.max_depth))
        .await
        .map_err(|_| DiscoverError::NoAnswer)??;
    let mut described = describe(&session, &found).await?;
    // Browse order is the server's; a sorted file is stable from one run to the next.
    described.sort_by_cached_key(|d| d.node.to_string());
    let _ = session.disconnect().await;
    if described.is_empty() {
        return Err(DiscoverError::NothingBrowsed);
    }
    Ok(render(p, &described))
}

/// Breadth-first from the Objects folder: every variable reached by a hierarchical
/// reference other than HasProperty, with its EngineeringUnits property if it has one.
async fn walk(session: &Session, max_depth: usize) -> Result<Vec<Found>, DiscoverError> {
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut queue: VecDeque<(NodeId, usize, bool)> = VecDeque::new();
    queue.push_back((ObjectId::ObjectsFolder.into(), 0, false));
    let mut found: Vec<Found> = Vec::new();
    while let Some((node, depth, is_var)) = queue.pop_front() {
        if found.len() > MAX_SENSORS * 2 {
            break;
        }
        for r in browse_all(session, &node).await? {
            // Nodes on other servers (or named by namespace URI) are not ours to read.
            if !r.node_id.namespace_uri.is_null() || r.node_id.server_index != 0 {
                continue;
            }
            let child = r.node_id.node_id.clone();
            if child.namespace == 0 || !seen.insert(child.clone()) {
                continue;
            }
            let property = r.reference_type_id == ReferenceTypeId::HasProperty;
            let name = r.browse_name.name.as_ref().to_string();
            if is_var {
                // Children of a variable: only its units matter.
                if property
                    && name == "EngineeringUnits"
                    && let Some(f) = found.iter_mut().find(|f| f.node == node)
                {
                    f.units = Some(child);
                }
                continue;
            }
            match r.node_class {
                NodeClass::Variable if !property => {
                    let display = r.display_name.text.as_ref().to_string();
                    found.push(Found { node: child.clone(), name: display, units: None });
                    queue.push_back((child, depth + 1, true));
                }
                NodeClass::Object if depth < max_depth => queue.push_back((child, depth + 1, false)),
                _ => {}
            }
        }
    }
    Ok(found)
}

/// Every forward hierarchical reference of `node`, following continuation points.
async fn browse_all(
    session: &Session,
    node: &NodeId,
) -> Result<Vec<opcua::types::ReferenceDescription>, DiscoverError> {
    let desc = BrowseDescription {
        node_id: node.clone(),
        browse_direction: BrowseDirection::Forward,
        reference_type_id: ReferenceTypeId::HierarchicalReferences.into(),
        include_subtypes: true,
        node_class_mask: (NodeClassMask::OBJECT | NodeClassMask::VARIABLE).bits(),
        result_mask: BrowseResultMask::All as u32,
    };
    let mut out = Vec::new();
    let mut results = session.browse(&[desc], 1000, None).await.map_err(|_| DiscoverError::NoAnswer)?;
    for _ in 0..100 {
        let Some(r) = results.pop() else { break };
        if r.status_code.is_bad() {
            break;
        }
        out.extend(r.references.unwrap_or_default());
        if r.continuation_point.is_null_or_empty() {
            break;
        }
        results =
            session.browse_next(false, &[r.continuation_point]).await.map_err(|_| DiscoverError::NoAnswer)?;
    }
    Ok(out)
}

/// A variable as the device file will describe it.
struct Described {
    node: NodeId,
    description: String,
    unit: String,
    data_type: &'static str,
}

/// Reads the data type, description and units of every variable; keeps the scalar ones
/// fieldgate can read (numbers, booleans, text).
async fn describe(session: &Session, found: &[Found]) -> Result<Vec<Described>, DiscoverError> {
    let mut out = Vec::new();
    for chunk in found.chunks(200) {
        let mut ids = Vec::new();
        for f in chunk {
            for (node, attr) in [
                (&f.node, AttributeId::DataType),
                (&f.node, AttributeId::Description),
                (&f.node, AttributeId::ValueRank),
            ] {
                ids.push(ReadValueId {
                    node_id: node.clone(),
                    attribute_id: attr as u32,
                    ..Default::default()
                });
            }
            let units = f.units.clone().unwrap_or_else(NodeId::null);
            ids.push(ReadValueId {
                node_id: units,
                attribute_id: AttributeId::Value as u32,
                ..Default::default()
            });
        }
        let values = session
            .read(&ids, TimestampsToReturn::Neither, 0.0)
            .await
            .map_err(|_| DiscoverError::NoAnswer)?;
        for (f, v) in chunk.iter().zip(values.chunks(4)) {
            let [data_type, description, rank, units] = v else { continue };
            let Some(Variant::NodeId(dt)) = &data_type.value else { continue };
            let Some(name) = type_name(dt) else { continue };
            // Scalars only (ValueRank -1); arrays are not one sensor.
            if matches!(&rank.value, Some(Variant::Int32(r)) if *r != -1) {
                continue;
            }
            let description = match &description.value {
                Some(Variant::LocalizedText(t)) if !t.text.is_empty() => t.text.as_ref().to_string(),
                _ => f.name.clone(),
            };
            let unit = match &units.value {
                Some(Variant::ExtensionObject(o)) => o
                    .inner_as::<EUInformation>()
                    .map(|eu| eu.display_name.text.as_ref().to_string())
                    .unwrap_or_default(),
                _ => String::new(),
            };
            out.push(Described { node: f.node.clone(), description, unit, data_type: name });
        }
    }
    Ok(out)
}

/// The data types a sensor can have, by name; `None` for the others.
fn type_name(dt: &NodeId) -> Option<&'static str> {
    let id = dt.as_data_type_id().ok()?;
    Some(match id {
        DataTypeId::Boolean => "Boolean",
        DataTypeId::SByte => "SByte",
        DataTypeId::Byte => "Byte",
        DataTypeId::Int16 => "Int16",
        DataTypeId::UInt16 => "UInt16",
        DataTypeId::Int32 => "Int32",
        DataTypeId::UInt32 => "UInt32",
        DataTypeId::Int64 => "Int64",
        DataTypeId::UInt64 => "UInt64",
        DataTypeId::Float => "Float",
        DataTypeId::Double => "Double",
        DataTypeId::String => "String",
        DataTypeId::LocalizedText => "LocalizedText",
        _ => return None,
    })
}

fn render(p: &UaProbe, found: &[Described]) -> String {
    let kept = found.len().min(MAX_SENSORS);
    let device_id = format!("{}-{}-opcua", p.plant, p.zone).to_lowercase();
    let mut out = String::new();
    let _ = writeln!(out, "# Discovered by `fieldgate discover opcua` from {}.", p.url);
    let _ = writeln!(
        out,
        "# One sensor per variable; edit descriptions, kinds and units, drop what is not a sensor, set the security."
    );
    if kept < found.len() {
        let _ =
            writeln!(out, "# {} more variables were left out (999 sensors per file).", found.len() - kept);
    }
    let _ = writeln!(out, "id = \"{device_id}\"");
    let _ = writeln!(out, "plant = \"{}\"", p.plant);
    let _ = writeln!(out, "zone = \"{}\"", p.zone);
    let _ =
        writeln!(out, "description = {}", toml_string(&format!("OPC UA server at {} (discovered)", p.url)));
    let _ = writeln!(out, "protocol = \"opcua\"");
    let _ = writeln!(out, "endpoint = {}", toml_string(&p.url));
    let _ = writeln!(out, "\n[opcua]\nsecurity_policy = \"None\"\nsecurity_mode = \"None\"\nmode = \"poll\"");
    for (n, d) in found.iter().take(kept).enumerate() {
        let _ = write!(
            out,
            "\n[[sensors]]\nid = \"{}_{}_{:03}\"\ndescription = {}\nkind = \"unclassified\"\nunit = {}\nnode_id = {}   # {}\n",
            p.plant,
            p.zone,
            n + 1,
            toml_string(&d.description),
            toml_string(&d.unit),
            toml_string(&d.node.to_string()),
            d.data_type,
        );
    }
    out
}
