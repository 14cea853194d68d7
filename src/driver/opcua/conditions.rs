//! OPC UA Alarms & Conditions (Part 9) on the wire: the event item on the Server object
//! with the select clauses a condition's state needs, each event read into a
//! [`ServerEvent`], `ConditionRefresh` (the server re-sends every retained condition
//! between a RefreshStart and a RefreshEnd event) and a condition's `Acknowledge`.
//!
//! What servers do that this copes with: events other than conditions' (audit,
//! transitions) come on the same item and are skipped (no ConditionId); the RefreshStart
//! and RefreshEnd markers would be dropped by some servers under a where clause, so there
//! is none; a select clause a server reports as not good may still be filled; a disabled
//! condition's fields are status codes, not values (skipped); a branch (an older state
//! kept for acknowledgement) is skipped: fieldgate follows each condition's current state.

use opcua::types::{
    AttributeId, ByteString, CallMethodRequest, ContentFilter, EventFieldList, EventFilter, ExtensionObject,
    LocalizedText, MethodId, MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, NodeId,
    NumericRange, ObjectId, ObjectTypeId, ReadValueId, SimpleAttributeOperand, StatusCode, Variant,
};

/// The event item's client handle (the sensors' items use 1..=n).
pub const EVENT_HANDLE: u32 = u32::MAX;
/// Events the event item asks the server to queue (a refresh, a burst).
pub const EVENT_QUEUE: u32 = 10_000;

/// The most bytes of an EventId kept (a server's are 16 to 32).
const MAX_EVENT_ID: usize = 256;
/// The most characters of a name or message kept.
const MAX_TEXT: usize = 200;

/// The select clauses, as (event type, browse path): the fields arrive in this order.
const SELECT: [(ObjectTypeId, &str); 12] = [
    (ObjectTypeId::BaseEventType, "EventId"),
    (ObjectTypeId::BaseEventType, "EventType"),
    (ObjectTypeId::BaseEventType, "SourceNode"),
    (ObjectTypeId::BaseEventType, "Time"),
    (ObjectTypeId::BaseEventType, "Message"),
    (ObjectTypeId::BaseEventType, "Severity"),
    (ObjectTypeId::ConditionType, "ConditionName"),
    // ConditionId: the condition's own NodeId (an empty browse path, the NodeId attribute).
    (ObjectTypeId::ConditionType, ""),
    (ObjectTypeId::AlarmConditionType, "ActiveState/Id"),
    (ObjectTypeId::AcknowledgeableConditionType, "AckedState/Id"),
    (ObjectTypeId::ConditionType, "Retain"),
    (ObjectTypeId::ConditionType, "BranchId"),
];

/// A condition's state as its server reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditionEvent {
    /// The condition's NodeId, as text (`ns=1;s=Temp.Alarm`).
    pub node: String,
    /// The event's ID: what an acknowledgement names.
    pub event_id: Vec<u8>,
    /// The NodeId of what the condition is about (a variable), as text.
    pub source: Option<String>,
    /// The event's time (Unix ms), if it has one.
    pub time_ms: Option<i64>,
    pub name: String,
    pub message: String,
    /// 1 (least) to 1000.
    pub severity: u16,
    pub active: bool,
    pub acked: bool,
    /// Whether the server still holds it as of interest (a refresh re-sends it).
    pub retain: bool,
}

/// An event of the Server object that concerns conditions.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// A refresh begins: every retained condition follows.
    RefreshStart,
    /// The refresh ended: a condition not re-sent is no longer retained.
    RefreshEnd,
    /// The server's queue of events for this item overflowed: events were lost, a refresh
    /// must say the conditions again.
    Overflow,
    Condition(ConditionEvent),
}

/// The event filter: the select clauses and no where clause.
fn event_filter() -> EventFilter {
    let select_clauses = SELECT
        .iter()
        .map(|&(ty, path)| {
            if path.is_empty() {
                // Not `SimpleAttributeOperand::new(.., "")`: that sends the path [""].
                SimpleAttributeOperand {
                    type_definition_id: ty.into(),
                    browse_path: None,
                    attribute_id: AttributeId::NodeId as u32,
                    index_range: NumericRange::None,
                }
            } else {
                SimpleAttributeOperand::new_value(ty, path)
            }
        })
        .collect();
    EventFilter { select_clauses: Some(select_clauses), where_clause: ContentFilter::default() }
}

