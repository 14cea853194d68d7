//! The sensor registry: every device and sensor of the plant, validated, indexed, and
//! the only source of truth for which IDs exist.
//!
//! **Invariant:** every `Sensor` refers to a `Device` of the same PLANT and ZONE, and
//! IDs are unique. A `Registry` that exists is valid; loading reports every problem.

pub mod alarm;
pub mod bounds;
pub mod file_schema;
mod load;
mod model;
mod text;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

pub use alarm::{AlarmDef, AlarmKind, AlarmPriority};
pub use load::{device_files, load_dir, load_texts};
pub use model::*;
pub use text::{Matches, TextIndex};

use crate::ids::{DeviceId, SensorId};
use crate::toml_reader::Problem;

/// All devices and sensors, sorted by ID, with lookups by ID, equipment and zone.
#[derive(Debug)]
pub struct Registry {
    devices: Vec<Device>,
    sensors: Vec<Sensor>,
    device_index: foldhash::HashMap<DeviceId, usize>,
    /// By the ID's text, so that a caller's string finds its sensor without parsing.
    sensor_index: foldhash::HashMap<Box<str>, usize>,
    by_equipment: BTreeMap<String, Vec<usize>>,
    by_device: HashMap<DeviceId, Vec<usize>>,
    /// IDs withheld because more than one source claims them (the fleet hub's catalogue:
    /// the same sensor or device ID announced by two edge nodes); empty for device files.
    conflicts: Vec<Conflict>,
    /// Sensor kinds, plants and zones (the values `list_sensors` filters take).
    kinds: BTreeSet<String>,
    plants: BTreeSet<String>,
    zones: BTreeSet<String>,
    /// Built on the first text query.
    text: std::sync::OnceLock<TextIndex>,
}

/// An ID more than one source claims, served by none of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The sensor or device ID.
    pub id: String,
    /// Who claims it (`group/node/device`), sorted.
    pub claimants: Vec<String>,
    /// A sensor withheld because its device's ID is in conflict (listed too): that device
    /// ID. `claimants` are then the sensor's own announcers (one, perhaps).
    pub device: Option<String>,
}

/// Loading failed: every problem found, each with file and line.
#[derive(Debug, thiserror::Error)]
#[error("{} problem(s) in the device files", .0.len())]
pub struct RegistryError(pub Vec<Problem>);

impl Registry {
    /// Loads `dir/*.toml`, reporting every problem at once.
    pub fn load(dir: &Path) -> Result<Registry, RegistryError> {
        let (devices, sensors) = load_dir(dir).map_err(RegistryError)?;
        Ok(Registry::new(devices, sensors))
    }

    /// Builds the registry from device files given as text (used by tests and tools).
    pub fn from_texts(inputs: &[(String, String)]) -> Result<Registry, RegistryError> {
        let (devices, sensors) = load_texts(inputs).map_err(RegistryError)?;
        Ok(Registry::new(devices, sensors))
    }

    /// A registry of devices and sensors made elsewhere than in device files (the fleet
    /// hub's catalogue, from births). Refused unless IDs are unique and every sensor's
    /// device is there, with its plant and zone: what a loaded registry holds to.
    pub fn assembled(
        devices: Vec<Device>,
        sensors: Vec<Sensor>,
        conflicts: Vec<Conflict>,
    ) -> Result<Registry, String> {
        let mut ids = std::collections::HashSet::new();
        if let Some(d) = devices.iter().find(|d| !ids.insert(d.id.as_str())) {
            return Err(format!("device {} twice", d.id));
        }
        let mut names = std::collections::HashSet::new();
        if let Some(s) = sensors.iter().find(|s| !names.insert(s.id.as_str())) {
            return Err(format!("sensor {} twice", s.id));
        }
        let by_id: HashMap<&DeviceId, &Device> = devices.iter().map(|d| (&d.id, d)).collect();
        for s in &sensors {
            match by_id.get(&s.device) {
                Some(d) if d.plant == s.id.plant() && d.zone == s.id.zone() => {}
                Some(_) => return Err(format!("sensor {} is not of its device's plant and zone", s.id)),
                None => return Err(format!("sensor {} has no device {}", s.id, s.device)),
            }
        }
        let mut registry = Registry::new(devices, sensors);
        registry.conflicts = conflicts;
        Ok(registry)
    }

