//! The registry at fleet size, in one run: 100,000 sensors (1,000 devices of 100), what
//! each costs in memory, how long loading and assembling (the hub's catalogue rebuild)
//! take, and `list_sensors` with `text` against a scan of every sensor in the same run
//! (the way it matched before the index).
//!
//! Targets (issue 35): ≤ 0.5 KB per sensor; `list_sensors` with `text` ≤ 1 ms p50.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::{Registry, Sensor};
use fieldgate::tools::ToolService;
use serde_json::json;

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const DEVICES: usize = 1000;
const PER_DEVICE: usize = 100;
const EQUIPMENT: [&str; 5] = ["pump", "compressor", "boiler", "chiller", "conveyor"];
const MEASURES: [(&str, &str, &str); 5] = [
    ("discharge pressure", "pressure", "bar"),
    ("bearing temperature", "temperature", "degC"),
    ("flow", "flow", "m3/h"),
    ("vibration velocity", "vibration", "mm/s"),
    ("motor current", "current", "A"),
];

/// 1,000 device files of 100 sensors: twenty plants of ten zones of five devices (an ID's
/// number has three digits: 500 sensors to a zone).
fn files() -> Vec<(String, String)> {
    (0..DEVICES)
        .map(|d| {
            let (plant, zone) = (format!("P{:02}", d / 50), format!("Z{:02}", (d / 5) % 10));
            let mut text = format!(
                "id = \"dev-{d:04}\"\nplant = \"{plant}\"\nzone = \"{zone}\"\ndescription = \"line {d}\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1\"\n"
            );
            for i in 0..PER_DEVICE {
                let n = (d % 5) * PER_DEVICE + i + 1;
                let eq = EQUIPMENT[i % 5];
                let (what, kind, unit) = MEASURES[(i / 5) % 5];
                text.push_str(&format!(
                    "\n[[sensors]]\nid = \"{plant}_{zone}_{n:03}\"\ndescription = \"{eq} {} {what}\"\nkind = \"{kind}\"\nunit = \"{unit}\"\nequipment = \"{}-{d}-{}\"\ntable = \"holding\"\naddress = {}\ntype = \"u16\"\n",
                    i / 25 + 1,
                    eq.to_uppercase(),
                    i / 25,
                    i
                ));
            }
            (format!("dev-{d:04}.toml"), text)
        })
        .collect()
}

/// How `list_sensors` matched `text` before the index: every sensor's fields, lowercased.
fn scan(registry: &Registry, words: &[String]) -> usize {
    let matches = |s: &Sensor| {
        let hay = format!(
            "{} {} {} {} {}",
            s.id.as_str().to_lowercase(),
            s.description.to_lowercase(),
            s.equipment.as_deref().unwrap_or("").to_lowercase(),
            s.unit.to_lowercase(),
            s.kind
        );
        words.iter().all(|w| hay.contains(w.as_str()))
    };
    registry.sensors().iter().filter(|s| matches(s)).count()
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    let texts = files();
    let before = LIVE.load(Ordering::Relaxed);
    let started = Instant::now();
    let registry = Registry::from_texts(&texts).unwrap();
    let load = started.elapsed();
    let n = registry.sensors().len();
    assert_eq!(n, DEVICES * PER_DEVICE);
    let held = LIVE.load(Ordering::Relaxed) - before;
    let bytes = held as f64 / n as f64;
    drop(texts);
    // From here on, what is held beyond the registry counts against it too.
    let before = LIVE.load(Ordering::Relaxed) - held;

    // The hub's catalogue rebuild: the same devices and sensors assembled again.
    let mut assemble = Vec::new();
    for _ in 0..5 {
        let (devices, sensors) = (registry.devices().to_vec(), registry.sensors().to_vec());
        let t = Instant::now();
        let r = Registry::assembled(devices, sensors, Vec::new()).unwrap();
        assemble.push(t.elapsed());
        drop(r);
    }

    let svc = ToolService::new(Arc::new(registry), Config::default());
    let service = (LIVE.load(Ordering::Relaxed) - before - held) as f64 / n as f64;
    let queries =
        ["pump 3 discharge", "bearing temperature", "chiller-512", "p07_z03_2", "vibration mm/s compressor"];
    let mut first = Vec::new();
    let mut tool = Vec::new();
    let mut baseline = Vec::new();
    let mut indexed = 0.0;
    for (k, q) in queries.iter().enumerate() {
        let args = json!({"text": q, "limit": 50});
        let t = Instant::now();
        let e = svc.call("list_sensors", args.clone()).await.unwrap();
        if k == 0 {
            first.push(t.elapsed());
            indexed = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
        }
        assert!(e.ok, "{:?}", e.error);
        let total = e.json()["total"].as_u64().unwrap() as usize;
        let words: Vec<String> = q.split_whitespace().map(str::to_lowercase).collect();
        assert_eq!(total, scan(&svc.registry(), &words), "{q}: the same sensors as the scan");
        for _ in 0..40 {
            let t = Instant::now();
            let e = svc.call("list_sensors", args.clone()).await.unwrap();
            tool.push(t.elapsed());
            assert!(e.ok);
        }
        for _ in 0..10 {
            let t = Instant::now();
            std::hint::black_box(scan(&svc.registry(), &words));
            baseline.push(t.elapsed());
        }
    }
    let mut plain = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let e = svc.call("list_sensors", json!({"plant": "P04", "limit": 50})).await.unwrap();
        plain.push(t.elapsed());
        assert!(e.ok);
    }

    let p50 = percentile(&mut tool, 0.5);
    let base = percentile(&mut baseline, 0.5);
    println!("registry at fleet size (release build): {n} sensors, {DEVICES} devices");
    println!("load from device files: {:.0} ms", load.as_secs_f64() * 1e3);
    println!(
        "memory: {:.0} bytes per sensor (registry, indexes)   target <= 512: {}",
        bytes,
        if bytes <= 512.0 { "met" } else { "NOT met" }
    );
    let index = indexed - bytes - service;
    println!(
        "  the text index: {index:.0} bytes per sensor; registry and index {:.0}   target <= 512: {}",
        bytes + index,
        if bytes + index <= 512.0 { "met" } else { "NOT met" }
    );
    println!(
        "  (the tool service over it, its reading cache and device state: {service:.0} bytes per sensor)"
    );
    println!("assemble (the hub's catalogue rebuild): {:.1} ms p50", percentile(&mut assemble, 0.5));
    println!(
        "list_sensors text, 50 per page: {:.3} ms p50, {:.3} ms p99 (first call {:.1} ms)   target p50 <= 1 ms: {}",
        p50,
        percentile(&mut tool, 0.99),
        first[0].as_secs_f64() * 1e3,
        if p50 <= 1.0 { "met" } else { "NOT met" }
    );
    println!("  baseline, a scan of every sensor's text in this run: {base:.3} ms p50 ({:.1}x)", base / p50);
    println!("list_sensors plant filter, 50 per page: {:.3} ms p50", percentile(&mut plain, 0.5));
}
