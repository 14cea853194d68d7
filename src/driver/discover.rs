//! `fieldgate discover modbus`: probes a Modbus TCP device's four tables and writes a
//! device file skeleton with one sensor per readable address, for a person to edit.
//!
//! Probing reads blocks of 100 addresses; a block answered with an exception is probed
//! again in blocks of 10, and a refused 10-block address by address up to the first
//! refusal (so a data area ending mid-block is found; a run starting mid-block after a
//! refused address is not, which the person editing the file can add). The skeleton declares
//! every register `u16` and every bit `bool`; names, kinds, units, wider types and word
//! orders are the person's to fill in.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use tokio_modbus::client::{Context, Reader};
use tokio_modbus::prelude::Slave;

use crate::ids::{check_plant, check_zone};

/// The address of `endpoint` (`host:port`, the host a name or an address) that accepts a
/// TCP connection within `timeout`, trying each address the name resolves to.
pub async fn resolve(endpoint: &str, timeout: Duration) -> Result<SocketAddr, DiscoverError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(endpoint)
        .await
        .map_err(|_| {
            DiscoverError::Invalid(format!(
                "--endpoint must be host:port such as 192.168.10.21:502 or plc.local:502, and the host must resolve; found {endpoint:?}"
            ))
        })?
        .collect();
    for addr in &addrs {
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            return Ok(*addr);
        }
    }
    let tried: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    Err(DiscoverError::Connect(format!("{endpoint} (tried {})", tried.join(", "))))
}

/// At most this many sensors fit the `NNN` of a sensor ID.
pub const MAX_SENSORS: usize = 999;

#[derive(Debug, Clone)]
pub struct ModbusProbe {
    pub addr: SocketAddr,
    /// As the person wrote it (a host name stays a name in the file written).
    pub endpoint: String,
    pub unit: u8,
    pub plant: String,
    pub zone: String,
    /// Probe addresses `0..max_address` of each table.
    pub max_address: u16,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiscoverError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot connect to {0}")]
    Connect(String),
    #[error("the server refused: {0}")]
    Refused(String),
    #[error("the device stopped answering while being probed")]
    NoAnswer,
    #[error("nothing readable in addresses 0-{0} of any table")]
    Nothing(u16),
    #[error("no variable with a number, boolean or text value below the Objects folder")]
    NothingBrowsed,
}

/// Problems with the `--plant` and `--zone` of a discovery, one line each.
pub fn check_names(plant: &str, zone: &str) -> Vec<String> {
    let mut bad = Vec::new();
    if let Err(e) = check_plant(plant) {
        bad.push(format!("--plant: {e}"));
    }
    if let Err(e) = check_zone(zone) {
        bad.push(format!("--zone: {e}"));
    }
    bad
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_text_cannot_break_out_of_its_toml_string() {
        let s = super::toml_string("a\"\nkind = \"x\\");
        assert_eq!(s, "\"a\\\"kind = \\\"x\\\\\"");
        let parsed: toml::Value = toml::from_str(&format!("v = {s}")).unwrap();
        assert_eq!(parsed["v"].as_str(), Some("a\"kind = \"x\\"));
        assert_eq!(super::toml_string(&"é".repeat(300)).chars().count(), 202);
    }
}

/// `s` as a TOML basic string: text from a device is kept to printable characters, at
/// most 200 of them, and escaped, so it cannot break out of the string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| !c.is_control()).take(200) {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "lowercase")]
enum Table {
    Holding,
    Input,
    Coil,
    Discrete,
}

impl Table {
    const ALL: &[Table] = <Table as strum::VariantArray>::VARIANTS;

    fn name(self) -> &'static str {
        self.into()
    }
}

/// Whether `[start, start+len)` of `table` can be read: `Ok(false)` when the device
/// answers with an exception, an error when it does not answer at all.
async fn readable(
    ctx: &mut Context,
    table: Table,
    start: u16,
    len: u16,
    timeout: Duration,
) -> Result<bool, DiscoverError> {
    let reply = match table {
        Table::Holding => tokio::time::timeout(timeout, ctx.read_holding_registers(start, len))
            .await
            .map(|r| r.map(|r| r.map(|_| ()))),
        Table::Input => tokio::time::timeout(timeout, ctx.read_input_registers(start, len))
            .await
            .map(|r| r.map(|r| r.map(|_| ()))),
        Table::Coil => {
            tokio::time::timeout(timeout, ctx.read_coils(start, len)).await.map(|r| r.map(|r| r.map(|_| ())))
        }
        Table::Discrete => tokio::time::timeout(timeout, ctx.read_discrete_inputs(start, len))
            .await
            .map(|r| r.map(|r| r.map(|_| ()))),
    };
    match reply {
        Ok(Ok(Ok(()))) => Ok(true),
        Ok(Ok(Err(_exception))) => Ok(false),
        Ok(Err(_)) | Err(_) => Err(DiscoverError::NoAnswer),
    }
}