    /// IDs withheld because several sources claim them (the fleet hub's).
    /// The devices of plant `plant` and their sensors alone (`None`: no device there).
    pub fn of_plant(&self, plant: &str) -> Option<Registry> {
        let devices: Vec<Device> = self.devices.iter().filter(|d| d.plant == plant).cloned().collect();
        if devices.is_empty() {
            return None;
        }
        let sensors = self.sensors.iter().filter(|s| s.id.plant() == plant).cloned().collect();
        Registry::assembled(devices, sensors, Vec::new()).ok()
    }

    pub fn conflicts(&self) -> &[Conflict] {
        &self.conflicts
    }

    /// The conflict over `id`, when it is withheld for one.
    pub fn conflict(&self, id: &str) -> Option<&Conflict> {
        self.conflicts.iter().find(|c| c.id == id)
    }

    fn new(mut devices: Vec<Device>, mut sensors: Vec<Sensor>) -> Registry {
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        sensors.sort_by(|a, b| a.id.cmp(&b.id));
        let device_index: foldhash::HashMap<DeviceId, usize> =
            devices.iter().enumerate().map(|(i, d)| (d.id.clone(), i)).collect();
        for (i, s) in sensors.iter_mut().enumerate() {
            // Every sensor's device exists: the loader checked the reference.
            s.place = Place { sensor: i, device: device_index.get(&s.device).copied().unwrap_or(usize::MAX) };
        }
        let sensor_index = sensors.iter().enumerate().map(|(i, s)| (s.id.as_str().into(), i)).collect();
        let mut by_equipment: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut by_device: HashMap<DeviceId, Vec<usize>> = HashMap::new();
        for (i, s) in sensors.iter().enumerate() {
            // A key is cloned once, for its first sensor.
            if let Some(eq) = &s.equipment {
                match by_equipment.get_mut(eq) {
                    Some(list) => list.push(i),
                    None => drop(by_equipment.insert(eq.clone(), vec![i])),
                }
            }
            match by_device.get_mut(&s.device) {
                Some(list) => list.push(i),
                None => drop(by_device.insert(s.device.clone(), vec![i])),
            }
        }
        let owned = |set: BTreeSet<&str>| set.into_iter().map(String::from).collect::<BTreeSet<String>>();
        Registry {
            kinds: owned(sensors.iter().map(|s| s.kind.as_str()).collect()),
            plants: owned(devices.iter().map(|d| d.plant.as_str()).collect()),
            zones: owned(devices.iter().map(|d| d.zone.as_str()).collect()),
            devices,
            sensors,
            device_index,
            sensor_index,
            by_equipment,
            by_device,
            conflicts: Vec::new(),
            text: std::sync::OnceLock::new(),
        }
    }

    /// Points a device at another endpoint (the simulator on a free port, in tests and
    /// the demo). Returns false when there is no such device.
    pub fn override_endpoint(&mut self, id: &DeviceId, endpoint: Endpoint) -> bool {
        match self.device_index.get(id) {
            Some(&i) => {
                self.devices[i].endpoint = endpoint;
                true
            }
            None => false,
        }
    }

    /// Points devices at TCP addresses and serial paths by device ID (the simulator's, in
    /// the demo, tests and benchmarks). Unknown IDs are skipped.
    pub fn override_endpoints(
        &mut self,
        tcp: impl IntoIterator<Item = (String, std::net::SocketAddr)>,
        serial: impl IntoIterator<Item = (String, String)>,
    ) {
        for (id, addr) in tcp {
            if let Ok(id) = id.parse::<DeviceId>() {
                self.override_endpoint(&id, Endpoint::Tcp { host: addr.ip().to_string(), port: addr.port() });
            }
        }
        for (id, path) in serial {
            if let Ok(id) = id.parse::<DeviceId>() {
                self.override_endpoint(&id, Endpoint::Serial { path });
            }
        }
    }

