//! The Sparkplug B edge node: payloads read by a decoder we did not write, and the edge
//! node against a real Mosquitto broker.

mod broker;
mod conformance;
mod edge;
mod external_decoder;
mod hostile;
mod links;
mod metrics_text;
mod outage;
mod process;