/// The readable addresses of `table` below `max`.
async fn probe_table(
    ctx: &mut Context,
    table: Table,
    max: u16,
    timeout: Duration,
) -> Result<Vec<u16>, DiscoverError> {
    let mut found = Vec::new();
    let mut start = 0u16;
    while start < max {
        let len = 100.min(max - start);
        if readable(ctx, table, start, len, timeout).await? {
            found.extend(start..start + len);
        } else {
            let mut s = start;
            while s < start + len {
                let l = 10.min(start + len - s);
                if readable(ctx, table, s, l, timeout).await? {
                    found.extend(s..s + l);
                } else {
                    // Where a readable run ends inside this block: single addresses up
                    // to the first refused one.
                    for a in s..s + l {
                        if !readable(ctx, table, a, 1, timeout).await? {
                            break;
                        }
                        found.push(a);
                    }
                }
                s += l;
            }
        }
        start += len;
    }
    Ok(found)
}

/// Probes the device and returns the device file text.
/// The arguments that need no device: checked before anything is contacted.
pub fn check_modbus_args(plant: &str, zone: &str, unit: u8) -> Result<(), DiscoverError> {
    let mut bad = check_names(plant, zone);
    if !(1..=247).contains(&unit) {
        bad.push(format!("--unit: must be 1-247, found {unit}"));
    }
    if bad.is_empty() { Ok(()) } else { Err(DiscoverError::Invalid(bad.join("; "))) }
}

pub async fn discover_modbus(p: &ModbusProbe) -> Result<String, DiscoverError> {
    check_modbus_args(&p.plant, &p.zone, p.unit)?;
    let stream = tokio::time::timeout(p.timeout, tokio::net::TcpStream::connect(p.addr))
        .await
        .map_err(|_| DiscoverError::Connect(p.addr.to_string()))?
        .map_err(|_| DiscoverError::Connect(p.addr.to_string()))?;
    let mut ctx = tokio_modbus::client::tcp::attach_slave(stream, Slave(p.unit));
    let mut points = Vec::new();
    for &table in Table::ALL {
        for a in probe_table(&mut ctx, table, p.max_address, p.timeout).await? {
            points.push((table, a));
        }
    }
    if points.is_empty() {
        return Err(DiscoverError::Nothing(p.max_address.saturating_sub(1)));
    }
    let kept = points.len().min(MAX_SENSORS);
    let device_id = format!("{}-{}-unit{}", p.plant, p.zone, p.unit).to_lowercase();
    let mut out = String::new();
    let _ = writeln!(out, "# Discovered by `fieldgate discover modbus` from {} unit {}.", p.addr, p.unit);
    let _ = writeln!(
        out,
        "# One sensor per readable address; edit descriptions, kinds, units, types and word orders."
    );
    if kept < points.len() {
        let _ = writeln!(
            out,
            "# {} more readable addresses were left out (999 sensors per file).",
            points.len() - kept
        );
    }
    let _ = writeln!(out, "id = \"{device_id}\"");
    let _ = writeln!(out, "plant = \"{}\"", p.plant);
    let _ = writeln!(out, "zone = \"{}\"", p.zone);
    let _ = writeln!(out, "description = \"Modbus device at {} unit {} (discovered)\"", p.endpoint, p.unit);
    let _ = writeln!(out, "protocol = \"modbus-tcp\"");
    let _ = writeln!(out, "endpoint = \"{}\"", p.endpoint);
    let _ = writeln!(out, "unit_id = {}", p.unit);
    for (n, (table, address)) in points.iter().take(kept).enumerate() {
        let ty = if matches!(table, Table::Coil | Table::Discrete) { "bool" } else { "u16" };
        let _ = write!(
            out,
            "\n[[sensors]]\nid = \"{}_{}_{:03}\"\ndescription = \"{} {address} (discovered)\"\nkind = \"unclassified\"\nunit = \"\"\ntable = \"{}\"\naddress = {address}\ntype = \"{ty}\"\n",
            p.plant,
            p.zone,
            n + 1,
            table.name(),
            table.name(),
        );
    }
    Ok(out)
}
