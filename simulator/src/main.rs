//! The `fieldgate-sim` binary.

fn main() {
    eprintln!("fieldgate-sim: the device simulator arrives with the Modbus issue");
    std::process::exit(2);
}