    /// Points OPC UA devices at other server URLs (the simulator's, in the demo and tests).
    pub fn override_opcua_endpoints(&mut self, urls: impl IntoIterator<Item = (String, String)>) {
        for (id, url) in urls {
            if let Ok(id) = id.parse::<DeviceId>() {
                self.override_endpoint(&id, Endpoint::OpcUa { url });
            }
        }
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// All sensors, sorted by ID.
    pub fn sensors(&self) -> &[Sensor] {
        &self.sensors
    }

    pub fn device(&self, id: &DeviceId) -> Option<&Device> {
        self.device_index.get(id).map(|&i| &self.devices[i])
    }

    pub fn sensor(&self, id: &SensorId) -> Option<&Sensor> {
        self.sensor_named(id.as_str())
    }

    /// The sensor whose ID is exactly `text`. Every registered ID is well-formed, so a
    /// hit needs no parsing; a miss says nothing about why (see `ids::SensorId`).
    pub fn sensor_named(&self, text: &str) -> Option<&Sensor> {
        self.sensor_index.get(text).map(|&i| &self.sensors[i])
    }

    /// The device a sensor belongs to. Always present: the registry checked it. Found at
    /// the sensor's place, confirmed by ID (a sensor of another registry is looked up).
    pub fn device_of(&self, sensor: &Sensor) -> &Device {
        match self.devices.get(sensor.place.device) {
            Some(d) if d.id == sensor.device => d,
            _ => &self.devices[self.device_index[&sensor.device]],
        }
    }

    pub fn sensors_of_device(&self, id: &DeviceId) -> impl Iterator<Item = &Sensor> {
        self.by_device.get(id).into_iter().flatten().map(|&i| &self.sensors[i])
    }

    pub fn sensors_of_equipment(&self, tag: &str) -> impl Iterator<Item = &Sensor> {
        self.by_equipment.get(tag).into_iter().flatten().map(|&i| &self.sensors[i])
    }

    pub fn plants(&self) -> &BTreeSet<String> {
        &self.plants
    }

    pub fn zones(&self) -> &BTreeSet<String> {
        &self.zones
    }

    pub fn kinds(&self) -> &BTreeSet<String> {
        &self.kinds
    }

    /// The sensors whose text (ID, description, equipment, unit, kind) contains every
    /// word (lowercase, without whitespace), by place.
    pub fn text_matches(&self, words: &[String]) -> Matches {
        self.text_index().matching(words)
    }

    /// Builds the text index now, if no query did yet (the fleet hub, off the tools' path,
    /// once a new catalogue has stood for a moment).
    pub fn warm_text(&self) {
        self.text_index();
    }

    fn text_index(&self) -> &TextIndex {
        self.text.get_or_init(|| TextIndex::build(&self.sensors))
    }

    /// Up to three registered sensor IDs close to `input` (well-formed or not).
    pub fn suggest_sensors(&self, input: &str) -> Vec<String> {
        crate::suggest::nearest_ids(
            input,
            self.sensors.iter().map(|s| (s.id.as_str(), s.id.plant(), s.id.zone())),
            3,
        )
    }

    /// Up to three registered device IDs close to `input`.
    pub fn suggest_devices(&self, input: &str) -> Vec<String> {
        let lower = input.trim().to_ascii_lowercase().replace(['_', ' '], "-");
        let mut scored: Vec<(usize, &str)> = self
            .devices
            .iter()
            .map(|d| (crate::suggest::distance(&lower, d.id.as_str()), d.id.as_str()))
            .filter(|(dist, _)| *dist <= (lower.len() / 3).max(2))
            .collect();
        scored.sort();
        scored.into_iter().take(3).map(|(_, id)| id.to_string()).collect()
    }

    /// Counts of devices and sensors per protocol, for `fieldgate check`.
    pub fn summary(&self) -> Vec<(Protocol, usize, usize)> {
        let mut out: Vec<(Protocol, usize, usize)> = Vec::new();
        for d in &self.devices {
            let n = self.by_device.get(&d.id).map_or(0, Vec::len);
            match out.iter_mut().find(|(p, _, _)| *p == d.protocol) {
                Some(row) => {
                    row.1 += 1;
                    row.2 += n;
                }
                None => out.push((d.protocol, 1, n)),
            }
        }
        out.sort_by_key(|(p, _, _)| p.name());
        out
    }
}