/// The event item on the Server object (a large queue: a refresh is a burst).
pub fn event_item() -> MonitoredItemCreateRequest {
    MonitoredItemCreateRequest {
        item_to_monitor: ReadValueId {
            node_id: ObjectId::Server.into(),
            attribute_id: AttributeId::EventNotifier as u32,
            ..Default::default()
        },
        monitoring_mode: MonitoringMode::Reporting,
        requested_parameters: MonitoringParameters {
            client_handle: EVENT_HANDLE,
            sampling_interval: 0.0,
            filter: ExtensionObject::from_message(event_filter()),
            queue_size: EVENT_QUEUE,
            // Full, the server keeps the newest: the state now matters more than the past.
            discard_oldest: true,
        },
    }
}

/// One event's fields, read: `None` for what is not a condition's current state.
pub fn parse(list: EventFieldList) -> Option<ServerEvent> {
    let fields = list.event_fields.unwrap_or_default();
    let node = |i: usize| match fields.get(i) {
        Some(Variant::NodeId(n)) if !n.is_null() => Some((**n).clone()),
        _ => None,
    };
    let text = |i: usize| {
        let t = match fields.get(i) {
            Some(Variant::String(s)) => s.as_ref().to_string(),
            Some(Variant::LocalizedText(t)) => t.text.as_ref().to_string(),
            _ => String::new(),
        };
        crate::plain::shown(&t).chars().take(MAX_TEXT).collect::<String>()
    };
    let flag = |i: usize| match fields.get(i) {
        Some(Variant::Boolean(b)) => Some(*b),
        _ => None,
    };
    let event_type = node(1)?;
    if event_type == ObjectTypeId::RefreshStartEventType {
        return Some(ServerEvent::RefreshStart);
    }
    if event_type == ObjectTypeId::RefreshEndEventType {
        return Some(ServerEvent::RefreshEnd);
    }
    if event_type == ObjectTypeId::EventQueueOverflowEventType {
        return Some(ServerEvent::Overflow);
    }
    let condition = node(7)?;
    if node(11).is_some() {
        return None;
    }
    let Some(Variant::ByteString(ByteString { value: Some(event_id) })) = fields.first() else { return None };
    if event_id.is_empty() || event_id.len() > MAX_EVENT_ID {
        return None;
    }
    Some(ServerEvent::Condition(ConditionEvent {
        node: condition.to_string(),
        event_id: event_id.clone(),
        source: node(2).map(|n| n.to_string()),
        time_ms: match fields.get(3) {
            Some(Variant::DateTime(t)) => Some(t.as_chrono().timestamp_millis()),
            _ => None,
        },
        name: text(6),
        message: text(4),
        severity: match fields.get(5) {
            Some(Variant::UInt16(s)) => (*s).clamp(1, 1000),
            _ => 1,
        },
        // A condition that is no alarm has no ActiveState: it is never active.
        active: flag(8).unwrap_or(false),
        // Not acknowledgeable: nothing to acknowledge.
        acked: flag(9).unwrap_or(true),
        retain: flag(10)?,
    }))
}

/// `ConditionType.ConditionRefresh(subscription)`: the method call, to send.
pub fn refresh(subscription: u32) -> CallMethodRequest {
    CallMethodRequest {
        object_id: ObjectTypeId::ConditionType.into(),
        method_id: MethodId::ConditionType_ConditionRefresh.into(),
        input_arguments: Some(vec![Variant::from(subscription)]),
    }
}

/// `Acknowledge(event_id, comment)` on condition `node`: the method call, to send.
pub fn acknowledge(node: &str, event_id: &[u8], comment: &str) -> Option<CallMethodRequest> {
    let object_id: NodeId = node.parse().ok()?;
    Some(CallMethodRequest {
        object_id,
        method_id: MethodId::AcknowledgeableConditionType_Acknowledge.into(),
        input_arguments: Some(vec![
            Variant::from(ByteString::from(event_id.to_vec())),
            Variant::from(LocalizedText::new("", comment)),
        ]),
    })
}

/// Why an acknowledgement did not reach its server, or was refused there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckFailed {
    /// A newer event of the condition came first (or it was acknowledged already).
    #[error("the server has a newer event of this condition")]
    Stale,
    #[error("the server refused the acknowledgement ({0})")]
    Other(&'static str),
    /// No session with the server now, or it did not answer in time.
    #[error("the server cannot be reached")]
    Unavailable,
}

/// What the owner of a device's event subscription is asked to do on its session.
#[derive(Debug)]
pub enum Command {
    /// Acknowledge condition `node`'s event `event_id` with `comment`.
    Acknowledge {
        node: String,
        event_id: Vec<u8>,
        comment: String,
        reply: tokio::sync::oneshot::Sender<Result<(), AckFailed>>,
    },
}

