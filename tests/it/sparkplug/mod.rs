//! The Sparkplug B edge node against a real Mosquitto broker; every payload it publishes
//! read by Eclipse Tahu's decoder (`tahu.rs`), which we did not write.

mod acl;
mod alarms;
mod broker;
mod conformance;
mod edge;
mod external_decoder;
mod hostile;
mod hub;
mod hub_alarms;
mod links;
mod metrics_text;
mod outage;
mod process;
mod tahu;
