//! The tools the agent calls: validation in three layers, the envelope, and one
//! implementation per tool. Transports call [`ToolService::call`] and map the
//! [`Envelope`] to their wire; nothing here knows about MCP or HTTP.

pub mod activity;
mod alarms;
mod call_key;
mod caller;
pub mod catalog;
mod cursor;
pub mod defs;
mod device_error;
pub(crate) mod envelope;
mod history;
mod json;
pub(crate) mod limits;
mod list_sensors;
mod operator;
pub use operator::{ALARM_ACTIONS, ALARM_COMMENT_CHARS, AlarmActBody};
mod reading_json;
mod readings;
mod resources;
mod status;
pub mod validate;
mod value;
pub(crate) mod when;
pub(crate) mod work_orders;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use caller::{Caller, Role, Scope, Scopes};
pub use catalog::{TOOLS, Tool, ToolSpec};
use defs::{
    DeviceStatusData, GetDeviceStatusArgs, GetSensorHistoryArgs, GetWorkOrderArgs, HistoryData,
    ListWorkOrdersArgs, ListWorkOrdersData, WorkOrderData,
};
pub use envelope::{Detail, Envelope, ErrorCode, Meta, ToolError};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::reading::Reader;
use crate::registry::Registry;
use crate::resilience::repeat::Verdict;
use crate::service::Core;
pub use crate::service::Stores;
use crate::store::HistoryStore;
use arc_swap::ArcSwap;
use call_key::call_key;
use validate::InputValidator;

/// The call could not be made at all (a JSON-RPC error in MCP, 404 in HTTP).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CallError {
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
}

/// What a tool returns before the envelope is put around it.
pub type ToolResult = Result<envelope::Data, ToolError>;

/// Serializes a tool's data once.
pub(crate) fn to_data<T: serde::Serialize>(v: &T) -> ToolResult {
    envelope::Data::of(v).map_err(|_| ToolError::internal())
}

/// All tools over one service core; cheap to clone and share between transports.
#[derive(Clone)]
pub struct ToolService {
    inner: Arc<Inner>,
}

struct Inner {
    /// The core the tools answer from now: an edge's never changes; the fleet hub's is
    /// replaced when births change its catalogue ([`ToolService::renew`]). A call takes
    /// the view once and answers from it throughout.
    view: ArcSwap<View>,
    /// What every view shares (taken from the first core).
    config: Config,
    metrics: Arc<Metrics>,
    history: Option<Arc<HistoryStore>>,
    work_orders: Option<Arc<crate::work_orders::WorkOrderStore>>,
    validators: HashMap<Tool, InputValidator>,
    limiter: limits::RateLimiter,
    /// The recent tool calls, for the operator console.
    activity: activity::Activity,
}

/// One core and what the tools keep per sensor of its registry.
pub(crate) struct View {
    /// The registry, the reading core, the stores, the metrics.
    pub(crate) core: Core,
    /// Each sensor's fixed reading JSON, at its place in the registry.
    pub(crate) reading_json: Vec<reading_json::ReadingJson>,
}

impl View {
    fn of(core: Core) -> View {
        View {
            reading_json: core.registry.sensors().iter().map(reading_json::ReadingJson::of).collect(),
            core,
        }
    }
}

impl ToolService {
    /// A service with its stores in memory (tests, one-shot commands).
    pub fn new(registry: Arc<Registry>, config: Config) -> ToolService {
        ToolService::with_stores(registry, config, Stores::in_memory())
    }

    /// A service over a history store, work orders in memory (benches).
    pub fn with_history(
        registry: Arc<Registry>,
        config: Config,
        history: Option<Arc<HistoryStore>>,
    ) -> ToolService {
        ToolService::with_stores(registry, config, Stores { history, ..Stores::in_memory() })
    }

    /// A service over these stores (`serve`, `demo`, `call`: files in the data directory).
    pub fn with_stores(registry: Arc<Registry>, config: Config, stores: Stores) -> ToolService {
        ToolService::over(Core::new(registry, config, stores))
    }

