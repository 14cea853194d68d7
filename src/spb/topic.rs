//! Sparkplug B topics: `spBv1.0/{group_id}/{message_type}/{edge_node_id}[/{device_id}]`,
//! and the primary host application's `spBv1.0/STATE/{host_id}`.

use std::fmt;

pub const NAMESPACE: &str = "spBv1.0";

/// The message types of an edge node's topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NBirth,
    NDeath,
    DBirth,
    DDeath,
    NData,
    DData,
    NCmd,
    DCmd,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::NBirth,
        Kind::NDeath,
        Kind::DBirth,
        Kind::DDeath,
        Kind::NData,
        Kind::DData,
        Kind::NCmd,
        Kind::DCmd,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NBirth => "NBIRTH",
            Kind::NDeath => "NDEATH",
            Kind::DBirth => "DBIRTH",
            Kind::DDeath => "DDEATH",
            Kind::NData => "NDATA",
            Kind::DData => "DDATA",
            Kind::NCmd => "NCMD",
            Kind::DCmd => "DCMD",
        }
    }

    /// Whether the topic names a device after the edge node.
    pub fn is_device(self) -> bool {
        matches!(self, Kind::DBirth | Kind::DDeath | Kind::DData | Kind::DCmd)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The topics of one edge node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    group: String,
    node: String,
}

/// A command topic from the broker, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming<'a> {
    NodeCommand,
    DeviceCommand {
        device: &'a str,
    },
    /// The primary host application's STATE.
    State {
        host: &'a str,
    },
    /// This node's own NBIRTH, delivered back by the broker (`run/echo.rs`).
    OwnBirth,
    /// Anything else (not ours, or not a command).
    Other,
}

impl Topics {
    pub fn new(group: &str, node: &str) -> Topics {
        Topics { group: group.to_string(), node: node.to_string() }
    }

    /// An edge node topic (`NBIRTH`, `NDEATH`, `NDATA`, `NCMD`).
    pub fn node(&self, kind: Kind) -> String {
        format!("{NAMESPACE}/{}/{kind}/{}", self.group, self.node)
    }

    /// A device topic (`DBIRTH`, `DDEATH`, `DDATA`, `DCMD`).
    pub fn device(&self, kind: Kind, device: &str) -> String {
        format!("{NAMESPACE}/{}/{kind}/{}/{device}", self.group, self.node)
    }

    /// The filters an edge node subscribes to: its NCMD and every DCMD of its devices.
    pub fn command_filters(&self) -> [String; 2] {
        [self.node(Kind::NCmd), format!("{NAMESPACE}/{}/{}/{}/+", self.group, Kind::DCmd, self.node)]
    }

    /// What a topic the broker sent us is.
    pub fn parse<'a>(&self, topic: &'a str) -> Incoming<'a> {
        let parts: Vec<&str> = topic.split('/').collect();
        match parts.as_slice() {
            [NAMESPACE, "STATE", host] => Incoming::State { host },
            [NAMESPACE, g, "NCMD", n] if *g == self.group && *n == self.node => Incoming::NodeCommand,
            [NAMESPACE, g, "NBIRTH", n] if *g == self.group && *n == self.node => Incoming::OwnBirth,
            [NAMESPACE, g, "DCMD", n, device] if *g == self.group && *n == self.node => {
                Incoming::DeviceCommand { device }
            }
            _ => Incoming::Other,
        }
    }
}

/// The STATE topic of a primary host application (Sparkplug 3.0).
pub fn state(host: &str) -> String {
    format!("{NAMESPACE}/STATE/{host}")
}

/// The longest group, edge node, device or host ID a host application reads (characters).
pub const MAX_ID: usize = 64;

