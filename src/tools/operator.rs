//! The operators' acts, beside the agent's tools: deciding a work order, probing a
//! device, acknowledging, shelving or taking an alarm out of service. Each needs the
//! operator role (an agent's token is answered `FORBIDDEN`), answers the same envelope,
//! and is logged for audit where it is done.

use std::time::Instant;

use super::{Caller, Envelope, ErrorCode, ToolError, ToolService, alarms, finish, status, work_orders};

pub use alarms::{ACTIONS as ALARM_ACTIONS, ActBody as AlarmActBody, COMMENT_CHARS as ALARM_COMMENT_CHARS};

impl ToolService {
    /// An operator's decision on a work order (`approve`, `reject`, `start`, `complete`,
    /// `cancel`). Only the operator role may; the agent's tools never change a state.
    pub async fn act_on_work_order(
        &self,
        caller: &Caller,
        id: &str,
        action: &str,
        note: Option<String>,
    ) -> Envelope {
        let started = Instant::now();
        let result = work_orders::act(&self.view(), caller, id, action, note).await;
        finish(&format!("work_order_{action}"), started, 0, result)
    }

    /// An operator's probe of a device, at once, whatever its breaker says: the outcome
    /// and the device's state after it. Only the operator role may.
    pub async fn probe_device(&self, caller: &Caller, id: &str) -> Envelope {
        let started = Instant::now();
        let result = if caller.is_operator() {
            status::probe(&self.view(), id).await
        } else {
            Err(ToolError::new(
                ErrorCode::Forbidden,
                "Only an operator can probe a device.",
                "fieldgate probes failing devices itself; get_device_status shows when next.",
            ))
        };
        let attempts = u32::from(caller.is_operator() && result.is_ok());
        finish("probe_device", started, attempts, result)
    }

    /// An operator's act on an alarm ([`ALARM_ACTIONS`]): journaled before it answers
    /// with the alarm as it is then. Only the operator role may.
    pub async fn act_on_alarm(
        &self,
        caller: &Caller,
        alarm_id: &str,
        action: &str,
        body: AlarmActBody,
    ) -> Envelope {
        let started = Instant::now();
        let result = alarms::act(&self.view(), caller, alarm_id, action, body).await;
        // An act refused is logged for audit too (who tried what), naming a known action only.
        let known = ALARM_ACTIONS.contains(&action);
        if let Err(e) = &result {
            tracing::info!(
                target: "audit",
                event = "operator_alarm_act",
                caller = caller.id.as_str(),
                alarm = crate::tools::envelope::cut(alarm_id).as_str(),
                action = if known { action } else { "unknown" },
                outcome = "refused",
                code = <&'static str>::from(e.code),
                "alarm act refused"
            );
        }
        let tool = if known { format!("alarm_{action}") } else { "alarm_act".to_string() };
        finish(&tool, started, 0, result)
    }
}