    /// The tools over `core`.
    pub fn over(core: Core) -> ToolService {
        let validators = TOOLS
            .iter()
            .filter(|t| t.served)
            .filter_map(|t| match InputValidator::new(&t.input_schema()) {
                Ok(v) => Some((t.tool, v)),
                Err(error) => {
                    // The schemas are generated from our own types; the golden test keeps them valid.
                    tracing::error!(tool = t.name(), %error, "input schema does not compile");
                    None
                }
            })
            .collect();
        let limiter = limits::RateLimiter::new(core.config.server.rate_limit_per_minute);
        let inner = Inner {
            config: core.config.clone(),
            metrics: core.metrics.clone(),
            history: core.history.clone(),
            work_orders: core.work_orders.clone(),
            view: ArcSwap::from_pointee(View::of(core)),
            validators,
            limiter,
            activity: activity::Activity::default(),
        };
        ToolService { inner: Arc::new(inner) }
    }

    /// Answers from `core` from now on (the fleet hub, when births change its catalogue).
    /// Calls under way finish with the view they started with. `core` must share this
    /// service's configuration, metrics and stores ([`Core::renewed`]).
    pub fn renew(&self, core: Core) {
        self.inner.view.store(Arc::new(View::of(core)));
    }

    pub(crate) fn view(&self) -> Arc<View> {
        self.inner.view.load_full()
    }

    /// The service core the tools answer from now.
    pub fn core(&self) -> Core {
        self.view().core.clone()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn work_orders(&self) -> Option<&Arc<crate::work_orders::WorkOrderStore>> {
        self.inner.work_orders.as_ref()
    }

    pub fn history(&self) -> Option<&Arc<HistoryStore>> {
        self.inner.history.as_ref()
    }

    /// `/metrics`: the Prometheus text of every metric.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render()
    }

    /// The state of fieldgate's storage (for `/readyz`).
    pub fn storage(&self) -> defs::StorageStatus {
        status::storage(&self.view())
    }

    /// The fleet hub's link and edge nodes (for `/readyz`); `None` at an edge.
    pub fn hub(&self) -> Option<defs::HubStatus> {
        status::hub(&self.view())
    }

    /// The reading core every device read goes through now (the poller reads with it too).
    pub fn reader(&self) -> Arc<Reader> {
        self.view().core.reader.clone()
    }

    /// The registry the tools answer from now.
    pub fn registry(&self) -> Arc<Registry> {
        self.view().core.registry.clone()
    }

    /// The devices a call's arguments name (its sensors' devices, or a device ID), for the
    /// log: one ID, several joined by commas, or none.
    fn devices_named(&self, view: &View, args: &Value) -> String {
        let registry = &view.core.registry;
        let of_sensor =
            |v: &Value| v.as_str().and_then(|id| registry.sensor_named(id)).map(|s| s.device.as_str());
        let mut devices: Vec<&str> =
            match (args.get("sensor_id"), args.get("sensor_ids"), args.get("device_id")) {
                (Some(id), _, _) => of_sensor(id).into_iter().collect(),
                (_, Some(Value::Array(ids)), _) => ids.iter().filter_map(of_sensor).collect(),
                (_, _, Some(Value::String(d))) => return d.chars().take(64).collect(),
                _ => Vec::new(),
            };
        devices.sort_unstable();
        devices.dedup();
        devices.join(",")
    }