/// Any Sparkplug topic, as a host application reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address<'a> {
    /// An edge node's or device's message: `spBv1.0/{group}/{kind}/{node}[/{device}]`,
    /// the device present exactly when the kind names one.
    Edge { group: &'a str, kind: Kind, node: &'a str, device: Option<&'a str> },
    /// A host application's STATE.
    State { host: &'a str },
}

impl<'a> Address<'a> {
    /// The topic's parts; `None` for anything outside the namespace, an unknown message
    /// type, an ID that is empty, longer than [`MAX_ID`] characters or holds a character a
    /// person cannot see as it is (a control, bidirectional or invisible one: the IDs are
    /// shown), or a device where there must be none (or none where there must).
    pub fn parse(topic: &'a str) -> Option<Address<'a>> {
        let mut parts = topic.split('/');
        if parts.next()? != NAMESPACE {
            return None;
        }
        let rest: Vec<&str> = parts.collect();
        let id =
            |s: &str| !s.is_empty() && s.chars().count() <= MAX_ID && !s.chars().any(crate::plain::is_hidden);
        match rest.as_slice() {
            ["STATE", host] if id(host) => Some(Address::State { host }),
            // `STATE` is no group: the namespace keeps it for host applications.
            [group, kind, node, device @ ..] if id(group) && id(node) && *group != "STATE" => {
                let kind = Kind::ALL.into_iter().find(|k| k.as_str() == *kind)?;
                let device = match (kind.is_device(), device) {
                    (true, [d]) if id(d) => Some(*d),
                    (false, []) => None,
                    _ => return None,
                };
                Some(Address::Edge { group, kind, node, device })
            }
            _ => None,
        }
    }
}

/// A node command topic of any edge node (what a host application publishes).
pub fn node_command(group: &str, node: &str) -> String {
    format!("{NAMESPACE}/{group}/{}/{node}", Kind::NCmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_reads_every_topic_of_the_namespace_and_nothing_else() {
        assert_eq!(
            Address::parse("spBv1.0/A/DDATA/gw1/plc-1"),
            Some(Address::Edge { group: "A", kind: Kind::DData, node: "gw1", device: Some("plc-1") })
        );
        assert_eq!(
            Address::parse("spBv1.0/A/NBIRTH/gw1"),
            Some(Address::Edge { group: "A", kind: Kind::NBirth, node: "gw1", device: None })
        );
        assert_eq!(Address::parse("spBv1.0/STATE/scada"), Some(Address::State { host: "scada" }));
        for bad in [
            "spBv1.0/A/DDATA/gw1",
            "spBv1.0/A/NDATA/gw1/plc",
            "spBv1.0/A/XDATA/gw1",
            "spBv1.0//NBIRTH/gw1",
            "spBv1.0/A/NBIRTH/",
            "spBv1.0/A/DBIRTH/gw1/",
            "spBv1.0/A/DBIRTH/gw1/d/e",
            "spAv1.0/A/NBIRTH/gw1",
            "spBv1.0/STATE/",
            "spBv1.0/STATE/a/b",
            "spBv1.0/STATE/NBIRTH/x",
            "spBv1.0",
            "",
        ] {
            assert_eq!(Address::parse(bad), None, "{bad}");
        }
        // IDs are shown to people: none hides characters or runs long.
        let long = "n".repeat(MAX_ID + 1);
        for bad in [
            "spBv1.0/A\u{202e}/NBIRTH/gw1".to_string(),
            "spBv1.0/A/NBIRTH/gw\u{7}1".to_string(),
            "spBv1.0/A/DBIRTH/gw1/d\u{200b}1".to_string(),
            "spBv1.0/STATE/ho\u{2066}st".to_string(),
            format!("spBv1.0/A/NBIRTH/{long}"),
        ] {
            assert_eq!(Address::parse(&bad), None, "{bad:?}");
        }
        let longest = "n".repeat(MAX_ID);
        assert!(Address::parse(&format!("spBv1.0/A/NBIRTH/{longest}")).is_some());
        assert!(Address::parse("spBv1.0/Ä/NBIRTH/gw-ü").is_some(), "any visible text");
        assert_eq!(node_command("A", "gw1"), "spBv1.0/A/NCMD/gw1");
    }

    #[test]
    fn builds_and_parses() {
        let t = Topics::new("A", "fieldgate-a");
        assert_eq!(t.node(Kind::NBirth), "spBv1.0/A/NBIRTH/fieldgate-a");
        assert_eq!(t.device(Kind::DData, "a-line1-plc"), "spBv1.0/A/DDATA/fieldgate-a/a-line1-plc");
        assert_eq!(
            t.command_filters(),
            ["spBv1.0/A/NCMD/fieldgate-a".to_string(), "spBv1.0/A/DCMD/fieldgate-a/+".to_string()]
        );
        assert_eq!(t.parse("spBv1.0/A/NCMD/fieldgate-a"), Incoming::NodeCommand);
        assert_eq!(t.parse("spBv1.0/A/DCMD/fieldgate-a/d1"), Incoming::DeviceCommand { device: "d1" });
        assert_eq!(t.parse("spBv1.0/STATE/scada"), Incoming::State { host: "scada" });
        assert_eq!(t.parse("spBv1.0/A/NBIRTH/fieldgate-a"), Incoming::OwnBirth);
        for other in [
            "spBv1.0/B/NCMD/fieldgate-a",
            "spBv1.0/A/NCMD/other",
            "x",
            "",
            "spBv1.0/A/DCMD/fieldgate-a",
            "spBv1.0/A/NBIRTH/other",
            "spBv1.0/B/NBIRTH/fieldgate-a",
        ] {
            assert_eq!(t.parse(other), Incoming::Other, "{other}");
        }
        assert_eq!(state("scada"), "spBv1.0/STATE/scada");
        assert_eq!(Kind::ALL.iter().filter(|k| k.is_device()).count(), 4);
    }
}