impl Command {
    /// Answers that there is no session to do it on.
    pub fn unavailable(self) {
        let Command::Acknowledge { reply, .. } = self;
        let _ = reply.send(Err(AckFailed::Unavailable));
    }
}

/// What a call's status says of an acknowledgement.
pub fn ack_status(status: StatusCode) -> Result<(), AckFailed> {
    if status.is_good() {
        Ok(())
    } else if status == StatusCode::BadEventIdUnknown || status == StatusCode::BadConditionBranchAlreadyAcked
    {
        Err(AckFailed::Stale)
    } else {
        Err(AckFailed::Other(status.sub_code().name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opcua::types::DateTime;

    fn fields(kind: ObjectTypeId, condition: Option<&str>, active: bool, acked: bool) -> EventFieldList {
        let node = |s: &str| Variant::from(s.parse::<NodeId>().unwrap());
        EventFieldList {
            client_handle: EVENT_HANDLE,
            event_fields: Some(vec![
                Variant::from(ByteString::from(vec![1, 2, 3])),
                Variant::from(NodeId::from(kind)),
                node("ns=1;s=Temp"),
                Variant::from(DateTime::now()),
                Variant::from(LocalizedText::new("", "Temp is High\u{202e}")),
                Variant::UInt16(5000),
                Variant::from("Temp.Alarm"),
                condition.map_or(Variant::Empty, node),
                Variant::Boolean(active),
                Variant::Boolean(acked),
                Variant::Boolean(true),
                Variant::Empty,
            ]),
        }
    }

    #[test]
    fn condition_events_and_refresh_markers_are_read_and_the_rest_skipped() {
        let Some(ServerEvent::Condition(c)) =
            parse(fields(ObjectTypeId::ExclusiveLimitAlarmType, Some("ns=1;s=Temp.Alarm"), true, false))
        else {
            panic!("a condition");
        };
        assert_eq!((c.node.as_str(), c.source.as_deref()), ("ns=1;s=Temp.Alarm", Some("ns=1;s=Temp")));
        assert_eq!((c.active, c.acked, c.severity, c.event_id), (true, false, 1000, vec![1, 2, 3]));
        assert!(!c.message.contains('\u{202e}'), "device text is cleaned: {:?}", c.message);
        assert_eq!(
            parse(fields(ObjectTypeId::RefreshStartEventType, None, false, false)),
            Some(ServerEvent::RefreshStart)
        );
        assert_eq!(
            parse(fields(ObjectTypeId::RefreshEndEventType, None, false, false)),
            Some(ServerEvent::RefreshEnd)
        );
        assert_eq!(
            parse(fields(ObjectTypeId::EventQueueOverflowEventType, None, false, false)),
            Some(ServerEvent::Overflow)
        );
        // An audit event (no ConditionId), a branch, a disabled condition, nothing at all.
        assert_eq!(parse(fields(ObjectTypeId::AuditConditionAcknowledgeEventType, None, true, true)), None);
        let mut branch = fields(ObjectTypeId::OffNormalAlarmType, Some("ns=1;s=D"), true, false);
        branch.event_fields.as_mut().unwrap()[11] = Variant::from(NodeId::new(1, 7u32));
        assert_eq!(parse(branch), None);
        let mut disabled = fields(ObjectTypeId::OffNormalAlarmType, Some("ns=1;s=D"), true, false);
        disabled.event_fields.as_mut().unwrap()[10] = Variant::StatusCode(StatusCode::BadConditionDisabled);
        assert_eq!(parse(disabled), None);
        assert_eq!(parse(EventFieldList { client_handle: EVENT_HANDLE, event_fields: None }), None);
    }

    #[test]
    fn an_acknowledgement_names_the_condition_and_a_stale_event_is_told_apart() {
        assert!(acknowledge("not a node", &[1], "x").is_none());
        let call = acknowledge("ns=1;s=Temp.Alarm", &[9, 9], "seen").unwrap();
        assert_eq!(call.object_id, "ns=1;s=Temp.Alarm".parse::<NodeId>().unwrap());
        assert_eq!(ack_status(StatusCode::Good), Ok(()));
        assert_eq!(ack_status(StatusCode::BadEventIdUnknown), Err(AckFailed::Stale));
        assert!(matches!(ack_status(StatusCode::BadNodeIdUnknown), Err(AckFailed::Other(_))));
    }
}