    /// The tools this build serves.
    pub fn served(&self) -> impl Iterator<Item = &'static ToolSpec> {
        TOOLS.iter().filter(|t| t.served)
    }

    /// The served tool named `name`: the one place a tool's name is parsed (the transports
    /// and the command line call this at their edge; past it a tool is a [`Tool`]).
    pub fn tool(&self, name: &str) -> Result<Tool, CallError> {
        catalog::spec(name)
            .filter(|s| s.served)
            .map(|s| s.tool)
            .ok_or_else(|| CallError::UnknownTool(envelope::cut(name)))
    }

    /// Runs the tool named `tool` as the local operator (the command line, tests).
    pub async fn call(&self, tool: &str, args: Value) -> Result<Envelope, CallError> {
        let tool = self.tool(tool)?;
        Ok(self.call_as(&Caller::local(), tool, args).await)
    }

    /// Runs one tool call for `caller`. Every outcome is an envelope, rate limiting included.
    pub async fn call_as(&self, caller: &Caller, tool: Tool, args: Value) -> Envelope {
        let view = self.view();
        let spec = tool.spec();
        let started = Instant::now();
        let call_id = new_call_id();
        let mut attempts = 0;
        let logged = tracing::enabled!(tracing::Level::INFO).then(|| redact(&args));
        // The cross-call retry limit applies to calls that read devices. While no call is
        // failing the guard is empty, and the call's key is not even built.
        let reads = spec.tool.reads_devices();
        let key = (reads && !view.core.repeat.is_empty()).then(|| call_key(spec.name(), &args));
        let blocked = key.as_deref().and_then(|k| {
            view.core.repeat.check(k, |d| {
                d.parse()
                    .ok()
                    .and_then(|id| view.core.reader.guard(&id))
                    .and_then(|g| g.health.last_success())
            })
        });
        let result = match self.inner.limiter.take(&caller.id) {
            Ok(()) if !caller.may(tool.scope()) => Err(forbidden(tool)),
            Ok(()) if blocked.is_some() => Err(retry_limit(blocked.as_ref())),
            Ok(()) => self.dispatch(&view, caller, spec.tool, &args, &mut attempts).await,
            Err(wait) => Err(ToolError::new(
                ErrorCode::RateLimited,
                format!("Caller {} exceeded {} calls per minute.", caller.id, self.inner.config.server.rate_limit_per_minute),
                "Wait retry_after_ms before the next call, and make fewer calls (get_sensor_readings reads up to 100 sensors at once).",
            )
            .with_retry_after(wait.as_millis() as u64 + 1)),
        };
        let meta = Meta::timed(call_id.clone(), spec.name(), started, attempts);
        if reads && blocked.is_none() {
            let verdict = verdict(&result);
            // Only a failure has to be remembered, and an empty guard has no streak to end.
            if verdict != Verdict::Ended || !view.core.repeat.is_empty() {
                let device = result.as_ref().err().and_then(|e| e.device_id.as_deref());
                let key = key.unwrap_or_else(|| call_key(spec.name(), &args));
                view.core.repeat.record(key, verdict, device);
            }
        }
        let envelope = match result {
            Ok(data) => Envelope::success(data, meta),
            Err(e) => Envelope::failure(e, meta),
        };
        let code = envelope.error.as_ref().map(|e| e.code.as_str()).unwrap_or("OK");
        self.inner.metrics.call(spec.name(), code, started.elapsed());
        let (duration_ms, code) = (envelope.meta.duration_ms, code);
        if let Some(logged_args) = logged {
            let device = match envelope.error.as_ref() {
                Some(e) => e.device_id.clone().unwrap_or_default(),
                None => self.devices_named(&view, &args),
            };
            trace_call(&envelope, &logged_args, caller, &device);
        }
        // The arguments are moved into the ring, not copied: they become text (redacted,
        // cut) only when a person looks.
        self.inner.activity.record(activity::Call {
            at: chrono::Utc::now(),
            tool: spec.name(),
            args,
            code,
            duration_ms,
            caller: caller.id.clone(),
        });
        envelope
    }

    /// A read-only resource (not an agent tool) in the envelope: `name` is reported as
    /// `meta.tool`.
    fn resource(&self, caller: &Caller, name: &str, read: impl FnOnce(&Registry) -> ToolResult) -> Envelope {
        let started = Instant::now();
        let result = match self.inner.limiter.take(&caller.id) {
            Ok(()) => read(&self.view().core.registry),
            Err(wait) => {
                Err(ToolError::new(ErrorCode::RateLimited, "Too many requests.", "Wait retry_after_ms.")
                    .with_retry_after(wait.as_millis() as u64 + 1))
            }
        };
        finish(name, started, 0, result)
    }

    /// The agent's recent tool calls (every transport), newest first.
    pub fn activity(&self) -> Vec<activity::Call> {
        self.inner.activity.recent()
    }

    /// `get_device_status`, typed: the same code as the tool, outside the agent's pipeline
    /// (no envelope, no rate limit, no log line, no activity entry), for the console.
    pub fn device_status(&self, args: &GetDeviceStatusArgs) -> Result<DeviceStatusData, ToolError> {
        status::device_status(&self.view(), args)
    }

    /// `get_sensor_history`, typed (see [`ToolService::device_status`]).
    pub fn sensor_history(&self, args: &GetSensorHistoryArgs) -> Result<HistoryData, ToolError> {
        history::history(&self.view(), args)
    }

    /// `get_sensor_history` of several sensors, typed, in the order asked: one call for a
    /// device page's charts.
    pub fn histories(&self, args: &[GetSensorHistoryArgs]) -> Vec<Result<HistoryData, ToolError>> {
        let view = self.view();
        args.iter().map(|a| history::history(&view, a)).collect()
    }

    /// `get_work_order`, typed (see [`ToolService::device_status`]).
    pub fn work_order(&self, args: &GetWorkOrderArgs) -> Result<WorkOrderData, ToolError> {
        work_orders::work_order(&self.view(), args)
    }

    /// `list_work_orders`, typed (see [`ToolService::device_status`]).
    pub fn list_work_orders(&self, args: &ListWorkOrdersArgs) -> Result<ListWorkOrdersData, ToolError> {
        work_orders::work_orders(&self.view(), args)
    }

    /// The last value the poller (or a call) read of `sensor`, as the agent would see it
    /// from the cache; never a device read.
    pub fn cached_reading(&self, sensor: &crate::registry::Sensor) -> Option<defs::Reading> {
        let now = chrono::Utc::now();
        let sample = self.view().core.reader.cache().fresh(sensor, u64::MAX / 2, now)?;
        let mut stamps = reading_json::Stamps::new();
        Some(reading_json::reading(
            sensor,
            &sample,
            defs::UnitMode::Normalized,
            defs::ReadingSource::Cache,
            &mut stamps,
            alarms::reading_alarm(&self.view(), sensor),
        ))
    }

    /// One sensor's description (`GET /v1/sensors/{id}`).
    pub fn describe_sensor(&self, caller: &Caller, id: &str) -> Envelope {
        self.resource(caller, "describe_sensor", |r| resources::sensor(r, id))
    }

    async fn dispatch(
        &self,
        view: &View,
        caller: &Caller,
        tool: Tool,
        args: &Value,
        attempts: &mut u32,
    ) -> ToolResult {
        // Absent arguments mean "all defaults".
        let defaults = Value::Object(Default::default());
        let args = if args.is_null() { &defaults } else { args };
        if !args.is_object() {
            return Err(ToolError::invalid(
                "arguments",
                Some(&args.to_string()),
                "a JSON object",
                "The arguments must be a JSON object.",
                "Pass the arguments as an object of named parameters, e.g. {\"zone\": \"LINE1\"}.",
            ));
        }
        let registry = &view.core.registry;
        let suggest = |param: &str, received: &str| suggestions_for(registry, param, received);
        // Hidden characters first: named as what they are, not as a format mismatch.
        validate::text::check_arguments(args)?;
        match self.inner.validators.get(&tool) {
            Some(v) => v.check(args, &suggest)?,
            None => return Err(ToolError::internal()),
        }
        match tool {
            Tool::ListSensors => list_sensors::run(parse(args)?, registry),
            Tool::GetSensorReading => readings::get_one(view, parse(args)?, attempts).await,
            Tool::GetSensorReadings => readings::get_many(view, parse_borrowed(args)?, attempts).await,
            Tool::GetDeviceStatus => to_data(&status::device_status(view, &parse(args)?)?),
            Tool::GetSensorHistory => to_data(&history::history(view, &parse(args)?)?),
            Tool::CreateWorkOrder => work_orders::create(view, caller, parse(args)?).await,
            Tool::GetWorkOrder => to_data(&work_orders::work_order(view, &parse(args)?)?),
            Tool::ListWorkOrders => to_data(&work_orders::work_orders(view, &parse(args)?)?),
            Tool::ListAlarms => to_data(&alarms::list(view, &parse(args)?)?),
            Tool::GetAlarmHistory => to_data(&alarms::history(view, &parse(args)?)?),
            Tool::GetAlarmSummary => to_data(&alarms::summary(view, &parse(args)?)?),
        }
    }
}

/// The envelope of an operator action or resource (not an agent tool): `name` is
/// reported as `meta.tool`.
pub(crate) fn finish(name: &str, started: Instant, attempts: u32, result: ToolResult) -> Envelope {
    let tool: String = name.chars().take(40).collect();
    let meta = Meta::timed(new_call_id(), &tool, started, attempts);
    match result {
        Ok(data) => Envelope::success(data, meta),
        Err(e) => Envelope::failure(e, meta),
    }
}

/// What a read call's outcome means for the caller's retry limit: it counts only what the
/// caller did (docs/tool-contract.md §5).
fn verdict(result: &ToolResult) -> Verdict {
    let Err(e) = result else { return Verdict::Ended };
    match e.code {
        ErrorCode::CircuitOpen => Verdict::CircuitOpen {
            retry_after: std::time::Duration::from_millis(e.retry_after_ms.unwrap_or(0)),
        },
        ErrorCode::DeviceTimeout | ErrorCode::DeviceUnavailable | ErrorCode::DeviceBusy if e.blameless => {
            Verdict::Neutral
        }
        ErrorCode::DeviceTimeout
        | ErrorCode::DeviceUnavailable
        | ErrorCode::DeviceBusy
        | ErrorCode::DeviceProtocolError => Verdict::DeviceFailure,
        ErrorCode::RateLimited => Verdict::Neutral,
        _ => Verdict::Ended,
    }
}

/// `RETRY_LIMIT_REACHED`: the same call failed too often; stop and tell a person.
/// A call the caller's scopes do not allow.
fn forbidden(tool: Tool) -> ToolError {
    ToolError::new(
        ErrorCode::Forbidden,
        format!("Calling {} needs the scope {}.", tool.name(), tool.scope().name()),
        "Ask for an access token with that scope; fieldgate's administrator grants it at the identity provider.",
    )
}

fn retry_limit(b: Option<&crate::resilience::repeat::Blocked>) -> ToolError {
    let (n, device) = b.map_or((0, None), |b| (b.failures, b.device.clone()));
    let mut e = ToolError::new(
        ErrorCode::RetryLimitReached,
        format!("This exact call failed {n} times in a row; fieldgate will not repeat it for now."),
        "Stop repeating this call. fieldgate probes the device itself and lifts the block once it answers; if it stays down, report it to a person with its state from get_device_status.",
    );
    e.device_id = device;
    e
}

/// Close registered values for a malformed ID-like argument.
fn suggestions_for(registry: &Registry, param: &str, received: &str) -> Vec<String> {
    if validate::is_sensor_param(param) {
        return registry.suggest_sensors(received);
    }
    let known = match param {
        "plant" => registry.plants(),
        "zone" => registry.zones(),
        "device_id" => return registry.suggest_devices(received),
        _ => return Vec::new(),
    };
    crate::suggest::closest(&received.to_ascii_uppercase(), known.iter().map(String::as_str))
        .map(|k| vec![k.to_string()])
        .unwrap_or_default()
}

/// Arguments that passed the schema into their type.
fn parse<T: DeserializeOwned>(args: &Value) -> Result<T, ToolError> {
    parse_borrowed(args)
}

/// [`parse`] into arguments that borrow their strings from `args`.
fn parse_borrowed<'a, T: serde::Deserialize<'a>>(args: &'a Value) -> Result<T, ToolError> {
    T::deserialize(args).map_err(|_| {
        ToolError::new(
            ErrorCode::InvalidArgument,
            "The arguments do not fit the tool's input schema.",
            "Check the arguments against the tool's inputSchema and call again.",
        )
    })
}

/// One structured event per call (docs/tool-contract.md §8).
fn trace_call(e: &Envelope, args: &str, caller: &Caller, device: &str) {
    let code = e.error.as_ref().map(|e| e.code.as_str()).unwrap_or("OK");
    let retryable = e.error.as_ref().is_some_and(|e| e.retryable);
    tracing::info!(
        call_id = %e.meta.call_id,
        tool = %e.meta.tool,
        caller = %caller.id,
        arguments = %args,
        outcome = if e.ok { "ok" } else { "error" },
        code,
        retryable,
        attempts = e.meta.attempts,
        device,
        duration_ms = e.meta.duration_ms,
        "tool call"
    );
}

/// Whether an argument's name looks like a secret's.
fn secret_name(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    ["token", "password", "secret", "authorization"].iter().any(|s| k.contains(s))
}

/// Arguments for the log, with anything that looks like a secret replaced.
fn redact(args: &Value) -> String {
    let mut v = args.clone();
    if let Some(o) = v.as_object_mut() {
        for (k, val) in o.iter_mut() {
            if secret_name(k) {
                *val = Value::String("[redacted]".into());
            }
        }
    }
    // Whole (so that JSON logs carry it as an object) unless it is long.
    let text = v.to_string();
    let text = envelope::visible(&text).into_owned();
    if text.len() <= 2048 { text } else { envelope::cut(&text) }
}

/// `c_` + 13 hex digits of milliseconds + 8 of a process-wide sequence mixed with a
/// per-process random seed: unique, sortable by time.
pub(crate) fn new_call_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    let ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("c_{ms:013x}{:08x}", (seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 32) as u32)
}
